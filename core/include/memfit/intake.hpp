// memfit: a user's own launch config -> a memfit request.
//
// `intake` reads the tree of an Axolotl YAML, a LLaMA-Factory YAML, a torchtune recipe YAML, a
// LitGPT YAML, Transformers/TRL TrainingArguments (JSON, or CLI flags as {"flag": value}), a
// DeepSpeed JSON or an accelerate config, already parsed into JSON by the adapter (the CLI uses
// yaml-cpp; the page a JS YAML parser), and returns the request it describes together with,
// for every request field, the key (and line) it came from, and which fields were defaulted.
// A pure function: the CLI, the wasm module and Python give the same answer.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace memfit {

/// input: {"config": {...parsed file...}, "format": "auto" | "axolotl" | "llamafactory" |
/// "torchtune" | "litgpt" | "training_args" | "deepspeed" | "accelerate" (default "auto"),
/// "lines": {"dotted.key": line, ...} (optional), "base": {...request...} (optional: fields the
/// file does not give, e.g. the GPU; the file wins where both give one)}.
/// Returns {"format", "request", "sources": {field: {"key", "line"?}}, "defaulted": [field],
/// "ignored": [key], "notes": [text]}. Throws Error for a tree no format matches.
[[nodiscard]] nlohmann::json intake(const nlohmann::json& input);

/// The formats intake understands.
[[nodiscard]] std::vector<std::string> intake_formats();

}  // namespace memfit
