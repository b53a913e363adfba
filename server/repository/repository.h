// The model repository: every model version the server knows, its state, and the routing
// table the protocols look models up in (docs/operations.md: the model repository).
//
// Its rooms: layout.h (the files), settings.h, served_model.h (a version and its assembly),
// this file (the state table), routing.cc (find, aliases, the index).
//
// Layout (Triton's): <root>/<model>/<version>/ holds one model directory (config.json,
// model.safetensors, optional tokenizer.json); versions are directories named by a number
// that does not start with 0, anything else is ignored; <root>/<model>/config.pbtxt, when
// present, is an inference.ModelConfig in protobuf text format (layout.h). --model-dir is
// a repository of one model, named by its config.json, version "1".
//
// Loads, unloads and rescans run one at a time on the repository's own thread, off the serving
// path: a new version is loaded and warmed up, then swapped into the routing table at once; the
// versions it replaces leave the table and are freed when their last request has ended.
// A load fails as a whole: the versions serving before keep serving.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "server/batching/scheduler.h"
#include "server/metrics/metrics.h"
#include "server/repository/layout.h"
#include "server/repository/served_model.h"

namespace fastformer::repository {

enum class ControlMode { kNone, kExplicit, kPoll };
// "none", "explicit", "poll"; false for anything else.
bool parse_control_mode(const std::string& name, ControlMode* out);

enum class State { kUnknown, kReady, kLoading, kUnloading, kUnavailable };
const char* state_name(State state);  // "UNKNOWN", "READY", ...

struct IndexEntry {
  std::string name, version;
  State state = State::kUnknown;
  std::string reason;
};

struct RepositoryOptions {
  std::string root;       ///< --model-repository (empty with model_dir)
  std::string model_dir;  ///< --model-dir: a repository of this one model
  ControlMode mode = ControlMode::kNone;
  std::vector<std::string> load_models;  ///< --load-model (explicit mode); "*" = all
  double poll_secs = 15;                 ///< --repository-poll-secs (poll mode); 0: SIGHUP only
  std::string default_model;             ///< --default-model
  /// --served-model-name: names that mean the default model besides its own, on every protocol.
  std::vector<std::string> aliases;
  ModelSettings defaults;                    ///< the server's flags, before config.pbtxt
  int64_t max_server_queue_tokens = 0;       ///< --max-queue-tokens, over every model
  int64_t max_server_bulk_queue_tokens = 0;  ///< --max-bulk-queue-tokens, likewise (0: the same)
  std::string server_version;
  /// Test-only fault injection for every model's scheduler (FASTFORMER_TEST_FAULTS).
  std::function<void(const batching::Batch&)> before_compute;
  /// The engine's batch-failure log, and ModelStatistics.execution_count, per batch.
  std::function<void(const std::string& model, const std::string& reason, int64_t sequences)>
      on_batch_failure;
  /// After each load, unload or rescan (on the operations thread): readiness may have changed.
  std::function<void()> on_change;
  /// Every state change of a version, as it happens (under the repository's lock: it must not
  /// call back into the repository). Tests watch the transitions through it.
  std::function<void(const std::string& model, int64_t version, State state)> on_transition;
};

class Repository {
 public:
  Repository(RepositoryOptions options, metrics::Metrics& metrics);
  ~Repository();  // stops the operations thread; close() first to drain the models

  // Loads what the control mode serves at start (every model, or --load-model's), on the
  // calling thread. False, with `error` naming the model, version and cause, when one fails
  // or none is found: the server does not start (as Triton's --exit-on-error).
  bool start(std::string* error);

  // Serves a model version built elsewhere (tests and fuzzers: no files), READY at once.
  void serve(std::shared_ptr<ServedModel> served);

  // The version of `name` that serves `version` (empty: the newest READY one). `name` empty
  // or one of options.aliases: the default model (--default-model, or the only model). Null
  // with `error` set otherwise. The one naming rule of every protocol.
  std::shared_ptr<const ServedModel> find(const std::string& name, const std::string& version,
                                          Status* error) const;
  // Every READY version, by name then version.
  std::vector<std::shared_ptr<const ServedModel>> serving() const;
  // The names find() serves: every model with a READY version, then the aliases.
  std::vector<std::string> served_names() const;

