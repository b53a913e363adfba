// fastformer-client: the command-line client of fastformer-server.
//
//   fastformer-client encode [--ids 1,2,3]... | [--text "..."]... | [--input FILE|-]
//                                                  JSON lines out, as fastformer-encode writes
//   fastformer-client info                         ModelInfo as JSON (accepts_text, tokenizer, ...)
//   fastformer-client health [--service NAME]      exit 0 only when SERVING
//
// Exit codes: 0 success; 1 the server could not be reached, a call failed (the status name and
// message go to stderr) or health is not SERVING; 2 bad flags or an unparsable input line.
#include <google/protobuf/util/json_util.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/cmd/connection_flags.h"
#include "common/jsonl_io.h"
#include "fastformer/client.h"

namespace {

using namespace fastformer;
using cli::kExitFailure;
using cli::kExitUsage;

constexpr const char* kProgram = "fastformer-client";
constexpr int64_t kHealthDeadlineMs = 5000;  ///< health's default --deadline-ms

struct EncodeFlags {
  std::vector<std::string> ids;    ///< one sequence per --ids
  std::vector<std::string> texts;  ///< one sequence per --text
  std::string input;               ///< JSON lines; "-" = stdin (the default)
  std::string output = "-";
  bool token_embeddings = false;
  bool logits = false;
  bool normalize = false;
  std::string truncation = "none";
  std::string span_pooling = "model";     ///< how a line's "spans" are pooled
  std::optional<uint32_t> macro_overlap;  ///< macro-chunks for lines over the positions
  int batch = 32;
};

// "1,2,3" -> {1, 2, 3}.
std::optional<std::vector<int32_t>> parse_ids(const std::string& text, std::string* error) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    try {
      size_t used = 0;
      const long long value = std::stoll(item, &used);
      if (item.find_first_not_of(" \t", used) != std::string::npos || value < INT32_MIN ||
          value > INT32_MAX) {
        throw std::invalid_argument(item);
      }
      ids.push_back(static_cast<int32_t>(value));
    } catch (const std::exception&) {
      *error = "--ids " + text + ": \"" + item + "\" is not a 32-bit integer";
      return std::nullopt;
    }
    pos = comma + 1;
  }
  return ids;
}

// The JSON line of one Encoding, written by fastformer-encode's own writer.
void append_encoding(const v1::Encoding& encoding, int64_t hidden_size, std::string* out) {
  EncodedSequence seq;
  seq.embedding.assign(encoding.embedding().begin(), encoding.embedding().end());
  seq.token_embeddings.assign(encoding.token_embeddings().begin(),
                              encoding.token_embeddings().end());
  seq.logits.assign(encoding.logits().begin(), encoding.logits().end());
  seq.num_tokens = static_cast<int32_t>(encoding.num_tokens());
  for (const v1::Chunk& chunk : encoding.chunks())  // late chunking: "span_embeddings"
    seq.span_embeddings.insert(seq.span_embeddings.end(), chunk.embedding().begin(),
                               chunk.embedding().end());
  jsonl::append_output_line(seq, hidden_size, out);
}

// Sends the pending sequences as one request and writes their lines; false (reported) on failure.
class EncodeBatcher {
 public:
  EncodeBatcher(Client& client, const EncodeFlags& flags, int64_t hidden_size, std::FILE* out)
      : client_(client), hidden_size_(hidden_size), out_(out) {
    request_.set_return_token_embeddings(flags.token_embeddings);
    request_.set_return_logits(flags.logits);
    request_.set_normalize(flags.normalize);
    request_.set_chunk_pooling(flags.span_pooling == "mean" ? v1::CHUNK_POOLING_MEAN
                                                            : v1::CHUNK_POOLING_MODEL);
    if (flags.macro_overlap)
      request_.mutable_macro_overlap_tokens()->set_value(*flags.macro_overlap);
    request_.set_truncation(flags.truncation == "right"  ? v1::TRUNCATION_RIGHT
                            : flags.truncation == "left" ? v1::TRUNCATION_LEFT
                                                         : v1::TRUNCATION_UNSPECIFIED);
    batch_ = flags.batch;
  }

