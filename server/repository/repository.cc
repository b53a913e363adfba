#include "server/repository/repository.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

namespace fastformer::repository {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool parse_control_mode(const std::string& name, ControlMode* out) {
  if (name == "none")
    *out = ControlMode::kNone;
  else if (name == "explicit")
    *out = ControlMode::kExplicit;
  else if (name == "poll")
    *out = ControlMode::kPoll;
  else
    return false;
  return true;
}

const char* state_name(State state) {
  switch (state) {
    case State::kReady:
      return "READY";
    case State::kLoading:
      return "LOADING";
    case State::kUnloading:
      return "UNLOADING";
    case State::kUnavailable:
      return "UNAVAILABLE";
    case State::kUnknown:
      break;
  }
  return "UNKNOWN";
}

namespace {

// Runs `done` once, after every version it was attached to has been freed.
struct DoneWhenAll {
  Repository::Done done;
  int remaining = 0;
};

}  // namespace

Repository::Repository(RepositoryOptions options, metrics::Metrics& metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      pool_(std::make_unique<batching::ComputePool>()),
      budget_(std::make_shared<batching::QueueBudget>(options_.max_server_queue_tokens,
                                                      options_.max_server_bulk_queue_tokens)) {
  root_ = options_.root;
  worker_ = std::thread([this] { run(); });
  if (options_.mode == ControlMode::kPoll && options_.poll_secs > 0) {
    poller_ = std::thread([this] {
      std::unique_lock lock(mu_);
      while (!stopping_) {
        poll_cv_.wait_for(lock, std::chrono::duration<double>(options_.poll_secs));
        if (stopping_ || closed_) continue;
        tasks_.push_back([this] { rescan_now(); });
        cv_.notify_all();
      }
    });
  }
}

Repository::~Repository() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  poll_cv_.notify_all();
  if (poller_.joinable()) poller_.join();
  if (worker_.joinable()) worker_.join();
  close();
}

void Repository::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void Repository::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!tasks_.empty()) {
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      if (options_.on_change) options_.on_change();
      lock.lock();
      continue;
    }
    if (stopping_) return;
    const bool waiting = !retiring_.empty();
    lock.unlock();
    const bool more = waiting && reap();
    lock.lock();
    if (!tasks_.empty() || stopping_) continue;
    if (more)
      cv_.wait_for(lock, std::chrono::milliseconds(5));
    else
      cv_.wait(lock);
  }
}

