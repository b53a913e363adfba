// Fuzz target: bytes -> inference.ModelInferRequest (the Open Inference Protocol) ->
// convert_infer_request (tensors, mask, parameters, outputs, limits) -> the admission queue ->
// the ragged batches -> the CPU engine -> fill_infer_response. A request is either refused
// with INVALID_ARGUMENT and a message, or its rows become sequences within every limit and
// the response holds exactly the outputs asked for, each of the size its shape says. (The
// model name and version were routed before conversion: the repository's find.)
//
// Input: byte 0 picks the model (bits 0-1), max_request_tokens (bits 2-3) and
// max_batch_size (bits 4-5); the rest is the serialized ModelInferRequest. The models are
// named "ids_head", "embeddings_only", "pad5_f16" and "shared_bf16".
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "server/serving/infer_conversion.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_models.h"

using namespace fastformer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput in(data, size);
  const uint8_t choice = in.byte();
  fuzz::Served& served = fuzz::served_models()[choice & 3];
  const engine::Model& model = *served.model;
  const engine::ModelConfig& c = model.config();
  request::Limits limits;
  limits.max_request_tokens = std::array<int64_t, 4>{1, 16, 40, 64}[(choice >> 2) & 3];
  const int64_t max_batch_size = std::array<int64_t, 4>{0, 1, 3, 8}[(choice >> 4) & 3];

  const std::string_view bytes = in.rest();
  inference::ModelInferRequest proto;
  if (!proto.ParseFromArray(bytes.data(), int(bytes.size()))) {
    // ModelStreamInfer answers such bytes with this explanation: it must exist and not crash.
    FUZZ_CHECK(!serving::explain_infer_parse_failure(std::string(bytes)).empty());
    return 0;
  }

  serving::InferCall call;
  // Converted from a copy freed before the job runs: the Prepared owns what it views (ASan).
  auto prepared = std::make_shared<request::Prepared>();
  auto wire = std::make_unique<inference::ModelInferRequest>(proto);
  const Status status = serving::convert_infer_request(*wire, model, served.tokenizer.get(), limits,
                                                       max_batch_size, &call, prepared.get());
  wire.reset();
  if (!status.ok()) {
    FUZZ_CHECK(status.code() == StatusCode::kInvalidArgument);
    FUZZ_CHECK(!status.message().empty());
    return 0;
  }
  // Accepted: one sequence per row, each within the model's limits, the request within its own.
  const std::shared_ptr<batching::Job> request = request::make_job(prepared);
  FUZZ_CHECK(call.rows >= 1 && int64_t(request->sequences.size()) == call.rows);
  FUZZ_CHECK(max_batch_size == 0 || call.rows <= max_batch_size);
  int64_t total = 0;
  for (size_t i = 0; i < request->sequences.size(); ++i) {
    const SequenceInput& s = request->sequences[i];
    FUZZ_CHECK(!engine::validate_sequence(c, model.has_word_embedding(), s, i));
    const int64_t n = engine::sequence_length(s, c.hidden_size);
    FUZZ_CHECK(n <= call.length);  // fits the token_embeddings output
    total += n;
  }
  FUZZ_CHECK(total <= limits.max_request_tokens);
  FUZZ_CHECK(!call.logits || model.num_labels() > 0);
  FUZZ_CHECK(!call.output_order.empty());

  fuzz::run_request(served, request);

  inference::ModelInferResponse response;
  serving::fill_infer_response(call, *request, model, &response);
  FUZZ_CHECK(response.outputs_size() == int(call.output_order.size()));
  FUZZ_CHECK(response.raw_output_contents_size() == response.outputs_size());
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& tensor = response.outputs(i);
    FUZZ_CHECK(tensor.name() == call.output_order[size_t(i)]);
    // num_tokens (models with a tokenizer.json) is INT64; every other output FP32.
    const bool ids = tensor.name() == "num_tokens";
    FUZZ_CHECK(tensor.datatype() == (ids ? "INT64" : "FP32"));
    int64_t elements = 1;
    for (const int64_t d : tensor.shape()) elements *= d;
    FUZZ_CHECK(tensor.shape(0) == call.rows);
    FUZZ_CHECK(int64_t(response.raw_output_contents(i).size()) == elements * (ids ? 8 : 4));
  }
  return 0;
}
