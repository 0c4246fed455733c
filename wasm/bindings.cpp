// memfit's WebAssembly boundary: the JSON functions of memfit/api.hpp, string in, string out.
//
// This is the only translation unit that includes <emscripten/...>. The core never throws out of
// these functions (errors come back as {"error": "..."}); web/memfit.js parses the text and turns
// an error object into a JS Error carrying the same message the CLI prints.
#include <emscripten/bind.h>

#include <string>

#include "memfit/api.hpp"

namespace {

std::string estimate(const std::string& request) { return memfit::estimate_json(request); }
std::string plan(const std::string& request) { return memfit::plan_json(request); }
std::string parse_config(const std::string& config) { return memfit::parse_config_json(config); }
std::string set_library(const std::string& library) { return memfit::set_library_json(library); }

}  // namespace

EMSCRIPTEN_BINDINGS(memfit) {
  using emscripten::function;
  function("estimateJson", &estimate);
  function("planJson", &plan);
  function("parseConfigJson", &parse_config);
  function("modelsJson", &memfit::models_json);
  function("gpusJson", &memfit::gpus_json);
  function("setLibraryJson", &set_library);
  function("defaultsJson", &memfit::defaults_json);
}
