// The routing room of the repository: which READY version answers a name and version (the
// default model, --served-model-name aliases: the one naming rule of every protocol), the
// names served, readiness and the index. Under the repository's lock, never loading anything.
#include <algorithm>
#include <filesystem>

#include "server/repository/repository.h"

namespace fastformer::repository {
namespace fs = std::filesystem;

std::shared_ptr<const ServedModel> Repository::find(const std::string& name,
                                                    const std::string& version, Status* out) const {
  std::lock_guard lock(mu_);
  const std::string* wanted = &name;
  const bool alias =
      std::find(options_.aliases.begin(), options_.aliases.end(), name) != options_.aliases.end();
  if (name.empty() || alias) {
    if (!options_.default_model.empty()) {
      wanted = &options_.default_model;
    } else {
      // The only model with a READY version (or the only one known, to say why it is not).
      std::vector<const std::string*> ready;
      for (const auto& [n, record] : models_) {
        for (const auto& [v, r] : record.versions) {
          if (r.state == State::kReady) {
            ready.push_back(&n);
            break;
          }
        }
      }
      if (ready.size() == 1) {
        wanted = ready[0];
      } else if (ready.empty() && models_.size() == 1) {
        wanted = &models_.begin()->first;
      } else {
        *out = Status(StatusCode::kNotFound, "the request names no model and this server serves " +
                                                 std::to_string(ready.size()) +
                                                 " (no --default-model): name one (model_name)");
        return nullptr;
      }
    }
  }
  auto m = models_.find(*wanted);
  std::error_code ec;
  if (m == models_.end() && !root_.empty() && wanted->find('/') == std::string::npos &&
      !wanted->empty() && (*wanted)[0] != '.' && fs::is_directory(fs::path(root_) / *wanted, ec)) {
    *out = Status(StatusCode::kUnavailable,
                  "model '" + *wanted +
                      "' is in the repository but not loaded (RepositoryModelLoad, or POST "
                      "/v2/repository/models/" +
                      *wanted + "/load)");
    return nullptr;
  }
  if (m == models_.end()) {
    std::string names;
    for (const auto& [n, record] : models_) names += (names.empty() ? "'" : ", '") + n + "'";
    *out = Status(StatusCode::kNotFound, "model '" + *wanted +
                                             "' is not served here: it is not in the repository" +
                                             (names.empty() ? "" : " (which has " + names + ")"));
    return nullptr;
  }
  const auto& versions = m->second.versions;
  if (version.empty()) {
    for (auto it = versions.rbegin(); it != versions.rend(); ++it)
      if (it->second.state == State::kReady && it->second.served) return it->second.served;
    std::string states;
    for (const auto& [v, r] : versions) {
      states += (states.empty() ? "" : ", ") + std::string("version ") + std::to_string(v) + " " +
                state_name(r.state) + (r.reason.empty() ? "" : " (" + r.reason + ")");
    }
    *out = Status(StatusCode::kUnavailable, "model '" + *wanted + "' has no READY version" +
                                                (states.empty() ? "" : ": ") + states);
    return nullptr;
  }
  const std::optional<int64_t> v = version_number(version);
  auto it = v ? versions.find(*v) : versions.end();
  if (it == versions.end()) {
    *out =
        Status(StatusCode::kNotFound, "model '" + *wanted + "' has no version '" + version + "'");
    return nullptr;
  }
  if (it->second.state != State::kReady || !it->second.served) {
    *out = Status(StatusCode::kUnavailable,
                  "model '" + *wanted + "' version " + version + " is " +
                      state_name(it->second.state) +
                      (it->second.reason.empty() ? "" : ": " + it->second.reason));
    return nullptr;
  }
  return it->second.served;
}

std::vector<std::shared_ptr<const ServedModel>> Repository::serving() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<const ServedModel>> out;
  for (const auto& [name, m] : models_)
    for (const auto& [v, r] : m.versions)
      if (r.state == State::kReady && r.served) out.push_back(r.served);
  return out;
}

std::vector<std::string> Repository::served_names() const {
  std::vector<std::string> names;
  for (const auto& served : serving()) {
    if (std::find(names.begin(), names.end(), served->name) == names.end())
      names.push_back(served->name);
  }
  names.insert(names.end(), options_.aliases.begin(), options_.aliases.end());
  return names;
}

bool Repository::ready() const {
  std::lock_guard lock(mu_);
  if (closed_) return false;
  for (const std::string& name : expected_) {
    auto m = models_.find(name);
    if (m == models_.end()) return false;
    bool any = false;
    for (const auto& [v, r] : m->second.versions) any |= r.state == State::kReady;
    if (!any) return false;
  }
  return true;
}

std::vector<IndexEntry> Repository::index(bool ready_only) const {
  std::vector<IndexEntry> out;
  std::lock_guard lock(mu_);
  std::map<std::string, std::map<int64_t, std::string>> disk;
  if (!root_.empty()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root_, ec)) {
      const std::string n = e.path().filename().string();
      if (!e.is_directory(ec) || n.empty() || n[0] == '.') continue;
      disk[n] = version_dirs(e.path());
    }
  }
  for (const auto& [name, m] : models_) disk[name];
  for (const auto& [name, versions] : disk) {
    std::set<int64_t> all;
    for (const auto& [v, path] : versions) all.insert(v);
    auto m = models_.find(name);
    if (m != models_.end())
      for (const auto& [v, r] : m->second.versions) all.insert(v);
    for (const int64_t v : all) {
      IndexEntry e{name, std::to_string(v), State::kUnavailable, "not loaded"};
      if (m != models_.end()) {
        auto r = m->second.versions.find(v);
        if (r != m->second.versions.end()) {
          e.state = r->second.state;
          e.reason = r->second.reason;
        }
      }
      if (ready_only && e.state != State::kReady) continue;
      out.push_back(std::move(e));
    }
  }
  return out;
}

}  // namespace fastformer::repository
