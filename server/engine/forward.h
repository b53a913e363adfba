// The Fastformer forward graph over a ragged batch, written once over the Ops interface
// (forward.cc holds the graph only: the buffers' plan is workspace.cc, the profile
// profiling_ops.h).
#pragma once

#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "server/engine/engine.h"
#include "server/engine/ops.h"
#include "server/engine/ops_report.h"
#include "server/engine/prepared_weights.h"
#include "server/engine/profiling_ops.h"
#include "server/engine/workspace.h"

namespace fastformer::engine {

// A GEMM site of the graph as it ran: which Linear, with which operands' leading dimensions
// and epilogue (the GEMM probe of fastformer-bench times the same shapes alone).
struct GemmSite {
  const char* name;  ///< as the profile names the op, e.g. "qks_gemm"
  int layer;         ///< the encoder layer, -1 outside the layers
  const WeightRef* weight;
  int64_t lda, ldc;
  Epilogue epilogue;
  Activation act;
};

class ForwardEngine final : public Engine {
 public:
  ForwardEngine(std::shared_ptr<const Model> model, std::unique_ptr<Ops> ops,
                int64_t max_batch_tokens, std::string backend, std::string device,
                DtypeChoice dtype, OpsReport* report = nullptr, int64_t pass_tokens = 0);
  ~ForwardEngine() override;

  std::vector<EncodedSequence> encode(const RaggedBatch& batch,
                                      std::span<const OutputOptions> options) override {
    return encode_staged(batch, options, 0);
  }
  uint64_t stage(const RaggedBatch& batch) override;
  std::vector<EncodedSequence> encode_staged(const RaggedBatch& batch,
                                             std::span<const OutputOptions> options,
                                             uint64_t staged) override;
  std::string backend_name() const override { return backend_; }
  std::string device_name() const override { return device_; }
  const DtypeChoice& dtype() const override { return dtype_; }
  int64_t max_batch_tokens() const override { return max_batch_tokens_; }
  int64_t pass_tokens() const override { return pass_tokens_; }
  const Model& model() const override { return *model_; }
  std::pair<size_t, size_t> device_memory() const override { return ops_->device_memory(); }
  SpeedCheck speed_check() override;
  size_t packed_weight_bytes() const override;
  std::vector<std::string> gemm_report() const override;
  // The GEMM sites the batches so far ran, each (name, weight) once, in the order first run.
  const std::vector<GemmSite>& gemm_sites() const { return gemm_sites_; }
  void set_profiling(bool on) override;
  std::vector<OpProfile> profile() const override;

 private:
  struct LayerRefs {
    WeightRef query_key_scores, key_att, transform, attention_output, intermediate, output;
    const void* ln1_gamma;
    const void* ln1_beta;
    const void* ln2_gamma;
    const void* ln2_beta;
  };
  WeightRef upload(const PreparedLinear& linear);
  // encode() without turning the ops' failures into EngineError.
  std::vector<EncodedSequence> run(const RaggedBatch& batch, std::span<const OutputOptions> options,
                                   uint64_t staged);

  std::shared_ptr<const Model> model_;
  PreparedWeights prepared_;  // host copies the ops may serve in place
  std::unique_ptr<Ops> ops_;
  OpsReport* report_;  // the ops' own report (the CPU ops'), or null
  int64_t max_batch_tokens_;
  int64_t pass_tokens_;             // a batch of more tokens runs in passes of whole sequences
  std::vector<int32_t> pass_ends_;  // the current batch's passes (plan_passes)
  size_t reserved_bytes_ = 0;       // the workspace reserved for the largest batch
  PoolingChunks chunks_;  // the current batch's; kept so asynchronous copies read stable memory
  // The current batch's spans per pooling mode (kModel, kMean) and each plan row's span.
  PoolingChunks span_chunks_[2];
  std::vector<int32_t> span_owners_[2];
  std::string backend_, device_;
  DtypeChoice dtype_;
  const void* word_embedding_ = nullptr;
  const void* position_embeddings_ = nullptr;
  const void* embedding_ln_gamma_ = nullptr;
  const void* embedding_ln_beta_ = nullptr;
  std::vector<LayerRefs> layers_;
  WeightRef pooler_fc1_, pooler_fc2_, classifier_;
  std::unique_ptr<ProfilingOps> profiling_;  // over ops_; null while profiling is off
  std::vector<GemmSite> gemm_sites_;
  std::set<std::pair<const char*, const void*>> site_keys_;  // (name, weight) of gemm_sites_
};

}  // namespace fastformer::engine
