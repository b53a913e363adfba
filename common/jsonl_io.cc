#include "common/jsonl_io.h"

#include <charconv>
#include <limits>
#include <nlohmann/json.hpp>

namespace fastformer::jsonl {
namespace {

using nlohmann::json;

void append_float(float v, std::string* out) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  out->append(buf, res.ptr);
}

void append_floats(const float* v, int64_t n, std::string* out) {
  out->push_back('[');
  for (int64_t i = 0; i < n; ++i) {
    if (i) out->push_back(',');
    append_float(v[i], out);
  }
  out->push_back(']');
}

}  // namespace

std::optional<InputLine> parse_input_line(const std::string& line, int64_t hidden_size,
                                          std::string* error) {
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    *error = std::string("invalid JSON: ") + e.what();
    return std::nullopt;
  }
  if (!j.is_object()) {
    *error = "expected a JSON object with \"token_ids\", \"input_embeddings\" or \"text\"";
    return std::nullopt;
  }
  const bool has_ids = j.contains("token_ids"), has_embeddings = j.contains("input_embeddings"),
             has_text = j.contains("text");
  if (int(has_ids) + int(has_embeddings) + int(has_text) != 1) {
    *error = "expected exactly one of \"token_ids\", \"input_embeddings\" or \"text\"";
    return std::nullopt;
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "token_ids" && key != "input_embeddings" && key != "text" && key != "id" &&
        key != "spans") {
      *error = "unknown field \"" + key +
               "\" (expected token_ids, input_embeddings or text, and optionally spans)";
      return std::nullopt;
    }
  }
  InputLine in;
  if (j.contains("spans")) {
    const json& spans = j["spans"];
    if (!spans.is_array()) {
      *error = "spans: expected an array of [begin, end] token ranges";
      return std::nullopt;
    }
    auto int32 = [](const json& v) {
      return v.is_number_integer() && v.get<int64_t>() >= std::numeric_limits<int32_t>::min() &&
             v.get<int64_t>() <= std::numeric_limits<int32_t>::max();
    };
    in.spans.reserve(spans.size());
    for (size_t i = 0; i < spans.size(); ++i) {
      const json& s = spans[i];
      if (!s.is_array() || s.size() != 2 || !int32(s[0]) || !int32(s[1])) {
        *error = "spans: element " + std::to_string(i) + " is " + s.dump() +
                 ", expected [begin, end] (32-bit integers)";
        return std::nullopt;
      }
      in.spans.push_back(
          {static_cast<int32_t>(s[0].get<int64_t>()), static_cast<int32_t>(s[1].get<int64_t>())});
    }
  }
  if (has_text) {
    const json& text = j["text"];
    if (!text.is_string()) {
      *error = "text: expected a string, got " + text.dump();
      return std::nullopt;
    }
    in.text = text.get<std::string>();
    if (in.text->empty()) {
      *error = "text: empty string: send some text";
      return std::nullopt;
    }
    return in;
  }
  if (has_ids) {
    const json& ids = j["token_ids"];
    if (!ids.is_array()) {
      *error = "token_ids: expected an array of integers";
      return std::nullopt;
    }
    in.token_ids.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const json& v = ids[i];
      if (!v.is_number_integer() || v.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
          v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        *error = "token_ids: element " + std::to_string(i) + " is " + v.dump() +
                 ", expected a 32-bit integer";
        return std::nullopt;
      }
      in.token_ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    if (in.token_ids.empty()) {
      *error = "token_ids: empty sequence: send at least one token id";
      return std::nullopt;
    }
    return in;
  }
  const json& rows = j["input_embeddings"];
  if (!rows.is_array() || rows.empty()) {
    *error = "input_embeddings: expected a non-empty array of rows";
    return std::nullopt;
  }
  in.rows = static_cast<int64_t>(rows.size());
  in.input_embeddings.reserve(size_t(in.rows * hidden_size));
  for (size_t r = 0; r < rows.size(); ++r) {
    const json& rowj = rows[r];
    if (!rowj.is_array() || static_cast<int64_t>(rowj.size()) != hidden_size) {
      *error =
          "input_embeddings: row " + std::to_string(r) + " has " +
          (rowj.is_array() ? std::to_string(rowj.size()) + " values" : std::string("no array")) +
          ", expected hidden_size " + std::to_string(hidden_size);
      return std::nullopt;
    }
    for (const json& v : rowj) {
      if (!v.is_number()) {
        *error = "input_embeddings: row " + std::to_string(r) + " holds " + v.dump() +
                 ", expected numbers";
        return std::nullopt;
      }
      // Values beyond float range become +-Inf here and are rejected by validation.
      in.input_embeddings.push_back(static_cast<float>(v.get<double>()));
    }
  }
  return in;
}

void append_output_line(const EncodedSequence& seq, int64_t hidden_size, std::string* out) {
  out->append("{\"embedding\":");
  append_floats(seq.embedding.data(), int64_t(seq.embedding.size()), out);
  out->append(",\"num_tokens\":");
  out->append(std::to_string(seq.num_tokens));
  if (!seq.token_embeddings.empty()) {
    out->append(",\"token_embeddings\":[");
    for (int64_t t = 0; t < seq.num_tokens; ++t) {
      if (t) out->push_back(',');
      append_floats(seq.token_embeddings.data() + t * hidden_size, hidden_size, out);
    }
    out->push_back(']');
  }
  if (!seq.logits.empty()) {
    out->append(",\"logits\":");
    append_floats(seq.logits.data(), int64_t(seq.logits.size()), out);
  }
  if (!seq.span_embeddings.empty() && !seq.embedding.empty()) {
    // Each span's row as wide as the pooled embedding (after any `dimensions`).
    const int64_t width = int64_t(seq.embedding.size());
    const int64_t spans = int64_t(seq.span_embeddings.size()) / width;
    out->append(",\"span_embeddings\":[");
    for (int64_t i = 0; i < spans; ++i) {
      if (i) out->push_back(',');
      append_floats(seq.span_embeddings.data() + i * width, width, out);
    }
    out->push_back(']');
  }
  out->append("}\n");
}

}  // namespace fastformer::jsonl
