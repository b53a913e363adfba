// tokenizer.json -> the pipeline of components.h, and the pipeline run on a text.
#include "server/text/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "server/text/tokenizer/components.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::tokenizer {
namespace {

using json = nlohmann::json;

// Reads one tokenizer.json; every error names the source and the JSON path.
class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw TokenizerError(source_ + ": " + path + " " + what);
  }

  const json& field(const json& obj, const std::string& path, const char* key) const {
    if (!obj.is_object()) fail(path, "must be an object");
    const auto it = obj.find(key);
    if (it == obj.end()) fail(path + "." + key, "is missing");
    return *it;
  }
  std::string str(const json& obj, const std::string& path, const char* key) const {
    const json& v = field(obj, path, key);
    if (!v.is_string()) fail(path + "." + key, "must be a string");
    return v.get<std::string>();
  }
  bool boolean(const json& obj, const std::string& path, const char* key, bool fallback) const {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(path + "." + key, "must be true or false");
    return it->get<bool>();
  }
  int64_t integer(const json& v, const std::string& path) const {
    if (!v.is_number_integer()) fail(path, "must be an integer");
    return v.get<int64_t>();
  }
  // A token id: an integer in [0, 2^31).
  int32_t id(const json& v, const std::string& path) const {
    const int64_t i = integer(v, path);
    if (i < 0 || i > INT32_MAX) fail(path, "is not a token id in [0, 2^31)");
    return static_cast<int32_t>(i);
  }
  std::string type(const json& obj, const std::string& path,
                   std::initializer_list<const char*> supported) const {
    const std::string t = str(obj, path, "type");
    for (const char* s : supported) {
      if (t == s) return t;
    }
    std::string list;
    for (const char* s : supported) list += (list.empty() ? "" : ", ") + std::string(s);
    fail(path + ".type", t + " is not supported (supported: " + list + ")");
  }

  SplitBehavior behavior(const json& obj, const std::string& path) const {
    const std::string b = str(obj, path, "behavior");
    if (b == "Removed") return SplitBehavior::kRemoved;
    if (b == "Isolated") return SplitBehavior::kIsolated;
    if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
    if (b == "Contiguous") return SplitBehavior::kContiguous;
    fail(path + ".behavior", b + " is not a split behavior (Removed, Isolated, MergedWithPrevious, "
                                 "MergedWithNext, Contiguous)");
  }

  std::unique_ptr<Normalizer> normalizer(const json& j, const std::string& path) const {
    const std::string t = type(
        j, path,
        {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "Sequence"});
    if (t == "Lowercase") return std::make_unique<LowercaseNormalizer>();
    if (t == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFC);
    if (t == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFD);
    if (t == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFKC);
    if (t == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFKD);
    if (t == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
    if (t == "BertNormalizer") {
      const bool lowercase = boolean(j, path, "lowercase", true);
      return std::make_unique<BertNormalizer>(
          boolean(j, path, "clean_text", true), boolean(j, path, "handle_chinese_chars", true),
          boolean(j, path, "strip_accents", lowercase), lowercase);
    }
    const json& list = field(j, path, "normalizers");
    if (!list.is_array()) fail(path + ".normalizers", "must be an array");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      parts.push_back(normalizer(list[i], path + ".normalizers[" + std::to_string(i) + "]"));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }

  std::unique_ptr<PreTokenizer> pre_tokenizer(const json& j, const std::string& path) const {
    const std::string t = type(
        j, path,
        {"BertPreTokenizer", "Whitespace", "WhitespaceSplit", "Punctuation", "Split", "Sequence"});
    using Kind = CharSplitPreTokenizer::Kind;
    if (t == "BertPreTokenizer") return std::make_unique<CharSplitPreTokenizer>(Kind::kBert);
    if (t == "Whitespace") return make_whitespace_pre_tokenizer();
    if (t == "WhitespaceSplit")
      return std::make_unique<CharSplitPreTokenizer>(Kind::kWhitespaceSplit);
    if (t == "Punctuation") {
      const SplitBehavior b = j.contains("behavior") ? behavior(j, path) : SplitBehavior::kIsolated;
      return std::make_unique<CharSplitPreTokenizer>(Kind::kPunctuation, b);
    }
    if (t == "Split") {
      const json& pattern = field(j, path, "pattern");
      const std::string ppath = path + ".pattern";
      bool is_regex = false;
      std::string text;
      if (pattern.is_object() && pattern.contains("Regex")) {
        is_regex = true;
        text = str(pattern, ppath, "Regex");
      } else if (pattern.is_object() && pattern.contains("String")) {
        text = str(pattern, ppath, "String");
      } else {
        fail(ppath, "must be {\"Regex\": ...} or {\"String\": ...}");
      }
      try {
        return std::make_unique<RegexSplitPreTokenizer>(text, is_regex, behavior(j, path),
                                                        boolean(j, path, "invert", false));
      } catch (const TokenizerError& e) {
        fail(ppath, e.what());
      }
    }
    const json& list = field(j, path, "pretokenizers");
    if (!list.is_array()) fail(path + ".pretokenizers", "must be an array");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      parts.push_back(pre_tokenizer(list[i], path + ".pretokenizers[" + std::to_string(i) + "]"));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }

  std::unique_ptr<Model> model(const json& j, const std::string& path) const {
    const std::string t = type(j, path, {"WordLevel", "WordPiece"});
    const json& vocab_json = field(j, path, "vocab");
    if (!vocab_json.is_object()) fail(path + ".vocab", "must be an object of token: id");
    Vocab vocab;
    vocab.reserve(vocab_json.size());
    for (const auto& [token, id] : vocab_json.items()) {
      vocab.emplace(token, this->id(id, path + ".vocab[\"" + token + "\"]"));
    }
    const std::string unk = str(j, path, "unk_token");
    if (t == "WordLevel") return std::make_unique<WordLevelModel>(std::move(vocab), unk);
    const std::string prefix = j.contains("continuing_subword_prefix")
                                   ? str(j, path, "continuing_subword_prefix")
                                   : std::string("##");
    int64_t max_chars = 100;
    if (j.contains("max_input_chars_per_word")) {
      max_chars = integer(j["max_input_chars_per_word"], path + ".max_input_chars_per_word");
      if (max_chars < 0) fail(path + ".max_input_chars_per_word", "must not be negative");
    }
    return std::make_unique<WordPieceModel>(std::move(vocab), unk, prefix,
                                            static_cast<size_t>(max_chars));
  }

  // [token, id] of BertProcessing's cls and sep.
  SpecialPiece bert_piece(const json& j, const std::string& path, const char* key) const {
    const json& v = field(j, path, key);
    const std::string p = path + "." + key;
    if (!v.is_array() || v.size() != 2 || !v[0].is_string()) fail(p, "must be [token, id]");
    return SpecialPiece{{id(v[1], p + "[1]")}, {v[0].get<std::string>()}, 0};
  }

  std::unique_ptr<PostProcessor> post_processor(const json& j, const std::string& path) const {
    const std::string t = type(j, path, {"BertProcessing", "TemplateProcessing"});
    if (t == "BertProcessing") {
      return std::make_unique<PostProcessor>(t, std::vector{bert_piece(j, path, "cls")},
                                             std::vector{bert_piece(j, path, "sep")}, 0);
    }
    const json& single = field(j, path, "single");
    const json& specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
    if (!single.is_array()) fail(path + ".single", "must be an array");
    std::vector<SpecialPiece> before, after;
    bool seen_sequence = false;
    int32_t sequence_type_id = 0;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string p = path + ".single[" + std::to_string(i) + "]";
      const json& piece = single[i];
      if (piece.is_object() && piece.contains("Sequence")) {
        const json& s = piece["Sequence"];
        if (str(s, p + ".Sequence", "id") != "A" || seen_sequence) {
          fail(p, "must be the one sequence $A of a single-sequence template");
        }
        seen_sequence = true;
        sequence_type_id = static_cast<int32_t>(
            integer(field(s, p + ".Sequence", "type_id"), p + ".Sequence.type_id"));
      } else if (piece.is_object() && piece.contains("SpecialToken")) {
        const json& s = piece["SpecialToken"];
        const std::string id = str(s, p + ".SpecialToken", "id");
        const std::string sp = path + ".special_tokens[\"" + id + "\"]";
        if (!specials.contains(id)) fail(sp, "is missing (used by " + p + ")");
        SpecialPiece sp_piece;
        const json& ids = field(specials[id], sp, "ids");
        const json& tokens = field(specials[id], sp, "tokens");
        if (!ids.is_array() || !tokens.is_array() || ids.size() != tokens.size()) {
          fail(sp, "must have arrays ids and tokens of the same length");
        }
        for (size_t k = 0; k < ids.size(); ++k) {
          sp_piece.ids.push_back(this->id(ids[k], sp + ".ids[" + std::to_string(k) + "]"));
          sp_piece.tokens.push_back(tokens[k].is_string() ? tokens[k].get<std::string>()
                                                          : std::string());
        }
        sp_piece.type_id = static_cast<int32_t>(
            integer(field(s, p + ".SpecialToken", "type_id"), p + ".SpecialToken.type_id"));
        (seen_sequence ? after : before).push_back(std::move(sp_piece));
      } else {
        fail(p, "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    if (!seen_sequence) fail(path + ".single", "has no $A sequence");
    return std::make_unique<PostProcessor>(t, std::move(before), std::move(after),
                                           sequence_type_id);
  }

  std::unique_ptr<Truncation> truncation(const json& j, const std::string& path) const {
    auto t = std::make_unique<Truncation>();
    const int64_t max_length = integer(field(j, path, "max_length"), path + ".max_length");
    if (max_length < 0) fail(path + ".max_length", "must not be negative");
    t->max_length = static_cast<size_t>(max_length);
    const std::string direction = j.contains("direction") ? str(j, path, "direction") : "Right";
    if (direction == "Left") {
      t->direction = TruncationDirection::kLeft;
    } else if (direction != "Right") {
      fail(path + ".direction", direction + " is not Right or Left");
    }
    const std::string strategy = j.contains("strategy") ? str(j, path, "strategy") : "LongestFirst";
    if (strategy != "LongestFirst" && strategy != "OnlyFirst") {
      fail(path + ".strategy",
           strategy +
               " is not supported for a single sequence (supported: LongestFirst, OnlyFirst)");
    }
    return t;
  }

  std::vector<AddedToken> added_tokens(const json& j, const std::string& path) const {
    if (!j.is_array()) fail(path, "must be an array");
    std::vector<AddedToken> out;
    for (size_t i = 0; i < j.size(); ++i) {
      const std::string p = path + "[" + std::to_string(i) + "]";
      const json& t = j[i];
      AddedToken a;
      a.id = id(field(t, p, "id"), p + ".id");
      a.content = str(t, p, "content");
      a.special = boolean(t, p, "special", false);
      if (a.content.empty()) fail(p + ".content", "must not be empty");
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
        if (boolean(t, p, flag, false)) fail(p + "." + flag, "true is not supported");
      }
      if (boolean(t, p, "normalized", !a.special)) {
        fail(p + ".normalized",
             "true is not supported (only added tokens matched in the raw text)");
      }
      out.push_back(std::move(a));
    }
    return out;
  }

 private:
  std::string source_;
};

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw TokenizerError(source + ": not valid JSON: " + e.what());
  }
  const Parser p(source);
  if (!j.is_object()) p.fail("(top level)", "must be an object");
  Tokenizer t;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null())
    t.added_tokens_ = p.added_tokens(j["added_tokens"], "added_tokens");
  for (const auto& a : t.added_tokens_) t.added_text_.push_back(decode_utf8(a.content));
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    t.normalizer_ = p.normalizer(j["normalizer"], "normalizer");
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
    t.pre_tokenizer_ = p.pre_tokenizer(j["pre_tokenizer"], "pre_tokenizer");
  }
  t.model_ = p.model(p.field(j, "(top level)", "model"), "model");
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    t.post_processor_ = p.post_processor(j["post_processor"], "post_processor");
  }
  if (j.contains("truncation") && !j["truncation"].is_null())
    t.truncation_ = p.truncation(j["truncation"], "truncation");
  // "padding" and "decoder" are not used: the server pads batches itself and returns no text.
  return t;
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerError(path + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return from_json(buffer.str(), path);
}