  // Adds one sequence (from input line `line`); sends when the batch is full.
  bool add(const jsonl::InputLine& input, int64_t line) {
    v1::Sequence* seq = request_.add_sequences();
    seq->mutable_token_ids()->Assign(input.token_ids.begin(), input.token_ids.end());
    seq->mutable_input_embeddings()->Assign(input.input_embeddings.begin(),
                                            input.input_embeddings.end());
    if (input.text) seq->set_text(*input.text);
    for (const TokenSpan& span : input.spans) {  // late chunking: the line's "spans"
      v1::TokenSpan* s = seq->mutable_chunking()->add_spans();
      s->set_begin(uint32_t(std::max(span.begin, 0)));
      s->set_end(uint32_t(std::max(span.end, 0)));
    }
    if (request_.sequences_size() == 1) first_line_ = line;
    last_line_ = line;
    return request_.sequences_size() < batch_ || flush();
  }

  bool flush() {
    if (request_.sequences_size() == 0) return true;
    v1::EncodeResponse response;
    const grpc::Status status = client_.Encode(request_, &response);
    if (!status.ok()) {
      const std::string where = first_line_ == last_line_ ? "line " + std::to_string(first_line_)
                                                          : "lines " + std::to_string(first_line_) +
                                                                "-" + std::to_string(last_line_);
      cli::print_error(kProgram, "Encode failed (" + where + "): " + cli::describe(status));
      return false;
    }
    std::string buffer;
    for (const auto& encoding : response.encodings())
      append_encoding(encoding, hidden_size_, &buffer);
    std::fwrite(buffer.data(), 1, buffer.size(), out_);
    request_.clear_sequences();
    return true;
  }

 private:
  Client& client_;
  const int64_t hidden_size_;
  std::FILE* out_;
  v1::EncodeRequest request_;
  int batch_ = 1;
  int64_t first_line_ = 0, last_line_ = 0;
};

int run_encode(Client& client, const EncodeFlags& flags) {
  v1::ModelInfo info;
  if (const grpc::Status status = client.GetModelInfo(&info); !status.ok()) {
    cli::print_error(kProgram, "GetModelInfo failed: " + cli::describe(status));
    return kExitFailure;
  }
  const int64_t hidden_size = info.hidden_size();

  std::FILE* out = stdout;
  if (flags.output != "-") {
    out = std::fopen(flags.output.c_str(), "wb");
    if (out == nullptr) {
      cli::print_error(kProgram, "--output " + flags.output + ": cannot open for writing");
      return kExitUsage;
    }
  }
  int exit_code = 0;
  {
    EncodeBatcher batcher(client, flags, hidden_size, out);
    if (!flags.ids.empty()) {
      for (size_t i = 0; i < flags.ids.size() && exit_code == 0; ++i) {
        std::string error;
        auto ids = parse_ids(flags.ids[i], &error);
        if (!ids) {
          cli::print_error(kProgram, error);
          exit_code = kExitUsage;
          break;
        }
        jsonl::InputLine line;
        line.token_ids = std::move(*ids);
        if (!batcher.add(line, int64_t(i) + 1)) exit_code = kExitFailure;
      }
    } else if (!flags.texts.empty()) {
      for (size_t i = 0; i < flags.texts.size() && exit_code == 0; ++i) {
        jsonl::InputLine line;
        line.text = flags.texts[i];
        if (!batcher.add(line, int64_t(i) + 1)) exit_code = kExitFailure;
      }
    } else {
      const std::string source = flags.input.empty() ? "-" : flags.input;
      std::ifstream file;
      std::istream* in = &std::cin;
      if (source != "-") {
        file.open(source);
        if (!file) {
          cli::print_error(kProgram, "--input " + source + ": cannot open");
          exit_code = kExitUsage;
        }
        in = &file;
      }
      std::string text;
      for (int64_t number = 1; exit_code == 0 && std::getline(*in, text); ++number) {
        if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
        std::string error;
        auto line = jsonl::parse_input_line(text, hidden_size, &error);
        if (!line) {
          // Everything before the bad line is written, as fastformer-encode does.
          exit_code = batcher.flush() ? kExitUsage : kExitFailure;
          cli::print_error(kProgram, (source == "-" ? std::string("stdin") : source) + ": line " +
                                         std::to_string(number) + ": " + error);
          break;
        }
        if (!batcher.add(*line, number)) exit_code = kExitFailure;
      }
    }
    if (exit_code == 0 && !batcher.flush()) exit_code = kExitFailure;
  }
  if (out != stdout)
    std::fclose(out);
  else
    std::fflush(out);
  return exit_code;
}

