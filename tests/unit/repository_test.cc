// The model repository (server/repository): version directories and config.pbtxt as Triton
// reads them, the version policies, and the repository itself on tiny CPU models: explicit
// loads, swaps under concurrent requests (every request ends OK on the version it was admitted
// to, run under ThreadSanitizer by make test-tsan), a broken version that leaves the serving one
// untouched, the memory check, and an unload that waits for its requests.
#include "server/repository/repository.h"

#include <gtest/gtest.h>
#include <prometheus/metric_family.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/support/test_models.h"

namespace fastformer::repository {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using namespace std::chrono_literals;

ModelSettings defaults() {
  ModelSettings s;
  s.backend = "cpu";
  s.dtype = engine::Dtype::kFloat32;
  s.threads = 1;
  s.max_batch_tokens = 256;
  s.max_batch_sequences = 8;
  s.max_queue_delay_us = 500;
  s.max_queue_tokens = 1 << 16;
  s.max_request_inputs = 64;
  return s;
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

TEST(RepositorySettingsTest, VersionDirectoriesAreNumbersNotStartingWithZero) {
  EXPECT_EQ(version_number("1"), 1);
  EXPECT_EQ(version_number("42"), 42);
  EXPECT_FALSE(version_number("0"));
  EXPECT_FALSE(version_number("01"));
  EXPECT_FALSE(version_number("v1"));
  EXPECT_FALSE(version_number(""));
  TempDir dir;
  for (const char* d : {"1", "3", "0", "007", "latest"}) fs::create_directories(dir.path() / d);
  write_text(dir.path() / "2", "a file, not a version directory");
  const auto versions = version_dirs(dir.path());
  ASSERT_EQ(versions.size(), 2u);
  EXPECT_EQ(versions.begin()->first, 1);
  EXPECT_EQ(versions.rbegin()->first, 3);
}

TEST(RepositorySettingsTest, VersionPolicies) {
  const std::map<int64_t, std::string> present{{1, "a"}, {2, "b"}, {5, "c"}};
  inference::ModelVersionPolicy policy;  // none set: latest 1
  EXPECT_EQ(wanted_versions(policy, present), (std::set<int64_t>{5}));
  policy.mutable_latest()->set_num_versions(2);
  EXPECT_EQ(wanted_versions(policy, present), (std::set<int64_t>{2, 5}));
  policy.mutable_all();
  EXPECT_EQ(wanted_versions(policy, present), (std::set<int64_t>{1, 2, 5}));
  policy.mutable_specific()->add_versions(1);
  policy.mutable_specific()->add_versions(4);  // not present: left out
  EXPECT_EQ(wanted_versions(policy, present), (std::set<int64_t>{1}));
}

TEST(RepositorySettingsTest, ConfigPbtxtOverridesTheFlags) {
  TempDir dir;
  EXPECT_EQ(read_settings(dir.path(), "m", defaults()).max_batch_sequences, 8);  // no file
  write_text(dir.path() / "config.pbtxt", R"(
    name: "m"
    max_batch_size: 4
    version_policy: { latest: { num_versions: 2 } }
    dynamic_batching { max_queue_delay_microseconds: 2000 }
    instance_group [ { kind: KIND_CPU count: 1 } ]
    parameters { key: "dtype" value: { string_value: "bfloat16" } }
    parameters { key: "cpu_gemm" value: { string_value: "amx" } }
    parameters { key: "max_batch_tokens" value: { string_value: "512" } }
    parameters { key: "max_queue_tokens" value: { string_value: "4096" } }
  )");
  const ModelSettings s = read_settings(dir.path(), "m", defaults());
  EXPECT_EQ(s.max_batch_sequences, 4);
  EXPECT_EQ(s.max_queue_delay_us, 2000);
  EXPECT_EQ(s.backend, "cpu");
  EXPECT_EQ(s.dtype, engine::Dtype::kBfloat16);
  EXPECT_EQ(s.cpu_gemm, engine::CpuGemm::kAmx);
  EXPECT_EQ(s.engine_options(engine::ModelConfig{}).cpu_gemm, engine::CpuGemm::kAmx);
  EXPECT_EQ(s.max_batch_tokens, 512);
  EXPECT_EQ(s.max_queue_tokens, 4096);
  EXPECT_EQ(s.version_policy.latest().num_versions(), 2u);
}

TEST(RepositorySettingsTest, AConfigPbtxtErrorNamesTheFileAndTheField) {
  TempDir dir;
  const fs::path file = dir.path() / "config.pbtxt";
  auto why = [&](const std::string& text) {
    write_text(file, text);
    return test::error_of<std::invalid_argument>(
        [&] { read_settings(dir.path(), "m", defaults()); });
  };
  EXPECT_NE(why("max_batch_sizes: 4").find("max_batch_sizes"), std::string::npos);
  EXPECT_NE(why("max_batch_sizes: 4").find(file.string()), std::string::npos);
  EXPECT_NE(why("name: \"other\"").find("is not the model's directory name"), std::string::npos);
  EXPECT_NE(why(R"(parameters { key: "colour" value: { string_value: "red" } })").find("colour"),
            std::string::npos);
  EXPECT_NE(why(R"(parameters { key: "max_batch_tokens" value: { string_value: "-3" } })")
                .find("positive integer"),
            std::string::npos);
  EXPECT_NE(why("version_policy: { latest: { num_versions: 0 } }").find("num_versions"),
            std::string::npos);
  EXPECT_NE(why(R"(parameters { key: "dtype" value: { string_value: "float64" } })")
                .find("\"float64\" is not auto, float32, float16 or bfloat16"),
            std::string::npos);
  EXPECT_NE(why(R"(parameters { key: "cpu_gemm" value: { string_value: "tiles" } })")
                .find("parameters \"cpu_gemm\": \"tiles\" is not auto, onednn or amx"),
            std::string::npos);
}

// A model's dtype: auto unless the flags or its config.pbtxt name one; a config may pin float32
// under a server that picks, or say auto under one started with a dtype.
TEST(RepositorySettingsTest, TheDtypeIsAutoUnlessNamed) {
  EXPECT_EQ(ModelSettings{}.dtype, engine::Dtype::kAuto);
  TempDir dir;
  const auto dtype_in_config = [&](const char* name, engine::Dtype flags) {
    write_text(
        dir.path() / "config.pbtxt",
        std::string(R"(parameters { key: "dtype" value: { string_value: ")") + name + "\" } }");
    ModelSettings from_flags = defaults();
    from_flags.dtype = flags;
    return read_settings(dir.path(), "m", from_flags).dtype;
  };
  EXPECT_EQ(dtype_in_config("float32", engine::Dtype::kAuto), engine::Dtype::kFloat32);
  EXPECT_EQ(dtype_in_config("auto", engine::Dtype::kFloat32), engine::Dtype::kAuto);
}

// The one settings struct hands each part its options: nothing is copied field by field.
TEST(RepositorySettingsTest, SettingsHandOutEachPartsOptions) {
  ModelSettings s = defaults();  // max_batch_tokens 256, 8 sequences, 500 us, 65536 queued
  s.dtype = engine::Dtype::kBfloat16;
  engine::ModelConfig model;
  model.max_position_embeddings = 1024;
  EXPECT_EQ(s.request_tokens(model), 1024);  // 0: max(max_batch_tokens, positions)
  const request::Limits limits = s.request_limits(model);
  EXPECT_EQ(limits.max_request_tokens, 1024);
  EXPECT_EQ(limits.max_request_inputs, 64);
  const engine::EngineOptions engine = s.engine_options(model);
  EXPECT_EQ(engine.backend, engine::Backend::kCpu);
  EXPECT_EQ(engine.dtype, engine::Dtype::kBfloat16);
  EXPECT_EQ(engine.threads, 1);
  EXPECT_EQ(engine.max_batch_tokens, 1024);  // the longest request runs in a batch of its own
  s.max_request_tokens = 100;
  EXPECT_EQ(s.engine_options(model).max_batch_tokens, 256);
  const batching::QueueLimits queue = s.queue_limits();
  EXPECT_EQ(queue.max_batch_tokens, 256);
  EXPECT_EQ(queue.max_batch_sequences, 8);
  EXPECT_EQ(queue.max_queue_tokens, 1 << 16);
  EXPECT_EQ(queue.max_queue_delay, std::chrono::microseconds(500));
  s.backend = "tpu";
  EXPECT_THROW(s.engine_options(model), std::invalid_argument);
}

TEST(RepositorySettingsTest, LabelsComeFromId2LabelElseLabelsJson) {
  TempDir dir;
  EXPECT_TRUE(read_labels(dir.path()).empty());  // neither file
  write_text(dir.path() / "labels.json", R"({"labels": ["neg", "pos"]})");
  EXPECT_EQ(read_labels(dir.path()), (std::vector<std::string>{"neg", "pos"}));
  write_text(dir.path() / "config.json", R"({"id2label": {"1": "b", "0": "a", "x": "skip"}})");
  EXPECT_EQ(read_labels(dir.path()), (std::vector<std::string>{"a", "b"}));  // id2label first
  write_text(dir.path() / "config.json", "not json");
  EXPECT_EQ(read_labels(dir.path()), (std::vector<std::string>{"neg", "pos"}));
  ServedModel served;
  served.config.labels = {"a", ""};
  EXPECT_EQ(served.label(0), "a");
  EXPECT_EQ(served.label(1), "LABEL_1");  // unnamed: as Hugging Face names it
  EXPECT_EQ(served.label(7), "LABEL_7");
}

// The metrics' priority label values are the batching layer's class names, in its order; and a
// config.pbtxt sets a model's classes.
TEST(RepositorySettingsTest, PriorityClassesNamesAndSettings) {
  for (batching::Priority p : {batching::Priority::kInteractive, batching::Priority::kBulk})
    EXPECT_STREQ(metrics::kPriorityNames[int(p)], batching::priority_name(p));
  TempDir dir;
  write_text(dir.path() / "config.pbtxt",
             R"(parameters { key: "default_priority" value { string_value: "bulk" } }
parameters { key: "max_bulk_queue_tokens" value { string_value: "4096" } }
parameters { key: "bulk_promote_after_ms" value { string_value: "250" } }
parameters { key: "mixed_batch_tokens" value { string_value: "100" } }
parameters { key: "bulk_timeout_ms" value { string_value: "9000" } })");
  const ModelSettings s = read_settings(dir.path(), "m", defaults());
  EXPECT_EQ(s.default_priority, batching::Priority::kBulk);
  const batching::QueueLimits limits = s.queue_limits();
  EXPECT_EQ(limits.class_limit(batching::Priority::kBulk), 4096);
  EXPECT_EQ(limits.class_limit(batching::Priority::kInteractive), s.max_queue_tokens);
  EXPECT_EQ(limits.bulk_promote_after, std::chrono::milliseconds(250));
  EXPECT_EQ(limits.bulk_fill_tokens(), 100);
  EXPECT_EQ(s.default_timeout_ms(batching::Priority::kBulk), 9000);
  EXPECT_EQ(s.default_timeout_ms(batching::Priority::kInteractive), 0);
  // Triton's dynamic_batching levels choose the default too: 1 interactive, 2 and more bulk.
  write_text(dir.path() / "config.pbtxt",
             R"(dynamic_batching { priority_levels: 3 default_priority_level: 3 })");
  EXPECT_EQ(read_settings(dir.path(), "m", defaults()).default_priority, batching::Priority::kBulk);
  write_text(dir.path() / "config.pbtxt",
             R"(dynamic_batching { priority_levels: 2 default_priority_level: 1 })");
  EXPECT_EQ(read_settings(dir.path(), "m", defaults()).default_priority,
            batching::Priority::kInteractive);
  write_text(dir.path() / "config.pbtxt",
             R"(dynamic_batching { priority_levels: 2 default_priority_level: 3 })");
  EXPECT_NE(test::error_of<std::invalid_argument>([&] {
              read_settings(dir.path(), "m", defaults());
            }).find("dynamic_batching default_priority_level 3 is above priority_levels 2"),
            std::string::npos);
  write_text(dir.path() / "config.pbtxt",
             R"(parameters { key: "default_priority" value { string_value: "urgent" } })");
  try {
    read_settings(dir.path(), "m", defaults());
    ADD_FAILURE() << "accepted default_priority urgent";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"urgent\" is not interactive or bulk"),
              std::string::npos)
        << e.what();
  }
}