bool Repository::reap() {
  std::vector<Retiring> freed;
  {
    std::lock_guard lock(mu_);
    for (auto it = retiring_.begin(); it != retiring_.end();) {
      // Only this list holds it, and nothing can take a new reference: it left the routing
      // table, and every request that held it has ended.
      if (it->served.use_count() == 1) {
        freed.push_back(std::move(*it));
        it = retiring_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Retiring& r : freed) {
    const std::string name = r.served->name, version = r.served->version;
    bool unloaded = false;  // the version itself is gone, not a replaced copy of it
    const int64_t number = r.served->version_number;
    r.served.reset();  // closes its queue, joins its lane, frees its engine and weights
    {
      std::lock_guard lock(mu_);
      auto model = models_.find(name);
      if (model == models_.end()) {
        transition_locked(name, number, nullptr, State::kUnavailable, "gone from the repository");
        unloaded = true;
      } else {
        auto v = model->second.versions.find(number);
        if (v != model->second.versions.end() && v->second.state == State::kUnloading &&
            v->second.served == nullptr) {
          transition_locked(name, number, &v->second, State::kUnavailable, "unloaded");
          unloaded = true;
        }
      }
    }
    if (unloaded) {
      spdlog::info("model {} version {} unloaded: its last request ended, its memory is freed",
                   name, version);
    } else {
      spdlog::info("model {} version {}: the copy it replaced is freed (its last request ended)",
                   name, version);
    }
    for (Done& done : r.done)
      if (done) done(Status());
  }
  if (!freed.empty() && options_.on_change) options_.on_change();
  std::lock_guard lock(mu_);
  return !retiring_.empty();
}

void Repository::transition_locked(const std::string& name, int64_t version, VersionRecord* r,
                                   State state, std::string reason) {
  if (r != nullptr) {
    r->state = state;
    r->reason = std::move(reason);
  }
  metrics_.set_model_state(name, std::to_string(version), state_name(state));
  if (options_.on_transition) options_.on_transition(name, version, state);
}

void Repository::set_state(const std::string& name, int64_t version, State state,
                           std::string reason, std::shared_ptr<const ServedModel> served) {
  std::lock_guard lock(mu_);
  VersionRecord& r = models_[name].versions[version];
  r.served = std::move(served);
  transition_locked(name, version, &r, state, std::move(reason));
}

void Repository::retire_locked(const std::string& name, int64_t version, Done done) {
  VersionRecord& r = models_[name].versions[version];
  if (!r.served) {
    if (done) done(Status());
    return;
  }
  transition_locked(name, version, &r, State::kUnloading, "");
  Retiring retiring;
  retiring.served = std::move(r.served);
  r.served = nullptr;
  retiring.done.push_back(std::move(done));
  retiring_.push_back(std::move(retiring));
  spdlog::info("model {} version {} leaves the routing table; freed once its requests end", name,
               version);
}

ServedModel::LoadContext Repository::load_context() const {
  return {metrics_,
          *pool_,
          budget_,
          options_.server_version,
          options_.before_compute,
          options_.on_batch_failure};
}

std::vector<std::string> Repository::model_names() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory(ec) && !name.empty() && name[0] != '.') out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Repository::fingerprint(const std::string& name) const {
  const fs::path dir = fs::path(root_) / name;
  std::string out = files_fingerprint(dir) + "|";
  for (const auto& [v, path] : version_dirs(dir))
    out += std::to_string(v) + "{" + files_fingerprint(path) + "}";
  return out;
}

std::string Repository::model_path(const std::string& name) const {
  if (!options_.model_dir.empty()) return options_.model_dir;
  std::lock_guard lock(mu_);
  auto m = models_.find(name);
  if (m != models_.end()) {
    for (auto it = m->second.versions.rbegin(); it != m->second.versions.rend(); ++it)
      if (it->second.served) return it->second.served->dir;
  }
  return (fs::path(root_) / name).string();
}

Status Repository::load_now(const std::string& name) {
  {
    std::lock_guard lock(mu_);
    if (closed_) return Status(StatusCode::kUnavailable, "the server is shutting down");
  }
  const fs::path dir = fs::path(root_) / name;
  std::error_code ec;
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.' ||
      !fs::is_directory(dir, ec)) {
    return Status(
        StatusCode::kNotFound,
        "model '" + name + "' is not in the repository (no directory " + dir.string() + ")");
  }
  metrics_.declare_model(name);
  const std::string print = fingerprint(name);
  ModelSettings settings;
  const auto present = version_dirs(dir);
  try {
    settings = read_settings(dir, name, options_.defaults);
  } catch (const std::exception& e) {
    const std::string why = e.what();
    for (const auto& [v, path] : present) {
      std::lock_guard lock(mu_);
      VersionRecord& r = models_[name].versions[v];
      if (r.state != State::kReady) transition_locked(name, v, &r, State::kUnavailable, why);
    }
    {
      std::lock_guard lock(mu_);
      models_[name].fingerprint = print;
    }
    metrics_.record_model_load(name, false, 0);
    spdlog::error("load of model {} failed: {}", name, why);
    return Status(StatusCode::kInvalidArgument, "failed to load model '" + name + "': " + why);
  }
  const std::set<int64_t> wanted = wanted_versions(settings.version_policy, present);
  if (wanted.empty()) {
    std::lock_guard lock(mu_);
    models_[name].fingerprint = print;
    const std::string why = present.empty()
                                ? "no version directory (a number, e.g. " + dir.string() + "/1)"
                                : "no version directory matches its version_policy";
    spdlog::error("load of model {} failed: {}", name, why);
    return Status(StatusCode::kInvalidArgument, "failed to load model '" + name + "': " + why);
  }
  // Load every wanted version that is not serving its current files; off the serving path.
  Loaded loaded;
  const Status failure = load_versions(name, wanted, present, settings, &loaded);
  std::lock_guard lock(mu_);
  return swap_locked(name, print, wanted, std::move(loaded), failure);
}

