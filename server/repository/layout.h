// The repository's layout, as Triton reads it: <repository>/<model>/<version>/ directories,
// each model's optional config.pbtxt (the server's flags overridden per model), the version
// policy, and what a version directory holds besides the weights (the class labels, the
// embedding types' ranges). Files
// only: nothing here loads a model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "inference/model_config.pb.h"
#include "server/repository/settings.h"
#include "server/request/prompts.h"
#include "server/request/quantize.h"

namespace fastformer::repository {

// A version directory's number: digits, not starting with 0; nullopt for anything else.
std::optional<int64_t> version_number(const std::string& name);
// The version directories under `model_dir`, by number.
std::map<int64_t, std::string> version_dirs(const std::filesystem::path& model_dir);
// What changes when a directory's files do (names, sizes, modification times): a version whose
// files are unchanged is not loaded again.
std::string files_fingerprint(const std::filesystem::path& dir);
// `defaults` overridden by <model_dir>/config.pbtxt, if present. Throws std::invalid_argument
// naming the file and the field.
ModelSettings read_settings(const std::filesystem::path& model_dir, const std::string& name,
                            const ModelSettings& defaults);
// The versions `policy` serves out of those present (latest 1 when it sets none).
std::set<int64_t> wanted_versions(const inference::ModelVersionPolicy& policy,
                                  const std::map<int64_t, std::string>& present);
// The class names of a version directory's classifier head: config.json's id2label (as Hugging
// Face writes it) or labels.json's "labels" (the demo model's); empty when neither. Labels are
// a courtesy: a missing or broken file gives none (the model's own load reports a broken
// config.json).
std::vector<std::string> read_labels(const std::filesystem::path& version_dir);
// The version directory's quantization.json (the int8 / uint8 embedding types' calibrated
// ranges, tools/calibrate_quantization.py; docs/api.md, "Embedding types"), or null when there is
// none. Throws std::invalid_argument naming the file and what is wrong when it is malformed: a
// ranges file that cannot be read would quantize with the wrong ranges, so the version does not
// load. `hidden_size`: no range may have more dimensions.
std::shared_ptr<const request::Quantization> read_quantization(
    const std::filesystem::path& version_dir, int64_t hidden_size);
// The version's prompts (request/prompts.h): `from_settings` (config.pbtxt's parameters["prompts"],
// ModelSettings::prompts) when set, else the version directory's
// config_sentence_transformers.json; null when neither names a prompt. Throws
// std::invalid_argument naming the file and what is wrong, so a broken file stops the load.
std::shared_ptr<const request::Prompts> read_prompts(const std::filesystem::path& version_dir,
                                                     const std::string& from_settings);

}  // namespace fastformer::repository