// quantization.json: none is null (int8 refused later, naming the file); a good one gives its
// ranges; a malformed one stops the version's load with a message naming the file and the fault.
// Prompts (issue 49): sentence-transformers' file beside the weights, replaced by config.pbtxt's
// "prompts" parameter; a broken one stops the load naming where it is.
TEST(RepositorySettingsTest, PromptsComeFromTheFileOrConfigPbtxt) {
  TempDir dir;
  EXPECT_EQ(read_prompts(dir.path(), ""), nullptr);
  write_text(dir.path() / "config_sentence_transformers.json",
             R"({"prompts": {"query": "query: ", "document": "passage: "},
                 "default_prompt_name": "query", "similarity_fn_name": "cosine"})");
  auto p = read_prompts(dir.path(), "");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->by_name.at("document"), "passage: ");
  EXPECT_EQ(p->default_name, "query");
  // config.pbtxt's parameter, as read_settings keeps it, wins over the file.
  write_text(dir.path() / "config.pbtxt",
             "parameters { key: \"prompts\" value: { string_value: "
             "\"{\\\"prompts\\\": {\\\"q\\\": \\\"search: \\\"}}\" } }\n");
  const ModelSettings s = read_settings(dir.path(), "m", defaults());
  p = read_prompts(dir.path(), s.prompts);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->names(), "'q'");
  EXPECT_FALSE(p->default_name);
  // Broken: refused at load, naming the file (or the parameter) and what is wrong.
  write_text(dir.path() / "config_sentence_transformers.json", R"({"prompts": {"query": 5}})");
  try {
    read_prompts(dir.path(), "");
    ADD_FAILURE() << "a prompt that is not a string was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("config_sentence_transformers.json: prompts \"query\" "
                                         "must be a string"),
              std::string::npos)
        << e.what();
  }
  write_text(dir.path() / "config.pbtxt",
             "parameters { key: \"prompts\" value: { string_value: \"[1]\" } }\n");
  try {
    read_settings(dir.path(), "m", defaults());
    ADD_FAILURE() << "a prompts parameter that is not an object was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parameters \"prompts\": is not a JSON object"),
              std::string::npos)
        << e.what();
  }
}

