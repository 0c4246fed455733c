#include "memfit/library.hpp"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <vector>

#include "memfit/error.hpp"
#include "json_parse.hpp"

namespace memfit {

#ifndef MEMFIT_RUNTIME_LIBRARY
namespace detail {
extern const BundledModel kBundledModels[];
extern const unsigned long kBundledModelCount;
}  // namespace detail
#endif

namespace {

/// A library handed over at run time (set_bundled_library): the texts and the entries that
/// point into them.
struct RuntimeLibrary {
  bool loaded = false;
  std::vector<std::string> ids, configs;
  std::vector<BundledModel> models;
};

RuntimeLibrary& runtime_library() {
  static RuntimeLibrary library;
  return library;
}

}  // namespace

std::span<const BundledModel> bundled_models() {
  if (runtime_library().loaded) return runtime_library().models;
#ifdef MEMFIT_RUNTIME_LIBRARY
  return {};
#else
  return {detail::kBundledModels, detail::kBundledModelCount};
#endif
}

void set_bundled_library(std::string_view library_json) {
  const nlohmann::json list = detail::parse_json(library_json, false);
  if (!list.is_array()) throw Error("the model library is not a JSON array of {\"id\", \"partial\", \"config\"}");
  RuntimeLibrary next;
  for (const nlohmann::json& entry : list) {
    if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_string() || !entry.contains("config"))
      throw Error("every model library entry needs \"id\" and \"config\"");
    next.ids.push_back(entry["id"].get<std::string>());
    next.configs.push_back(entry["config"].dump());
  }
  // The entries point into the strings: build them once the vectors no longer grow.
  for (size_t i = 0; i < list.size(); ++i)
    next.models.push_back({next.ids[i].c_str(), next.configs[i].c_str(), list[i].value("partial", false)});
  next.loaded = true;
  runtime_library() = std::move(next);
}

bool bundled_config(const std::string& id, nlohmann::json& out) {
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
  };
  const std::string key = lower(id);
  for (const BundledModel& m : bundled_models()) {
    if (lower(m.id) == key) {
      out = detail::parse_json(m.config_json);
      return true;
    }
  }
  return false;
}

}  // namespace memfit
