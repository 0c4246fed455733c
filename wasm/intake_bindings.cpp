// The launch-config intake (memfit/intake.hpp) as its own small module, memfit-intake.wasm: the
// page loads it only when a launch config is pasted, which keeps the module every visit loads
// within issue 10's 150 KB budget (measured: the intake code is ~12 KB of it, gzipped).
// Same plain C boundary as bindings.cpp: UTF-8 text in, text out.
#include <emscripten/emscripten.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "memfit/api.hpp"

namespace {

std::string last_result;  // the text of the last call: the caller copies it out before the next one

}  // namespace

extern "C" {

// a parsed launch config -> request + sources
EMSCRIPTEN_KEEPALIVE const char* memfit_intake(const char* text, std::size_t size) {
  last_result = memfit::intake_json(std::string_view(text, size));
  return last_result.c_str();
}

}  // extern "C"