TEST(RepositorySettingsTest, QuantizationJsonIsReadOrRefusedByName) {
  TempDir dir;
  EXPECT_EQ(read_quantization(dir.path(), 8), nullptr);
  const fs::path file = dir.path() / "quantization.json";
  write_text(file, R"({"ranges": [{"dimensions": 2, "min": [-1, 0], "max": [1, 0.5]},
                                  {"dimensions": 2, "normalized": false, "min": [0, 0], "max": [4, 4]}]})");
  const auto q = read_quantization(dir.path(), 8);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->file, file.string());
  ASSERT_NE(q->find(2, true), nullptr);
  EXPECT_EQ(q->find(2, true)->max, (std::vector<float>{1.0f, 0.5f}));
  EXPECT_EQ(q->find(2, false)->max, (std::vector<float>{4.0f, 4.0f}));
  EXPECT_EQ(q->find(4, true), nullptr);
  auto refused = [&](const std::string& text, const std::string& needle) {
    write_text(file, text);
    try {
      read_quantization(dir.path(), 8);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(file.string()), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  };
  refused("not json", "is not a JSON object");
  refused(R"({"ranges": {}})", "\"ranges\" must be a list");
  refused(R"({"ranges": [{"dimensions": 9, "min": [], "max": []}]})", "in [1, hidden_size 8]");
  refused(R"({"ranges": [{"dimensions": 2, "min": [0], "max": [1, 1]}]})",
          "ranges[0].min must be a list of 2 numbers");
  refused(R"({"ranges": [{"dimensions": 1, "min": [2], "max": [1]}]})",
          "dimension 0 has min 2.000000 above max 1.000000");
  refused(R"({"ranges": [{"dimensions": 1, "min": [0], "max": [1]},
                         {"dimensions": 1, "min": [0], "max": [2]}]})",
          "ranges[1] repeats");
}

