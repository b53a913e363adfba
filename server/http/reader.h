// The one reader of JSON request bodies (issue 49): each HTTP API declares its request as a
// struct and a table of fields (wire name, what it takes, required or not, and the request-layer
// option it sets), and read() fills the struct from a simdjson object. Every refusal is worded
// here, the same everywhere: "<field>: expected <what>, got <what was sent>", "<field>: is
// required", "<field>[2]: expected a string, got an integer". Absent and null fields are left
// at the struct's default; fields a table does not name are ignored, as every API here always
// ignored them.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/http/http_server.h"
#include "server/request/quantize.h"

namespace fastformer::http::reader {

// A refused body: the field (OpenAI's error `param`) and the whole message, field first.
struct Refusal {
  std::string field;
  std::string message;
};

// The words of a refusal: "expected <what>, got <the value's type, or a string's text>".
std::string expected(std::string_view what, const simdjson::dom::element& got);

// What a field's reader returns: why the value is refused, without the field's name (a message
// that starts with '[' or '.' names a part of it: "[2]: expected a string, got null").
using Why = std::optional<std::string>;

// The value readers every table is made of.
Why read_string(const simdjson::dom::element& v, std::string* out);
Why read_bool(const simdjson::dom::element& v, bool* out);
// An integer in [min, max] ("a positive integer" for [1, ..], "a non-negative integer" for
// [0, ..] up to int32's max, else "an integer in [min, max]").
Why read_int(const simdjson::dom::element& v, int64_t min, int64_t max, int64_t* out);
// One of `choices` ("\"a\", \"b\" or \"c\""); with `any_case`, compared in lower case.
Why read_choice(const simdjson::dom::element& v, const std::vector<std::string_view>& choices,
                std::string* out, bool any_case = false);
// An array of strings (empty allowed; the table's rule says whether it is refused).
Why read_strings(const simdjson::dom::element& v, std::vector<std::string>* out);

// The text or token-id inputs of OpenAI's `input` and TEI's `inputs`: a string, an array of
// strings, an array of ids or an array of arrays of ids. `single`: a lone string or id array.
struct Inputs {
  std::vector<std::string> texts;
  std::vector<std::vector<int64_t>> ids;
  bool single = false;
  size_t size() const { return texts.size() + ids.size(); }
};
Why read_inputs(const simdjson::dom::element& v, Inputs* out);

// One field of a request struct T.
template <class T>
struct Field {
  std::string_view name;
  std::function<Why(const simdjson::dom::element&, T&)> read;
  bool required = false;
};

// Fields by what they take; `set` puts the value where the request layer (or the door) wants it.
template <class T>
Field<T> string_field(std::string_view name, std::function<void(T&, std::string)> set,
                      bool required = false) {
  return {name,
          [set](const simdjson::dom::element& v, T& t) -> Why {
            std::string s;
            if (auto e = read_string(v, &s)) return e;
            set(t, std::move(s));
            return std::nullopt;
          },
          required};
}
template <class T>
Field<T> bool_field(std::string_view name, std::function<void(T&, bool)> set) {
  return {name, [set](const simdjson::dom::element& v, T& t) -> Why {
            bool b = false;
            if (auto e = read_bool(v, &b)) return e;
            set(t, b);
            return std::nullopt;
          }};
}
template <class T>
Field<T> int_field(std::string_view name, int64_t min, int64_t max,
                   std::function<void(T&, int64_t)> set) {
  return {name, [min, max, set](const simdjson::dom::element& v, T& t) -> Why {
            int64_t n = 0;
            if (auto e = read_int(v, min, max, &n)) return e;
            set(t, n);
            return std::nullopt;
          }};
}
template <class T>
Field<T> choice_field(std::string_view name, std::vector<std::string_view> choices,
                      std::function<void(T&, const std::string&)> set, bool any_case = false) {
  return {name, [choices, set, any_case](const simdjson::dom::element& v, T& t) -> Why {
            std::string s;
            if (auto e = read_choice(v, choices, &s, any_case)) return e;
            set(t, s);
            return std::nullopt;
          }};
}
// An embedding type by its JSON name (request::parse_embedding_format: ours or "base64").
Why read_format(const simdjson::dom::element& v, request::EmbeddingFormat* out);
template <class T>
Field<T> format_field(std::string_view name,
                      std::function<void(T&, request::EmbeddingFormat)> set) {
  return {name, [set](const simdjson::dom::element& v, T& t) -> Why {
            request::EmbeddingFormat f;
            if (auto e = read_format(v, &f)) return e;
            set(t, std::move(f));
            return std::nullopt;
          }};
}

// A field this server does not serve: refused with `why` whenever it is sent (not null).
template <class T>
Field<T> refused_field(std::string_view name, std::string why) {
  return {name, [why](const simdjson::dom::element&, T&) -> Why { return why; }};
}

// "[i]: ", the start of a part's refusal (built by appends: GCC 12's -Wrestrict misfires on
// "[" + std::string).
std::string at_index(size_t i);

// "<name>: <why>", or "<name>[2]: ..." when `why` names a part.
std::string where(std::string_view name, const std::string& why);

// Fills `out` from `body` by `table`, in the table's order; the first refusal.
template <class T>
std::optional<Refusal> read(const simdjson::dom::object& body, const std::vector<Field<T>>& table,
                            T* out) {
  for (const Field<T>& f : table) {
    simdjson::dom::element v;
    if (body[f.name].get(v) || v.is_null()) {
      if (f.required) return Refusal{std::string(f.name), std::string(f.name) + ": is required"};
      continue;
    }
    if (auto why = f.read(v, *out)) return Refusal{std::string(f.name), where(f.name, *why)};
  }
  return std::nullopt;
}

// The request's body as a JSON object (parsed by `parser`, which must outlive `body`), or why
// not: the one reading of a JSON body.
std::optional<std::string> read_object(simdjson::dom::parser& parser, const Request& request,
                                       simdjson::dom::object* body);

// read_object, then read(): a door's whole parse.
template <class T>
std::optional<Refusal> read_body(const Request& request, const std::vector<Field<T>>& table,
                                 T* out) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object body;
  if (auto e = read_object(parser, request, &body)) return Refusal{"", *e};
  return read(body, table, out);
}

}  // namespace fastformer::http::reader
