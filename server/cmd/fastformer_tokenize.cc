// fastformer-tokenize: runs a tokenizer.json over JSON lines {"text": "..."} and writes one line
// {"ids": [...]} per text (or {"error": "..."}); --bench times the tokenization alone.
//
//   fastformer-tokenize --tokenizer tokenizer.json < texts.jsonl > ids.jsonl
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/text/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  CLI::App app{"Tokenize JSON-lines texts with a Hugging Face tokenizer.json"};
  std::string tokenizer_path;
  bool no_special = false;
  int max_length = 0;
  bool bench = false, offsets = false;
  int repeat = 1;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  app.add_flag("--no-special-tokens", no_special, "do not run the post-processor");
  app.add_option("--max-length", max_length,
                 "truncate to this many tokens (special tokens included)");
  app.add_flag("--offsets", offsets,
               "also write each token's [start, end) in the text (code points): \"offsets\", and "
               "the ids as the offsets path computes them");
  app.add_flag("--bench", bench,
               "print only the throughput (texts/s, tokens/s) of the encode loop");
  app.add_option("--repeat", repeat, "with --bench: passes over the texts")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    auto tokenizer = fastformer::tokenizer::Tokenizer::from_file(tokenizer_path);
    if (max_length > 0) tokenizer.set_truncation({static_cast<size_t>(max_length)});
    std::vector<std::string> texts;
    std::string line;
    for (size_t n = 1; std::getline(std::cin, line); ++n) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
        std::cerr << "fastformer-tokenize: line " << n << ": expected {\"text\": \"...\"}\n";
        return 2;
      }
      texts.push_back(j["text"].get<std::string>());
    }
    if (bench) {
      size_t tokens = 0;
      const auto start = std::chrono::steady_clock::now();
      for (int r = 0; r < repeat; ++r) {
        for (const auto& t : texts)
          tokens += tokenizer.encode(t, tokenizer.truncation(), !no_special, offsets).ids.size();
      }
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double n = static_cast<double>(texts.size()) * repeat;
      std::printf(
          "{\"texts\": %.0f, \"tokens\": %zu, \"seconds\": %.3f, \"texts_per_s\": %.1f, "
          "\"tokens_per_s\": %.1f}\n",
          n, tokens, s, n / s, static_cast<double>(tokens) / s);
      return 0;
    }
    std::string out;
    for (const auto& t : texts) {
      nlohmann::json result;
      try {
        const auto enc = tokenizer.encode(t, tokenizer.truncation(), !no_special, offsets);
        result["ids"] = enc.ids;
        if (offsets) {
          nlohmann::json list = nlohmann::json::array();
          for (const auto& [s, e] : enc.offsets) list.push_back({s, e});
          result["offsets"] = list;
        }
      } catch (const fastformer::tokenizer::TokenizerError& e) {
        result["error"] = e.what();
      }
      out = result.dump();
      out += '\n';
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
  } catch (const std::exception& e) {
    std::cerr << "fastformer-tokenize: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