// A repository of model "m" on disk, versions written by seed.
struct Fixture {
  TempDir dir;
  metrics::Metrics metrics;
  fs::path root() const { return dir.path() / "repo"; }
  void add_version(int version, uint64_t seed) {
    test::TinyModelSpec spec;
    spec.seed = seed;
    spec.max_positions = 64;
    test::write_tiny_model(root() / "m", std::to_string(version), spec);
  }
  RepositoryOptions options(ControlMode mode = ControlMode::kExplicit) const {
    RepositoryOptions o;
    o.root = root().string();
    o.mode = mode;
    o.load_models = {"m"};
    o.defaults = defaults();
    o.max_server_queue_tokens = 1 << 16;
    o.server_version = "test";
    return o;
  }
};

// Nothing when the load succeeded, else why it failed.
std::optional<Status> load(Repository& r, const std::string& name) {
  std::promise<std::optional<Status>> done;
  r.load(name, [&](const Status& e) { done.set_value(e.ok() ? std::nullopt : std::optional(e)); });
  return done.get_future().get();
}

// What a job here holds, as the intake's Admitted does: the version it was admitted to.
struct HeldVersion final : batching::KeepAlive {
  std::shared_ptr<const ServedModel> served;
};

// One request of one sequence on `served`'s queue, as the intake admits it.
std::shared_ptr<batching::Job> submit(const std::shared_ptr<const ServedModel>& served,
                                      std::vector<int32_t>& ids, std::atomic<int>& ok,
                                      std::atomic<int>& failed) {
  auto request = std::make_shared<batching::Job>();
  request->sequences.push_back({ids, {}});
  auto held = std::make_shared<HeldVersion>();
  held->served = served;
  request->keep = held;
  const std::string version = served->version;
  request->on_complete = [&ok, &failed, version](batching::Job& r) {
    const auto* held = dynamic_cast<const HeldVersion*>(r.keep.get());
    const bool right = r.outcome == batching::Outcome::kOk && r.results.size() == 1 &&
                       held != nullptr && held->served->version == version;
    (right ? ok : failed).fetch_add(1);
    r.keep.reset();
  };
  EXPECT_EQ(served->queue->push(request), batching::Admission::kAdmitted);
  return request;
}

