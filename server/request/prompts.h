// A model's prompts (issue 49): sentence-transformers' config_sentence_transformers.json beside
// the weights, {"prompts": {"query": "query: ", "document": "passage: "}, "default_prompt_name":
// null}, or config.pbtxt's parameters["prompts"] holding the same object as a JSON string. A
// request names one (each protocol's wire name maps into EncodeInput::prompt_name once) and its
// text rows are tokenized as prompt + text (text::tokenize_prompted). The rule of which prompt a
// request gets lives here, once.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace fastformer::request {

struct Prompts {
  std::map<std::string, std::string, std::less<>> by_name;  ///< name -> the text put first
  std::optional<std::string> default_name;                  ///< applies when a request names none

  // The names, quoted and in order: "'document', 'query'".
  std::string names() const;
  // The object parse() reads, as compact JSON: what the model's metadata shows.
  std::string to_json() const;
  // Reads the object {"prompts": {name: text}, "default_prompt_name": name or null} (other keys
  // ignored). Throws std::invalid_argument naming `where` and what is wrong: a prompt that is not
  // a string, a default that names no prompt.
  static Prompts parse(std::string_view json, const std::string& where);
  // `dir`/config_sentence_transformers.json, parsed; null when there is none or it names no
  // prompt. Throws as parse(), naming the file.
  static std::shared_ptr<const Prompts> load(const std::filesystem::path& dir);
};

// The prompt a request's text rows get, as chosen by the request:
// - `name` (a protocol's prompt_name): that prompt; one the model lacks is refused, and the
//   refusal lists the model's prompts;
// - else `hint` (Cohere's input_type, mapped to a prompt name): that prompt where the model has
//   it, none where it does not (never refused: Cohere's clients always send one);
// - else the model's default_prompt_name, if any.
// Sets *prompt_text (empty: none) and *chosen (its name); returns the refusal, without the field
// name, or nothing. `prompts` may be null (the model has none).
std::optional<std::string> choose_prompt(const Prompts* prompts,
                                         const std::optional<std::string>& name,
                                         const std::optional<std::string>& hint,
                                         std::string* prompt_text, std::string* chosen);

}  // namespace fastformer::request