int run_info(Client& client) {
  v1::ModelInfo info;
  if (const grpc::Status status = client.GetModelInfo(&info); !status.ok()) {
    cli::print_error(kProgram, "GetModelInfo failed: " + cli::describe(status));
    return kExitFailure;
  }
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(info, &json, options);
  std::cout << json << std::flush;
  return 0;
}

int run_health(Client& client, const std::string& service) {
  grpc::Status status;
  const HealthStatus health = client.Health(service, &status);
  if (!status.ok()) {
    cli::print_error(kProgram, "health check failed: " + cli::describe(status));
    return kExitFailure;
  }
  if (health != HealthStatus::kServing) {
    cli::print_error(kProgram, std::string("health: ") + health_status_name(health) +
                                   (service.empty() ? "" : " (service " + service + ")"));
    return kExitFailure;
  }
  std::cout << health_status_name(health) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fastformer-client: call a fastformer-server from the command line"};
  app.require_subcommand(1);
  cli::ConnectionFlags connection;

  EncodeFlags encode_flags;
  CLI::App* encode = app.add_subcommand(
      "encode", "encode sequences; one JSON line out per sequence, as fastformer-encode writes");
  cli::add_connection_flags(*encode, connection);
  auto* ids = encode->add_option("--ids", encode_flags.ids,
                                 "token ids of one sequence, comma-separated (repeat for more)");
  auto* texts = encode
                    ->add_option("--text", encode_flags.texts,
                                 "one sequence as text, tokenized by the server (repeat for more; "
                                 "the model needs a tokenizer.json: see info's accepts_text)")
                    ->excludes(ids);
  encode
      ->add_option("--input", encode_flags.input,
                   "JSON lines ({\"token_ids\": [...]}, {\"input_embeddings\": [[...], ...]} or "
                   "{\"text\": \"...\"}), - for stdin (the default without --ids or --text)")
      ->excludes(ids)
      ->excludes(texts);
  encode->add_option("--output", encode_flags.output, "output JSON lines, - for stdout")
      ->capture_default_str();
  encode->add_flag("--return-token-embeddings", encode_flags.token_embeddings,
                   "also write each token's final hidden state");
  encode->add_flag("--return-logits", encode_flags.logits,
                   "also write the classifier head's logits");
  encode->add_flag("--normalize", encode_flags.normalize,
                   "L2-normalise the pooled embedding (and each span's)");
  encode
      ->add_option("--span-pooling", encode_flags.span_pooling,
                   "a line's \"spans\" (late chunking) pooled by: model or mean")
      ->check(CLI::IsMember({"model", "mean"}))
      ->capture_default_str();
  encode->add_option("--macro-overlap-tokens", encode_flags.macro_overlap,
                     "macro-chunks: a line over max_position_embeddings runs as overlapping passes "
                     "(this many tokens shared) instead of being refused (docs/api.md)");
  encode
      ->add_option("--truncation", encode_flags.truncation,
                   "over-long sequences: none (an error), right (keep the first tokens), left "
                   "(keep the last; a text keeps its special tokens)")
      ->check(CLI::IsMember({"none", "right", "left"}))
      ->capture_default_str();
  encode->add_option("--batch", encode_flags.batch, "sequences per request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  CLI::App* info =
      app.add_subcommand("info", "print the served model and limits (ModelInfo) as JSON");
  cli::add_connection_flags(*info, connection);

  std::string service;
  CLI::App* health = app.add_subcommand("health",
                                        "grpc.health.v1 check: prints SERVING and exits 0, else "
                                        "exits 1 (default --deadline-ms 5000)");
  cli::add_connection_flags(*health, connection);
  health->add_option("--service", service, "service to check; empty = the whole server")
      ->capture_default_str();

  if (auto code = cli::parse_command_line(app, argc, argv)) return *code;
  // A health check answers at once or not at all: it should not hang a container's probe.
  if (health->parsed() && health->get_option("--deadline-ms")->count() == 0) {
    connection.deadline_ms = kHealthDeadlineMs;
  }

  const std::unique_ptr<Client> client = cli::make_client(connection, kProgram);
  if (!client) return kExitUsage;
  if (encode->parsed()) return run_encode(*client, encode_flags);
  if (info->parsed()) return run_info(*client);
  return run_health(*client, service);
}
