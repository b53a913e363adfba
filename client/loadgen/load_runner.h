// One step of a load run: closed loop (a fixed number of requests in flight) or open loop
// (requests sent on a schedule, never waiting for answers), over unary calls or streams.
//
// Timing. A step starts with `warmup_s` of warm-up, then measures for `duration_s`. A request
// belongs to the phase in which it was sent (open loop: in which it was scheduled); after the
// measured phase no request is sent, and the step waits for every answer. So every request sent
// is counted once, as a warm-up or a measured request, whenever its answer comes. Latency runs
// from the send (open loop: from the scheduled send time, also when the generator fell behind,
// so it is free of coordinated omission) to the answer; it is recorded for successful requests.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "client/loadgen/latency_histogram.h"
#include "client/loadgen/request_pool.h"
#include "fastformer/client.h"

namespace fastformer::loadgen {

struct LoadStep {
  bool open_loop = false;
  int concurrency = 1;  ///< closed loop: requests in flight; with `stream`: streams in both modes
  double rate = 0;      ///< open loop: requests per second
  bool poisson = true;  ///< open loop: exponential gaps (else constant ones)
  bool stream = false;  ///< EncodeStream instead of unary Encode
  double warmup_s = 0;
  double duration_s = 1;
  std::optional<Milliseconds> deadline;  ///< per request (unary) or added to a stream's length
  uint64_t seed = 1;                     ///< Poisson arrivals
};

struct StepResult {
  LoadStep step;
  double elapsed_s = 0;  ///< end of warm-up to the last measured answer (at least duration_s)
  int64_t requests = 0;  ///< measured requests answered, whatever the outcome
  int64_t succeeded = 0;
  int64_t sequences = 0;  ///< of the successful measured requests
  int64_t tokens = 0;     ///< of the successful measured requests
  int64_t warmup_requests = 0;
  std::map<std::string, int64_t> errors;  ///< measured failures by status code name
  std::map<std::string, int64_t> warmup_errors;
  LatencyHistogram latency;         ///< ns, successful measured requests
  LatencyHistogram server_queue;    ///< ns, from queue_time_us
  LatencyHistogram server_compute;  ///< ns, from compute_time_us
  int64_t max_send_lag_ns = 0;      ///< open loop: how far behind schedule a send went out
};

StepResult run_step(Client& client, const std::vector<PooledRequest>& pool, const LoadStep& step);

}  // namespace fastformer::loadgen
