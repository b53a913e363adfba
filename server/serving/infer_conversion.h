// The model as Open Inference Protocol (KServe v2) tensors, and ModelInferRequest <->
// request::Prepared and the job's results. Every row of a request's batch is one sequence in
// the batch queue.
//
// Inputs  input_ids       INT64 or INT32 [batch, length]
//         attention_mask  INT64 or INT32 [batch, length], optional: 1 real, 0 padding
//         input_embeddings FP32 [batch, length, hidden], instead of input_ids
//         text            BYTES [batch, 1] (or [batch]), instead of both, when the model has a
//                         tokenizer.json: one UTF-8 text a row, tokenized by the server
// Outputs embedding        FP32 [batch, hidden]
//         token_embeddings FP32 [batch, length, hidden], zero past each row's tokens
//         logits           FP32 [batch, num_labels], when the model has a classifier head
//         num_tokens       INT64 [batch], tokens per row, when the model has a tokenizer.json
// Parameters (request): normalize (bool), truncation ("none", "right" or "left"), prompt_name
// (string: one of the model's prompts, docs/api.md "Prompts"), and the rest docs/api.md lists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "inference/grpc_service.pb.h"
#include "server/batching/job.h"
#include "server/engine/model.h"
#include "server/request/encode_input.h"
#include "server/request/quantize.h"

namespace fastformer::serving {

struct TensorSpec {
  std::string name;
  std::string datatype;        ///< the protocol's name: "INT64", "FP32"
  inference::DataType type;    ///< the same, as ModelConfig's enum
  std::vector<int64_t> shape;  ///< with the batch dimension; -1 for any size
  bool optional = false;
};

// The model's inputs and outputs, in the order ModelMetadata and ModelConfig list them.
// `tokenizer`: the model's (null when it takes no text: no text input, no num_tokens output).
std::vector<TensorSpec> model_inputs(const engine::Model& model, const text::Tokenizer* tokenizer);
std::vector<TensorSpec> model_outputs(const engine::Model& model, const text::Tokenizer* tokenizer);

// What answering one ModelInferRequest needs beyond its results: its shape, the outputs asked
// for and their order, the span slots and the embedding type.
struct InferCall {
  int64_t rows = 0;
  int64_t length = 0;  ///< the token_embeddings output's length dimension
  bool embedding = false, token_embeddings = false, logits = false;  ///< outputs asked for
  std::vector<std::string> output_order;  ///< the outputs in the order they are answered
  /// Late chunking: the `spans` input's rows (row, begin, end), and for each the sequence and
  /// its index among that sequence's spans (the span_embeddings output follows the input's
  /// order).
  std::vector<std::pair<int64_t, int64_t>> span_slots;
  /// The embedding and span_embeddings outputs' type (the `embedding_type` parameter: INT8 for
  /// int8 and binary, UINT8 for uint8 and ubinary, docs/api.md "Embedding types"), and the
  /// model version's calibrated ranges, which the caller sets before converting (null: none,
  /// so int8 and uint8 are refused naming quantization_file).
  request::EmbeddingType embedding_type = request::EmbeddingType::kFloat;
  std::shared_ptr<const request::Quantization> quantization;
  std::string quantization_file;
  const request::QuantizationRange* range = nullptr;  ///< int8 / uint8: in `quantization`
  /// The model version's prompts (the `prompt_name` parameter's), set by the caller; null: none.
  std::shared_ptr<const request::Prompts> prompts;
};

// INVALID_ARGUMENT naming the tensor, the row and the limit for anything wrong (the model and
// version were found by Intake::find). On OK, `out` (a fresh Prepared) holds one row per row.
Status convert_infer_request(const inference::ModelInferRequest& proto, const engine::Model& model,
                             const text::Tokenizer* tokenizer, const request::Limits& limits,
                             int64_t max_batch_size, InferCall* call, request::Prepared* out);

// Why `bytes` is not a ModelInferRequest: the field and the byte where it fails (a string
// field that is not UTF-8, a tensor or output that does not parse, a field that runs past
// the end).
std::string explain_infer_parse_failure(const std::string& bytes);

// The outputs of a finished job, raw little-endian FP32, in call.output_order.
void fill_infer_response(const InferCall& call, const batching::Job& request,
                         const engine::Model& model, inference::ModelInferResponse* response);

}  // namespace fastformer::serving
