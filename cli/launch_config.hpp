// Reading a launch config file for `memfit estimate --from FILE` (the mapping itself is the
// core's memfit::intake, shared with the wasm module).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace memfit::cli {

/// Parses YAML / JSON / `--flag value` text into {"config": tree, "lines": {"dotted.key": line}}
/// (merged into `input`). False with a message when the text is none of them.
bool read_launch_config(const std::string& text, nlohmann::json& input, std::string& error);

}  // namespace memfit::cli