Status Repository::load_versions(const std::string& name, const std::set<int64_t>& wanted,
                                 const std::map<int64_t, std::string>& present,
                                 const ModelSettings& settings, Loaded* out) {
  Loaded& loaded = *out;
  Status failure;
  for (const int64_t v : wanted) {
    const std::string& path = present.at(v);
    const std::string files = files_fingerprint(path);
    {
      std::lock_guard lock(mu_);
      const VersionRecord& r = models_[name].versions[v];
      if (r.state == State::kReady && r.served && r.fingerprint == files) continue;
    }
    // The version's previous state (READY, if it serves) is kept in the table while the new
    // copy loads beside it; only the index shows LOADING.
    {
      std::lock_guard lock(mu_);
      VersionRecord& r = models_[name].versions[v];
      if (!r.served) transition_locked(name, v, &r, State::kLoading, "");
    }
    spdlog::info("loading model {} version {} from {}", name, v, path);
    try {
      loaded.emplace_back(v, ServedModel::load(name, v, path, settings, load_context()));
      loaded.back().second->fingerprint = files;
    } catch (const std::exception& e) {
      const std::string why = e.what();
      metrics_.record_model_load(name, false, 0);
      spdlog::error("load of model {} version {} failed: {}", name, v, why);
      {
        std::lock_guard lock(mu_);
        VersionRecord& r = models_[name].versions[v];
        // A version that serves stays READY (its old copy serves on: no state change, only
        // the reason says why the new one is not there).
        if (r.served)
          r.reason = "load failed: " + why;
        else
          transition_locked(name, v, &r, State::kUnavailable, "load failed: " + why);
      }
      failure = Status(StatusCode::kInternal, "failed to load model '" + name + "' version " +
                                                  std::to_string(v) + ": " + why);
      break;
    }
  }
  return failure;
}

Status Repository::swap_locked(const std::string& name, const std::string& print,
                               const std::set<int64_t>& wanted, Loaded loaded,
                               const Status& failure) {
  ModelRecord& model = models_[name];
  model.fingerprint = print;
  if (!failure.ok()) {
    // All or nothing: what was loaded for this attempt is dropped; what served, serves.
    for (auto& [v, served] : loaded) {
      VersionRecord& r = model.versions[v];
      if (!r.served)
        transition_locked(name, v, &r, State::kUnavailable, "not served: " + failure.message());
      Retiring retiring;
      retiring.served = std::move(served);
      retiring_.push_back(std::move(retiring));
    }
    cv_.notify_all();
    return failure;
  }
  // The swap: the new versions enter the routing table at once; the ones they replace (and
  // the versions the policy no longer serves) leave it, and are freed after their requests.
  for (auto& [v, served] : loaded) {
    VersionRecord& r = model.versions[v];
    if (r.served) {
      Retiring retiring;
      retiring.served = std::move(r.served);
      retiring_.push_back(std::move(retiring));
    }
    r.fingerprint = served->fingerprint;
    r.served = std::move(served);
    transition_locked(name, v, &r, State::kReady, "");
  }
  for (auto& [v, r] : model.versions) {
    if (!wanted.count(v) && r.served) {
      retire_locked(name, v, nullptr);
    } else if (!wanted.count(v) && r.state != State::kUnavailable && !r.served &&
               r.state != State::kUnloading) {
      transition_locked(name, v, &r, State::kUnavailable, "not in the version policy");
    }
  }
  expected_.insert(name);
  cv_.notify_all();
  return Status();
}

Status Repository::unload_now(const std::string& name, Done done) {
  std::unique_lock lock(mu_);
  // A model the server was started to serve stays expected: unloading it makes the server
  // unready until it is loaded again (it is what this instance is there to serve).
  if (!pinned_.count(name)) expected_.erase(name);
  auto m = models_.find(name);
  std::vector<int64_t> serving;
  if (m != models_.end()) {
    for (auto& [v, r] : m->second.versions)
      if (r.served) serving.push_back(v);
  }
  if (serving.empty()) {
    lock.unlock();
    done(Status());  // nothing loaded: unloaded already (as Triton answers)
    return Status();
  }
  auto all = std::make_shared<DoneWhenAll>();
  all->done = std::move(done);
  all->remaining = int(serving.size());
  for (const int64_t v : serving) {
    retire_locked(name, v, [all](const Status&) {
      if (--all->remaining == 0) all->done(Status());
    });
  }
  cv_.notify_all();
  return Status();
}

