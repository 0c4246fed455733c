// memfit's WebAssembly boundary: the JSON functions of memfit/api.hpp as plain C exports, text
// in, text out. No Embind: its runtime type registry and JS glue cost more than the whole
// boundary needs (web/memfit-api.mjs copies the strings in and out of the module's memory).
//
// This is the only translation unit that includes <emscripten/...>. The core never throws out of
// these functions (errors come back as {"error": "..."}); web/memfit-api.mjs parses the text and
// turns an error object into a JS Error carrying the same message the CLI prints.
#include <emscripten/emscripten.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "memfit/api.hpp"

namespace {

std::string last_result;  // the text of the last call: the caller copies it out before the next one

const char* keep(std::string text) {
  last_result = std::move(text);
  return last_result.c_str();
}

}  // namespace

extern "C" {

// Each input is a UTF-8 text of `size` bytes at `text`.
EMSCRIPTEN_KEEPALIVE const char* memfit_estimate(const char* text, std::size_t size) {
  return keep(memfit::estimate_json(std::string_view(text, size)));
}
EMSCRIPTEN_KEEPALIVE const char* memfit_plan(const char* text, std::size_t size) {
  return keep(memfit::plan_json(std::string_view(text, size)));
}
EMSCRIPTEN_KEEPALIVE const char* memfit_parse_config(const char* text, std::size_t size) {
  return keep(memfit::parse_config_json(std::string_view(text, size)));
}
EMSCRIPTEN_KEEPALIVE const char* memfit_set_library(const char* text, std::size_t size) {
  return keep(memfit::set_library_json(std::string_view(text, size)));
}
// memfit_intake lives in its own module (intake_bindings.cpp), loaded when a launch config is pasted.
EMSCRIPTEN_KEEPALIVE const char* memfit_models() { return keep(memfit::models_json()); }
EMSCRIPTEN_KEEPALIVE const char* memfit_gpus() { return keep(memfit::gpus_json()); }
EMSCRIPTEN_KEEPALIVE const char* memfit_defaults() { return keep(memfit::defaults_json()); }

}  // extern "C"
