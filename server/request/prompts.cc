#include "server/request/prompts.h"

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace fastformer::request {

std::string Prompts::names() const {
  std::string out;
  for (const auto& [name, text] : by_name) out += (out.empty() ? "'" : ", '") + name + "'";
  return out;
}

std::string Prompts::to_json() const {
  nlohmann::json doc = {{"prompts", nlohmann::json::object()}, {"default_prompt_name", nullptr}};
  for (const auto& [name, text] : by_name) doc["prompts"][name] = text;
  if (default_name) doc["default_prompt_name"] = *default_name;
  return doc.dump();
}

Prompts Prompts::parse(std::string_view json, const std::string& where) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) { return std::invalid_argument(where + ": " + what); };
  if (!doc.is_object()) throw bad("is not a JSON object");
  Prompts p;
  if (doc.contains("prompts") && !doc["prompts"].is_null()) {
    if (!doc["prompts"].is_object()) throw bad("\"prompts\" must be an object of name: text");
    for (const auto& [name, text] : doc["prompts"].items()) {
      if (!text.is_string()) throw bad("prompts \"" + name + "\" must be a string");
      p.by_name[name] = text.get<std::string>();
    }
  }
  if (doc.contains("default_prompt_name") && !doc["default_prompt_name"].is_null()) {
    const nlohmann::json& d = doc["default_prompt_name"];
    if (!d.is_string() || !p.by_name.count(d.get<std::string>())) {
      throw bad("default_prompt_name " + d.dump() + " names no prompt (" +
                (p.by_name.empty() ? std::string("there are none") : p.names()) + ")");
    }
    p.default_name = d.get<std::string>();
  }
  return p;
}

std::shared_ptr<const Prompts> Prompts::load(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "config_sentence_transformers.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return nullptr;
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path.string() + ": cannot be read");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto prompts = std::make_shared<const Prompts>(parse(text, path.string()));
  return prompts->by_name.empty() ? nullptr : prompts;
}

std::optional<std::string> choose_prompt(const Prompts* prompts,
                                         const std::optional<std::string>& name,
                                         const std::optional<std::string>& hint,
                                         std::string* prompt_text, std::string* chosen) {
  prompt_text->clear();
  chosen->clear();
  auto take = [&](const std::string& n) -> bool {
    if (prompts == nullptr) return false;
    const auto it = prompts->by_name.find(n);
    if (it == prompts->by_name.end()) return false;
    *prompt_text = it->second;
    *chosen = n;
    return true;
  };
  if (name) {
    if (take(*name)) return std::nullopt;
    if (prompts == nullptr || prompts->by_name.empty()) {
      return "'" + *name +
             "' is not a prompt of this model: it has none (config_sentence_transformers.json)";
    }
    return "'" + *name + "' is not a prompt of this model; its prompts: " + prompts->names();
  }
  if (hint && take(*hint)) return std::nullopt;
  if (prompts != nullptr && prompts->default_name) take(*prompts->default_name);
  return std::nullopt;
}

}  // namespace fastformer::request
