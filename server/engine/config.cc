#include "server/engine/config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "server/engine/error.h"

namespace fastformer::engine {
namespace {

using nlohmann::json;

// More layers than any encoder we know of. The weights bound every other size (their
// tensors must be in the file), but with share_layer_parameters one stored layer stands
// for all of them, and the loader keeps one entry per layer.
constexpr int64_t kMaxLayers = 1024;

[[noreturn]] void fail(const std::string& origin, const std::string& what) {
  throw ModelError(origin + ": " + what);
}

int64_t positive_int(const json& j, const std::string& key, const std::string& origin) {
  if (!j.contains(key)) fail(origin, "missing required key \"" + key + "\"");
  const json& v = j.at(key);
  if (!v.is_number_integer()) {
    fail(origin, "key \"" + key + "\": expected a positive integer, found " + v.dump());
  }
  const int64_t n = v.get<int64_t>();
  if (n <= 0 || n >= (int64_t{1} << 31)) {
    fail(origin,
         "key \"" + key + "\": expected a positive integer below 2^31, found " + std::to_string(n));
  }
  return n;
}

}  // namespace

bool parse_activation(const std::string& name, Activation* out) {
  if (name == "gelu") {
    *out = Activation::kGeluErf;
  } else if (name == "gelu_new" || name == "gelu_pytorch_tanh") {
    *out = Activation::kGeluTanh;
  } else if (name == "relu") {
    *out = Activation::kRelu;
  } else if (name == "silu" || name == "swish") {
    *out = Activation::kSilu;
  } else {
    return false;
  }
  return true;
}

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::kGeluErf:
      return "gelu";
    case Activation::kGeluTanh:
      return "gelu_new";
    case Activation::kRelu:
      return "relu";
    case Activation::kSilu:
      return "silu";
  }
  return "?";
}

ModelConfig parse_config(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range (number overflow)
    fail(origin, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(origin, "expected a JSON object at the top level");

  ModelConfig c;
  c.hidden_size = positive_int(j, "hidden_size", origin);
  c.num_hidden_layers = positive_int(j, "num_hidden_layers", origin);
  if (c.num_hidden_layers > kMaxLayers) {
    fail(origin, "key \"num_hidden_layers\": " + std::to_string(c.num_hidden_layers) +
                     " layers, more than the " + std::to_string(kMaxLayers) +
                     " the server accepts");
  }
  c.num_attention_heads = positive_int(j, "num_attention_heads", origin);
  c.intermediate_size = positive_int(j, "intermediate_size", origin);
  c.max_position_embeddings = positive_int(j, "max_position_embeddings", origin);
  c.vocab_size = positive_int(j, "vocab_size", origin);
  if (c.hidden_size % c.num_attention_heads != 0) {
    fail(origin, "hidden_size (" + std::to_string(c.hidden_size) +
                     ") must be divisible by num_attention_heads (" +
                     std::to_string(c.num_attention_heads) + ")");
  }
  if (j.contains("hidden_act")) {
    if (!j["hidden_act"].is_string()) {
      fail(origin, "key \"hidden_act\": expected a string, found " + j["hidden_act"].dump());
    }
    c.hidden_act_name = j["hidden_act"].get<std::string>();
    if (!parse_activation(c.hidden_act_name, &c.hidden_act)) {
      fail(origin, "key \"hidden_act\": unknown activation \"" + c.hidden_act_name +
                       "\" (expected one of gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish)");
    }
  }
  if (j.contains("layer_norm_eps")) {
    if (!j["layer_norm_eps"].is_number() || !(j["layer_norm_eps"].get<double>() > 0)) {
      fail(origin, "key \"layer_norm_eps\": expected a positive number, found " +
                       j["layer_norm_eps"].dump());
    }
    c.layer_norm_eps = j["layer_norm_eps"].get<double>();
  }
  if (j.contains("pad_token_id") && !j["pad_token_id"].is_null()) {
    if (!j["pad_token_id"].is_number_integer()) {
      fail(origin, "key \"pad_token_id\": expected an integer, found " + j["pad_token_id"].dump());
    }
    const int64_t pad = j["pad_token_id"].get<int64_t>();
    if (pad < 0 || pad >= c.vocab_size) {
      fail(origin, "key \"pad_token_id\": expected 0 <= pad_token_id < vocab_size (" +
                       std::to_string(c.vocab_size) + "), found " + std::to_string(pad));
    }
    c.pad_token_id = static_cast<int32_t>(pad);
  }
  if (j.contains("share_layer_parameters")) {
    if (!j["share_layer_parameters"].is_boolean()) {
      fail(origin, "key \"share_layer_parameters\": expected true or false, found " +
                       j["share_layer_parameters"].dump());
    }
    c.share_layer_parameters = j["share_layer_parameters"].get<bool>();
  }
  if (j.contains("model_name") && j["model_name"].is_string()) {
    c.model_name = j["model_name"].get<std::string>();
  }
  if (j.contains("num_labels") && !j["num_labels"].is_null()) {
    if (!j["num_labels"].is_number_integer() || j["num_labels"].get<int64_t>() < 0) {
      fail(origin,
           "key \"num_labels\": expected a non-negative integer, found " + j["num_labels"].dump());
    }
    c.num_labels = j["num_labels"].get<int64_t>();
  }
  return c;
}

ModelConfig load_config(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ModelError(path.string() + ": cannot open (does the model directory hold config.json?)");
  std::ostringstream text;
  text << in.rdbuf();
  ModelConfig c = parse_config(text.str(), path.string());
  if (c.model_name.empty()) {
    c.model_name = std::filesystem::absolute(path).parent_path().filename().string();
  }
  return c;
}

}  // namespace fastformer::engine