TEST(RepositoryTest, SwapsVersionsWhileRequestsRunAndLosesNone) {
  Fixture f;
  f.add_version(1, 1);
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::vector<int32_t>> storage(3);  // the requests' ids: outlive the repository
  Repository repository(f.options(), f.metrics);
  std::string why;
  ASSERT_TRUE(repository.start(&why)) << why;
  Status e;
  ASSERT_TRUE(repository.find("m", "", &e));
  EXPECT_EQ(repository.find("m", "", &e)->version, "1");
  EXPECT_TRUE(repository.ready());

  std::atomic<bool> stop{false};
  std::atomic<int> refused{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t) {
    storage[size_t(t)].assign(size_t(5 + t), 7);
    clients.emplace_back([&, t] {
      std::vector<int32_t>& ids = storage[size_t(t)];
      while (!stop.load()) {
        Status error;
        auto served = repository.find("", "", &error);  // the only model: "m"
        if (!served) {
          refused.fetch_add(1);
          continue;
        }
        submit(served, ids, ok, failed);
        std::this_thread::sleep_for(200us);
      }
    });
  }
  for (int v = 2; v <= 5; ++v) {
    std::this_thread::sleep_for(20ms);
    f.add_version(v, uint64_t(v));
    ASSERT_FALSE(load(repository, "m")) << "version " << v;
    EXPECT_EQ(repository.find("m", "", &e)->version, std::to_string(v));
    EXPECT_FALSE(repository.find("m", std::to_string(v - 1), &e));  // latest 1: swapped out
  }
  std::this_thread::sleep_for(20ms);
  stop = true;
  for (auto& t : clients) t.join();
  // Every version but the last is freed once its requests end (the clients' backlog drains
  // first: seconds under ThreadSanitizer).
  for (const auto give_up = std::chrono::steady_clock::now() + 60s;
       std::chrono::steady_clock::now() < give_up;) {
    int unloaded = 0;
    for (const IndexEntry& entry : repository.index(false))
      unloaded += entry.state == State::kUnavailable && entry.reason == "unloaded";
    if (unloaded == 4) break;
    std::this_thread::sleep_for(5ms);
  }
  const auto index = repository.index(false);
  ASSERT_EQ(index.size(), 5u);
  for (const IndexEntry& entry : index) {
    if (entry.version == "5") {
      EXPECT_EQ(entry.state, State::kReady);
    } else {
      EXPECT_EQ(entry.state, State::kUnavailable) << entry.version;
      EXPECT_EQ(entry.reason, "unloaded");
    }
  }
  repository.close();
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(refused.load(), 0);  // the routing table always had a READY version
}