  // Whether every model this server serves has a READY version: the ones it was started with
  // (in explicit mode even once unloaded: it is unready until they are loaded again) and the
  // ones loaded since; in poll mode, what the repository holds.
  bool ready() const;

  std::vector<IndexEntry> index(bool ready_only) const;

  // Explicit mode: loads (or reloads) `name` by its version policy, then calls `done` with
  // OK or the error (NOT_FOUND, UNAVAILABLE, INVALID_ARGUMENT, FAILED_PRECONDITION or
  // INTERNAL); the swap happens before `done`. Runs on the operations thread.
  using Done = std::function<void(const Status&)>;
  void load(const std::string& name, Done done);
  // Explicit mode: takes `name` out of the routing table, and calls `done` once its admitted
  // requests have ended and it is freed.
  void unload(const std::string& name, Done done);
  // Poll mode (and SIGHUP): rescans the repository; loads new and changed models and versions,
  // unloads removed ones. Returns at once.
  void rescan();

  ControlMode mode() const { return options_.mode; }
  const std::string& root() const { return root_; }
  // Where model `name`'s files are (its version directory's parent, or --model-dir).
  std::string model_path(const std::string& name) const;

  // For the drain: no more loads; every model's queue closes and its scheduler joins once its
  // requests ran. Call once no request is in flight.
  void close();

 private:
  struct VersionRecord {
    State state = State::kUnknown;
    std::string reason;
    std::shared_ptr<const ServedModel> served;  // set while READY
    std::string fingerprint;                    // of the files `served` loaded
  };
  struct ModelRecord {
    std::map<int64_t, VersionRecord> versions;  // by version number
    std::string fingerprint;  // what the last scan saw (version directories, config.pbtxt)
  };
  struct Retiring {
    std::shared_ptr<const ServedModel> served;
    std::vector<Done> done;
  };

  // Operations thread.
  void post(std::function<void()> task);
  void run();
  // Frees the retiring versions no request holds any more; true when some remain.
  bool reap();
  Status load_now(const std::string& name);
  // load_now's parts: the wanted versions loaded one by one, stopping at the first failure
  // (returned; the versions loaded before it in `out`), then, under mu_, all or nothing: on a
  // failure what was loaded is dropped and what served serves on; else the swap (the new
  // versions in, the ones they replace and those out of the policy retired).
  using Loaded = std::vector<std::pair<int64_t, std::shared_ptr<ServedModel>>>;
  Status load_versions(const std::string& name, const std::set<int64_t>& wanted,
                       const std::map<int64_t, std::string>& present, const ModelSettings& settings,
                       Loaded* out);
  Status swap_locked(const std::string& name, const std::string& print,
                     const std::set<int64_t>& wanted, Loaded loaded, const Status& failure);
  Status unload_now(const std::string& name, Done done);
  void rescan_now();
  // What ServedModel::load needs from this repository.
  ServedModel::LoadContext load_context() const;
  // Every state change of a version goes through here: its record's state and reason and
  // fastformer_model_state change together (and options_.on_transition hears of it). Under
  // mu_. `r` null: a version whose model left the repository (no record: the metric only).
  void transition_locked(const std::string& name, int64_t version, VersionRecord* r, State state,
                         std::string reason);
  // transition_locked under the lock, with the version's served copy set.
  void set_state(const std::string& name, int64_t version, State state, std::string reason,
                 std::shared_ptr<const ServedModel> served = nullptr);
  // Moves a version out of the routing table into retirement; under mu_.
  void retire_locked(const std::string& name, int64_t version, Done done);
  std::vector<std::string> model_names() const;  // the repository's model directories
  std::string fingerprint(const std::string& name) const;

  const RepositoryOptions options_;
  std::string root_;
  metrics::Metrics& metrics_;
  std::unique_ptr<batching::ComputePool> pool_;
  std::shared_ptr<batching::QueueBudget> budget_;  // --max-queue-tokens over every model

  mutable std::mutex mu_;  // guards models_, retiring_, expected_, closed_, tasks_
  std::map<std::string, ModelRecord> models_;
  std::set<std::string> expected_;  // what ready() waits for
  std::set<std::string> pinned_;    // explicit mode's start models: expected even once unloaded
  std::vector<Retiring> retiring_;
  std::deque<std::function<void()>> tasks_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool closed_ = false;
  std::thread worker_;
  std::thread poller_;
  std::condition_variable poll_cv_;
};

}  // namespace fastformer::repository