void Tokenizer::set_truncation(Truncation t) { truncation_ = std::make_unique<Truncation>(t); }

Encoding Tokenizer::encode(std::string_view utf8_text, bool add_special_tokens) const {
  return encode(utf8_text, truncation_.get(), add_special_tokens);
}

std::vector<Offsets> byte_offsets(std::string_view utf8_text, const std::vector<Offsets>& offsets) {
  // The byte where each code point starts, and the end.
  std::vector<uint32_t> at;
  at.reserve(utf8_text.size() + 1);
  for (size_t i = 0; i < utf8_text.size(); ++i)
    if ((static_cast<unsigned char>(utf8_text[i]) & 0xC0) != 0x80) at.push_back(uint32_t(i));
  at.push_back(uint32_t(utf8_text.size()));
  std::vector<Offsets> out;
  out.reserve(offsets.size());
  for (const auto& [s, e] : offsets) {
    const auto byte = [&](uint32_t cp) { return cp < at.size() ? at[cp] : at.back(); };
    out.push_back({byte(s), byte(e)});
  }
  return out;
}

Encoding Tokenizer::encode(std::string_view utf8_text, const Truncation* truncation,
                           bool add_special_tokens, bool offsets) const {
  const std::u32string text = decode_utf8(utf8_text);
  Encoding enc;
  std::vector<std::u32string> words;
  std::vector<size_t> starts;
  std::vector<Offsets> ranges;

  // A stretch of text between added tokens: normalize, pre-tokenize, model. With offsets, the
  // normalized text keeps each character's range in the stretch (tokenizers' alignments), the
  // words their starts in it, the model each token's range in its word.
  auto encode_span = [&](size_t begin, size_t end) {
    if (begin == end) return;
    std::u32string span = text.substr(begin, end - begin);
    Aligned aligned;
    if (offsets) {
      aligned = Aligned::identity(std::move(span));
      if (normalizer_) normalizer_->normalize(aligned);
      span = aligned.text;
    } else if (normalizer_) {
      normalizer_->normalize(span);
    }
    words.clear();
    starts.assign(1, 0);
    words.push_back(std::move(span));
    if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(words, starts);
    for (size_t w = 0; w < words.size(); ++w) {
      if (words[w].empty()) continue;
      if (!offsets) {
        model_->tokenize(encode_utf8(words[w]), enc);
        continue;
      }
      ranges.clear();
      model_->tokenize(encode_utf8(words[w]), enc, &ranges);
      for (const auto& [s, e] : ranges) {
        // A token's normalized characters -> the original: the first one's start, the last
        // one's end (tokenizers' expand_alignments), shifted to the stretch's place.
        const size_t first = starts[w] + s, last = starts[w] + e - 1;
        const Offsets a = aligned.align[first], b = aligned.align[last];
        enc.offsets.push_back({uint32_t(begin) + a.first, uint32_t(begin) + b.second});
      }
    }
  };

  // Added tokens, leftmost-longest, in the raw text (tokenizers' AddedVocabulary).
  const std::vector<std::u32string>& added = added_text_;
  size_t span_begin = 0;
  size_t i = 0;
  while (i < text.size() && !added.empty()) {
    size_t best = SIZE_MAX;
    for (size_t k = 0; k < added.size(); ++k) {
      const auto& a = added[k];
      if (a.size() <= text.size() - i && text.compare(i, a.size(), a) == 0 &&
          (best == SIZE_MAX || a.size() > added[best].size())) {
        best = k;
      }
    }
    if (best == SIZE_MAX) {
      ++i;
      continue;
    }
    encode_span(span_begin, i);
    enc.ids.push_back(added_tokens_[best].id);
    enc.tokens.push_back(added_tokens_[best].content);
    if (offsets) enc.offsets.push_back({uint32_t(i), uint32_t(i + added[best].size())});
    i += added[best].size();
    span_begin = i;
  }
  encode_span(span_begin, text.size());

  // Truncate, leaving room for the special tokens the post-processor adds (tokenizers'
  // Tokenizer::post_process), then add them.
  const size_t n_special = add_special_tokens ? num_special_tokens_added() : 0;
  if (truncation) {
    if (truncation->max_length < n_special) {
      throw TokenizerError("truncation max_length " + std::to_string(truncation->max_length) +
                           " is less than the " + std::to_string(n_special) +
                           " special tokens the post-processor adds");
    }
    const size_t keep = truncation->max_length - n_special;
    if (enc.ids.size() > keep) {
      if (truncation->direction == TruncationDirection::kRight) {
        enc.ids.resize(keep);
        enc.tokens.resize(keep);
        if (offsets) enc.offsets.resize(keep);
      } else {
        const auto cut = static_cast<std::ptrdiff_t>(enc.ids.size() - keep);
        enc.ids.erase(enc.ids.begin(), enc.ids.begin() + cut);
        enc.tokens.erase(enc.tokens.begin(), enc.tokens.begin() + cut);
        if (offsets) enc.offsets.erase(enc.offsets.begin(), enc.offsets.begin() + cut);
      }
    }
  }
  if (add_special_tokens && post_processor_) {
    post_processor_->process(enc, offsets);
  } else {
    enc.type_ids.assign(enc.ids.size(), 0);
  }
  return enc;
}

size_t Tokenizer::num_special_tokens_added() const {
  return post_processor_ ? post_processor_->added_tokens() : 0;
}

size_t Tokenizer::vocab_size() const {
  size_t n = model_->vocab().size();
  for (const auto& a : added_tokens_) n += model_->vocab().count(a.content) == 0;
  return n;
}

int32_t Tokenizer::max_token_id() const {
  int32_t m = -1;
  for (const auto& [token, id] : model_->vocab()) m = std::max(m, id);
  for (const auto& a : added_tokens_) m = std::max(m, a.id);
  if (post_processor_) m = std::max(m, post_processor_->max_id());
  return m;
}

std::string Tokenizer::description() const {
  std::string parts;
  auto add = [&](const std::string& s) { parts += (parts.empty() ? "" : ", ") + s; };
  if (normalizer_) add(normalizer_->name());
  if (pre_tokenizer_) add(pre_tokenizer_->name());
  if (post_processor_) add(post_processor_->name());
  return model_->name() + (parts.empty() ? "" : " (" + parts + ")");
}

bool Tokenizer::is_special(int32_t id) const {
  for (const AddedToken& t : added_tokens_) {
    if (t.id == id && t.special) return true;
  }
  return false;
}

}  // namespace fastformer::tokenizer
