// memfit: the bundled model library (authentic Hugging Face config.json files from
// data/configs/). The native build compiles it in; the WebAssembly module leaves it out to stay
// small (MEMFIT_RUNTIME_LIBRARY) and the page hands it over at start-up from library.json,
// generated from the same files (cmake/embed_configs.cmake), so both resolve the same ids.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>

namespace memfit {

struct BundledModel {
  const char* id;           ///< Hugging Face id, "org/name"
  const char* config_json;  ///< the config.json text as published
  bool partial;             ///< only some keys are known (data/configs/partial)
};

[[nodiscard]] std::span<const BundledModel> bundled_models();
/// Replaces the library with a JSON array of {"id", "partial", "config": {...}} (library.json).
/// Throws Error if the text is not such an array.
void set_bundled_library(std::string_view library_json);
/// Parses the config of a bundled id (case-insensitive) into `out`; false if the id is unknown.
bool bundled_config(const std::string& id, nlohmann::json& out);

}  // namespace memfit
