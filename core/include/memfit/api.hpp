// memfit: the JSON boundary shared by the CLI and the WebAssembly module.
//
// Each function takes a JSON text and returns a JSON text; it never throws. A failure comes
// back as {"error": "<message that says what to fix>"}. Because the CLI and the page call these
// same functions, the same request gives byte-identical output natively and in wasm.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "memfit/estimate.hpp"

namespace memfit {

/// estimate(request) as JSON: params, per_gpu {allocated/reserved/device bytes, breakdown},
/// peak_phase, phases, fits, ...
[[nodiscard]] std::string estimate_json(std::string_view request_json);
/// The planner (see planner.hpp) as JSON.
[[nodiscard]] std::string plan_json(std::string_view request_json);
/// A config.json -> the model as memfit reads it (family, sizes, parameter counts, notes).
[[nodiscard]] std::string parse_config_json(std::string_view config_json);
/// Bundled model library: [{"id", "model_type", "params"}].
[[nodiscard]] std::string models_json();
/// Replaces the bundled library with library.json's text (the WebAssembly module starts without
/// one): {"models": count} or {"error": ...}.
[[nodiscard]] std::string set_library_json(std::string_view library_json);
/// GPU catalog.
[[nodiscard]] std::string gpus_json();
/// Every request field with its default value and the accepted values.
[[nodiscard]] std::string defaults_json();
/// A parsed launch config -> the request it describes, with the key/line of every field and
/// what was defaulted (see intake.hpp for the input and output shapes).
[[nodiscard]] std::string intake_json(std::string_view input_json);
/// The tensor lists of the layer-by-layer schedule (core/src/layer_ops.hpp) for a training
/// request, each entry resolved to bytes: {"covered": true, "layers", "checkpointing", "lists":
/// [{"list", "forward": [{name, op, elements, element_bytes, bytes, saved, freed_after}],
/// "backward": [{name, bytes}]}]}, or {"covered": false, "reason"} for a request the lists do
/// not describe yet.
[[nodiscard]] std::string tensor_lists_json(std::string_view request_json);

/// The structured forms the JSON functions wrap (for C++ callers and tests).
[[nodiscard]] nlohmann::json estimate_to_json(const Estimate& e, const Request& r);
/// task "serve": {"serving": {...per-GPU engine figures...}, "fits", "notes", "request", ...}.
[[nodiscard]] nlohmann::json serve_to_json(const Request& r);
[[nodiscard]] Request request_from_json(const nlohmann::json& request);

}  // namespace memfit
