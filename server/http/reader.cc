#include "server/http/reader.h"

#include <algorithm>

#include "server/http/json.h"

namespace fastformer::http::reader {

std::string at_index(size_t i) {
  std::string s(1, '[');
  s.append(std::to_string(i)).append("]: ");
  return s;
}

std::string expected(std::string_view what, const simdjson::dom::element& got) {
  std::string_view text;
  if (!got.get_string().get(text)) {
    std::string quoted(text.substr(0, 64));
    if (text.size() > 64) quoted += "...";
    return "expected " + std::string(what) + ", got \"" + quoted + "\"";
  }
  return "expected " + std::string(what) + ", got " + json::type_name(got);
}

std::string where(std::string_view name, const std::string& why) {
  if (!why.empty() && (why[0] == '[' || why[0] == '.')) return std::string(name) + why;
  return std::string(name) + ": " + why;
}

Why read_string(const simdjson::dom::element& v, std::string* out) {
  std::string_view s;
  if (v.get_string().get(s)) return expected("a string", v);
  out->assign(s);
  return std::nullopt;
}

Why read_bool(const simdjson::dom::element& v, bool* out) {
  if (v.get_bool().get(*out)) return expected("true or false", v);
  return std::nullopt;
}

Why read_int(const simdjson::dom::element& v, int64_t min, int64_t max, int64_t* out) {
  const std::string what =
      min == 1 && max == INT32_MAX ? "a positive integer"
      : min == 0 && max == INT32_MAX
          ? "a non-negative integer"
          : "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  int64_t n = 0;
  if (v.get_int64().get(n)) return expected(what, v);
  if (n < min || n > max) return "expected " + what + ", got " + std::to_string(n);
  *out = n;
  return std::nullopt;
}

Why read_choice(const simdjson::dom::element& v, const std::vector<std::string_view>& choices,
                std::string* out, bool any_case) {
  std::string what;
  for (size_t i = 0; i < choices.size(); ++i) {
    what += i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ";
    what.append(1, '"').append(choices[i]).append(1, '"');
  }
  std::string_view s;
  if (v.get_string().get(s)) return expected(what, v);
  std::string key(s);
  if (any_case) std::transform(key.begin(), key.end(), key.begin(), ::tolower);
  if (std::find(choices.begin(), choices.end(), key) == choices.end()) return expected(what, v);
  *out = key;
  return std::nullopt;
}

Why read_format(const simdjson::dom::element& v, request::EmbeddingFormat* out) {
  std::string_view s;
  std::optional<request::EmbeddingFormat> f;
  if (!v.get_string().get(s)) f = request::parse_embedding_format(s);
  if (!f) return expected(request::embedding_format_names(), v);
  *out = std::move(*f);
  return std::nullopt;
}

Why read_strings(const simdjson::dom::element& v, std::vector<std::string>* out) {
  simdjson::dom::array array;
  if (v.get_array().get(array)) return expected("an array of strings", v);
  for (const simdjson::dom::element item : array) {
    std::string_view s;
    if (item.get_string().get(s)) return at_index(out->size()) + expected("a string", item);
    out->emplace_back(s);
  }
  return std::nullopt;
}

Why read_inputs(const simdjson::dom::element& value, Inputs* out) {
  auto read_ids = [&](const simdjson::dom::array& array, const std::string& where,
                      std::vector<int64_t>* ids) -> Why {
    for (const simdjson::dom::element id : array) {
      int64_t v = 0;
      if (id.get_int64().get(v)) return where + expected("token ids (integers)", id);
      ids->push_back(v);
    }
    return std::nullopt;
  };
  std::string_view text;
  if (!value.get_string().get(text)) {
    out->texts.emplace_back(text);
    out->single = true;
    return std::nullopt;
  }
  simdjson::dom::array array;
  if (value.get_array().get(array)) {
    return expected(
        "a string, an array of strings, an array of token ids or an array of arrays of token ids",
        value);
  }
  if (array.size() == 0) return "is empty; send at least one input";
  const simdjson::dom::element first = array.at(0).value_unsafe();
  if (first.is_int64() || first.is_uint64()) {
    out->single = true;
    return read_ids(array, "", &out->ids.emplace_back());
  }
  size_t i = 0;
  for (const simdjson::dom::element item : array) {
    const std::string at = at_index(i++);
    if (!item.get_string().get(text)) {
      if (!out->ids.empty()) return at + "mixes text with token ids; send one kind";
      out->texts.emplace_back(text);
      continue;
    }
    simdjson::dom::array ids;
    if (!item.get_array().get(ids)) {
      if (!out->texts.empty()) return at + "mixes token ids with text; send one kind";
      if (auto e = read_ids(ids, at, &out->ids.emplace_back())) return e;
      continue;
    }
    return at + expected("a string or an array of token ids", item);
  }
  return std::nullopt;
}

std::optional<std::string> read_object(simdjson::dom::parser& parser, const Request& request,
                                       simdjson::dom::object* body) {
  simdjson::dom::element root;
  if (auto e = json::parse(parser, request.body(), &root)) return e;
  if (root.get_object().get(*body)) {
    return std::string("the request body must be a JSON object, got ") + json::type_name(root);
  }
  return std::nullopt;
}

}  // namespace fastformer::http::reader
