// The output options every protocol shares (encode_input.h): what the model can answer, checked
// once, and `dimensions` applied to the finished results.
#include <cmath>
#include <cstring>

#include "server/request/encode_parts.h"

namespace fastformer::request {

std::optional<std::string> check_options(const OutputOptions& options, const engine::Model& model) {
  if (options.logits && model.num_labels() == 0) {
    return "this model has no classifier head (dense_linear)";
  }
  return std::nullopt;
}

std::optional<std::string> check_dimensions(int64_t dimensions, const engine::Model& model) {
  const int64_t hidden = model.config().hidden_size;
  if (dimensions < 0) return "expected a positive integer, got " + std::to_string(dimensions);
  if (dimensions > hidden) {
    return std::to_string(dimensions) + " is over the model's hidden_size " +
           std::to_string(hidden);
  }
  return std::nullopt;
}

void apply_dimensions(const OutputOptions& options, std::vector<EncodedSequence>* results) {
  if (options.dimensions <= 0) return;
  const size_t dims = size_t(options.dimensions);
  // Matryoshka-style: the first `dimensions` values of a row, re-normalised.
  auto cut = [&](const float* row, float* to) {
    std::memmove(to, row, dims * sizeof(float));  // `to` at or before `row`
    if (!options.normalize) return;
    double norm = 0;
    for (size_t j = 0; j < dims; ++j) norm += double(to[j]) * to[j];
    norm = std::sqrt(norm);
    if (norm > 0) {
      for (size_t j = 0; j < dims; ++j) to[j] = float(to[j] / norm);
    }
  };
  for (EncodedSequence& seq : *results) {
    std::vector<float>& e = seq.embedding;
    const size_t width = e.size();
    if (dims >= width) continue;
    cut(e.data(), e.data());
    e.resize(dims);
    // Each span's embedding the same way, packed to `dims` a row.
    std::vector<float>& spans = seq.span_embeddings;
    const size_t count = spans.size() / width;
    for (size_t i = 0; i < count; ++i) cut(spans.data() + i * width, spans.data() + i * dims);
    spans.resize(count * dims);
  }
}

std::optional<Problem> detail::check_output(const EncodeInput& input, const engine::Model& model,
                                            const VersionFiles* files) {
  const OutputOptions& o = input.options;
  if (auto why = check_dimensions(o.dimensions, model))
    return Problem{std::nullopt, Field::kDimensions, {}, std::move(*why)};
  const int64_t dims = o.dimensions > 0 ? o.dimensions : model.config().hidden_size;
  for (const EmbeddingFormat& f : input.formats) {
    const std::string file(files ? files->quantization_file : "quantization.json");
    if (auto why = check_embedding_type(f.type, dims, o.normalize,
                                        files ? files->quantization : nullptr, file))
      return Problem{std::nullopt, Field::kEmbeddingTypes, {}, std::move(*why)};
  }
  return std::nullopt;
}

}  // namespace fastformer::request