TEST(RepositoryTest, ABrokenVersionLeavesTheServingOneUntouched) {
  Fixture f;
  f.add_version(1, 1);
  Repository repository(f.options(), f.metrics);
  std::string why;
  ASSERT_TRUE(repository.start(&why)) << why;
  fs::create_directories(f.root() / "m" / "2");
  fs::copy_file(f.root() / "m" / "1" / "config.json", f.root() / "m" / "2" / "config.json");
  write_text(f.root() / "m" / "2" / "model.safetensors", "truncated");
  const std::optional<Status> failure = load(repository, "m");
  ASSERT_TRUE(failure);
  EXPECT_NE(failure->message().find("version 2"), std::string::npos) << failure->message();
  Status e;
  ASSERT_TRUE(repository.find("m", "", &e));
  EXPECT_EQ(repository.find("m", "", &e)->version, "1");
  for (const IndexEntry& entry : repository.index(false)) {
    if (entry.version == "2") {
      EXPECT_EQ(entry.state, State::kUnavailable);
      EXPECT_NE(entry.reason.find("load failed"), std::string::npos) << entry.reason;
    } else {
      EXPECT_EQ(entry.state, State::kReady);
    }
  }
  EXPECT_FALSE(repository.find("m", "2", &e));
  EXPECT_EQ(e.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(repository.find("m", "9", &e));
  EXPECT_EQ(e.code(), StatusCode::kNotFound);
  EXPECT_FALSE(repository.find("other", "", &e));
  EXPECT_EQ(e.code(), StatusCode::kNotFound);
  EXPECT_NE(e.message().find("'other'"), std::string::npos);
}

TEST(RepositoryTest, ASecondCopyThatDoesNotFitInMemoryIsNotLoaded) {
  Fixture f;
  f.add_version(1, 1);
  Repository repository(f.options(), f.metrics);
  std::string why;
  ASSERT_TRUE(repository.start(&why)) << why;
  f.add_version(2, 2);
  setenv("FASTFORMER_TEST_AVAILABLE_MEMORY_BYTES", "1000", 1);
  const std::optional<Status> failure = load(repository, "m");
  unsetenv("FASTFORMER_TEST_AVAILABLE_MEMORY_BYTES");
  ASSERT_TRUE(failure);
  EXPECT_NE(failure->message().find("not enough memory"), std::string::npos) << failure->message();
  Status e;
  EXPECT_EQ(repository.find("m", "", &e)->version, "1");
}

// fastformer_model_state{model="m", version} as the registry holds it: the state whose series
// is 1 ("" when none is, "several" when more than one is).
std::string metric_state(const metrics::Metrics& metrics, const std::string& version) {
  std::string found;
  for (const prometheus::MetricFamily& family : metrics.registry()->Collect()) {
    if (family.name != "fastformer_model_state") continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      std::map<std::string, std::string> labels;
      for (const prometheus::ClientMetric::Label& l : m.label) labels[l.name] = l.value;
      if (labels["model"] != "m" || labels["version"] != version || m.gauge.value != 1) continue;
      found = found.empty() ? labels["state"] : "several";
    }
  }
  return found;
}