void Repository::rescan_now() {
  const std::vector<std::string> names = model_names();
  for (const std::string& name : names) {
    std::string known;
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      auto m = models_.find(name);
      if (m != models_.end()) known = m->second.fingerprint;
    }
    if (fingerprint(name) == known) continue;
    spdlog::info("repository poll: model {} is new or changed; loading", name);
    (void)load_now(name);  // a failure is logged and shown in the index
  }
  std::vector<std::string> gone;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, record] : models_)
      if (!std::binary_search(names.begin(), names.end(), name)) gone.push_back(name);
  }
  for (const std::string& name : gone) {
    spdlog::info("repository poll: model {} is gone from the repository; unloading", name);
    (void)unload_now(name, [](const Status&) {});
    std::lock_guard lock(mu_);
    auto m = models_.find(name);
    if (m != models_.end()) {
      bool any = false;
      for (const auto& [v, r] : m->second.versions) any |= r.served != nullptr;
      if (!any) models_.erase(m);  // drops out of the index once nothing of it serves
    }
  }
}

bool Repository::start(std::string* message) {
  if (!options_.model_dir.empty()) {
    try {
      std::shared_ptr<ServedModel> served =
          ServedModel::load("", 1, options_.model_dir, options_.defaults, load_context());
      served->fingerprint = files_fingerprint(options_.model_dir);
      const std::string name = served->name;
      metrics_.declare_model(name);
      set_state(name, 1, State::kReady, "", std::move(served));
      std::lock_guard lock(mu_);
      expected_.insert(name);
    } catch (const std::exception& e) {
      *message = e.what();
      return false;
    }
    return true;
  }
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) {
    *message = "--model-repository " + root_ + " is not a directory";
    return false;
  }
  std::vector<std::string> names;
  if (options_.mode == ControlMode::kExplicit) {
    for (const std::string& n : options_.load_models) {
      if (n == "*") {
        names = model_names();
        break;
      }
      names.push_back(n);
    }
  } else {
    names = model_names();
  }
  if (names.empty() && options_.mode != ControlMode::kExplicit) {
    *message = "--model-repository " + root_ + " holds no model directory (<model>/<version>/)";
    return false;
  }
  for (const std::string& name : names) {
    if (Status e = load_now(name); !e.ok()) {
      *message = e.message();
      return false;
    }
  }
  if (options_.mode == ControlMode::kExplicit) {
    std::lock_guard lock(mu_);
    pinned_.insert(names.begin(), names.end());
  }
  if (!options_.default_model.empty()) {
    std::lock_guard lock(mu_);
    if (!models_.count(options_.default_model) && options_.mode != ControlMode::kExplicit) {
      *message = "--default-model " + options_.default_model + " is not in the repository";
      return false;
    }
  }
  return true;
}

void Repository::serve(std::shared_ptr<ServedModel> served) {
  const std::string name = served->name;
  const int64_t version = served->version_number;
  set_state(name, version, State::kReady, "", std::move(served));
  std::lock_guard lock(mu_);
  expected_.insert(name);
}

void Repository::load(const std::string& name, Done done) {
  post([this, name, done = std::move(done)] { done(load_now(name)); });
}

void Repository::unload(const std::string& name, Done done) {
  post([this, name, done = std::move(done)]() mutable {
    if (Status e = unload_now(name, done); !e.ok()) done(e);
  });
}

void Repository::rescan() {
  post([this] { rescan_now(); });
}

void Repository::close() {
  std::vector<std::shared_ptr<const ServedModel>> all;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    for (auto& [name, m] : models_) {
      for (auto& [v, r] : m.versions) {
        if (r.served) all.push_back(std::move(r.served));
        r.served = nullptr;
      }
    }
    for (Retiring& r : retiring_) all.push_back(std::move(r.served));
    retiring_.clear();
  }
  // Every request has been answered: wait (briefly) for the last references the transports
  // hold to go, then free each version here, on this thread.
  const auto give_up = Clock::now() + std::chrono::seconds(2);
  for (auto& served : all) {
    while (served.use_count() > 1 && Clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    served.reset();
  }
}

}  // namespace fastformer::repository
