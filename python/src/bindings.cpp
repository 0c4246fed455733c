// memfit._core: the core's JSON API (core/include/memfit/api.hpp) for Python.
//
// Every function takes and returns JSON text, exactly as the CLI and the wasm module see it;
// python/memfit/ parses it and raises memfit.Error for {"error": ...}. The GIL is released
// while the core runs (it is pure and thread-safe).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "memfit/api.hpp"

namespace nb = nanobind;

namespace {

/// The CLI's --json printing (cli/main.cpp: parse, dump with indent 2), so that
/// `python -m memfit estimate --json` prints the CLI's bytes.
std::string indented(std::string_view json_text) { return nlohmann::json::parse(json_text).dump(2); }

}  // namespace

NB_MODULE(_core, m) {
  using Guard = nb::call_guard<nb::gil_scoped_release>;
  m.def("estimate_json", &memfit::estimate_json, nb::arg("request"), Guard(), "estimate(request) as JSON text");
  m.def("plan_json", &memfit::plan_json, nb::arg("request"), Guard(), "the planner as JSON text");
  m.def("parse_config_json", &memfit::parse_config_json, nb::arg("config"), Guard(),
        "a config.json as memfit reads it, as JSON text");
  m.def("models_json", &memfit::models_json, Guard(), "the bundled model library as JSON text");
  m.def("gpus_json", &memfit::gpus_json, Guard(), "the GPU catalog as JSON text");
  m.def("defaults_json", &memfit::defaults_json, Guard(), "every request field with its default, as JSON text");
  m.def("indented", &indented, nb::arg("json_text"), Guard(), "JSON text re-printed as the CLI's --json prints it");
}