// Every state a version goes through (start-up load, a swap, a failed load, an unload) comes
// through one transition: the index and fastformer_model_state agree after each step, and the
// transitions seen are exactly the ones the steps make.
TEST(RepositoryTest, EveryTransitionMovesTheStateMetric) {
  Fixture f;
  f.add_version(1, 1);
  std::mutex mu;
  std::vector<std::string> seen;  // "version:STATE", in order
  RepositoryOptions options = f.options();
  options.on_transition = [&](const std::string& model, int64_t version, State state) {
    std::lock_guard lock(mu);
    seen.push_back(model + "/" + std::to_string(version) + ":" + state_name(state));
  };
  Repository repository(options, f.metrics);
  auto agree = [&](const char* step) {
    for (const IndexEntry& e : repository.index(false)) {
      EXPECT_EQ(metric_state(f.metrics, e.version), state_name(e.state))
          << step << ": version " << e.version << " (" << e.reason << ")";
    }
  };
  // Waits until version `v` shows `state` in the index (a retired copy is freed on the
  // operations thread once its last request ended).
  auto wait_for = [&](const std::string& v, State state) {
    for (int i = 0; i < 500; ++i) {
      for (const IndexEntry& e : repository.index(false))
        if (e.version == v && e.state == state) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };
  std::string why;
  ASSERT_TRUE(repository.start(&why)) << why;
  agree("start");

  f.add_version(2, 2);  // latest 1: version 2 replaces 1
  ASSERT_FALSE(load(repository, "m"));
  ASSERT_TRUE(wait_for("1", State::kUnavailable));
  agree("swap");

  fs::create_directories(f.root() / "m" / "3");  // a version that does not load
  write_text(f.root() / "m" / "3" / "model.safetensors", "truncated");
  ASSERT_TRUE(load(repository, "m"));
  agree("failed load");

  std::promise<void> unloaded;
  repository.unload("m", [&](const Status&) { unloaded.set_value(); });
  unloaded.get_future().get();
  ASSERT_TRUE(wait_for("2", State::kUnavailable));
  agree("unload");

  std::lock_guard lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"m/1:LOADING", "m/1:READY",             // start
                                            "m/2:LOADING", "m/2:READY",             // the swap:
                                            "m/1:UNLOADING", "m/1:UNAVAILABLE",     // 1 retires
                                            "m/3:LOADING", "m/3:UNAVAILABLE",       // load fails
                                            "m/2:UNLOADING", "m/2:UNAVAILABLE"}));  // unload
}

TEST(RepositoryTest, UnloadWaitsForTheRequestsInFlight) {
  Fixture f;
  f.add_version(1, 1);
  std::vector<int32_t> ids(40, 3);
  std::atomic<int> ok{0}, failed{0};
  Repository repository(f.options(), f.metrics);
  std::string why;
  ASSERT_TRUE(repository.start(&why)) << why;
  Status e;
  std::vector<std::shared_ptr<batching::Job>> requests;
  {
    auto served = repository.find("m", "", &e);
    for (int i = 0; i < 50; ++i) requests.push_back(submit(served, ids, ok, failed));
  }
  std::promise<void> unloaded;
  repository.unload("m", [&](const Status&) { unloaded.set_value(); });
  unloaded.get_future().get();
  EXPECT_EQ(ok.load(), 50);  // every admitted request ran before the version was freed
  EXPECT_EQ(failed.load(), 0);
  EXPECT_FALSE(repository.find("m", "", &e));
  EXPECT_EQ(e.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(repository.ready());  // it was started to serve "m": unready until loaded again
  ASSERT_FALSE(load(repository, "m"));
  EXPECT_TRUE(repository.ready());
}

}  // namespace
}  // namespace fastformer::repository
