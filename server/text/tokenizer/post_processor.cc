// The post-processors of tokenizer.json: BertProcessing and TemplateProcessing, as one
// PostProcessor of special pieces (components.h).
#include <algorithm>
#include <string>
#include <utility>

#include "server/text/tokenizer/components.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::tokenizer {

void PostProcessor::process(Encoding& enc, bool offsets) const {
  Encoding result;
  auto add = [&](const SpecialPiece& p) {
    result.ids.insert(result.ids.end(), p.ids.begin(), p.ids.end());
    result.tokens.insert(result.tokens.end(), p.tokens.begin(), p.tokens.end());
    result.type_ids.insert(result.type_ids.end(), p.ids.size(), p.type_id);
    if (offsets) result.offsets.insert(result.offsets.end(), p.ids.size(), Offsets{0, 0});
  };
  for (const auto& p : before_) add(p);
  result.ids.insert(result.ids.end(), enc.ids.begin(), enc.ids.end());
  result.tokens.insert(result.tokens.end(), enc.tokens.begin(), enc.tokens.end());
  result.type_ids.insert(result.type_ids.end(), enc.ids.size(), sequence_type_id_);
  if (offsets) result.offsets.insert(result.offsets.end(), enc.offsets.begin(), enc.offsets.end());
  for (const auto& p : after_) add(p);
  enc = std::move(result);
}

int32_t PostProcessor::max_id() const {
  int32_t m = -1;
  for (const auto* list : {&before_, &after_}) {
    for (const auto& p : *list) {
      for (int32_t id : p.ids) m = std::max(m, id);
    }
  }
  return m;
}

size_t PostProcessor::added_tokens() const {
  size_t n = 0;
  for (const auto& p : before_) n += p.ids.size();
  for (const auto& p : after_) n += p.ids.size();
  return n;
}

}  // namespace fastformer::tokenizer
