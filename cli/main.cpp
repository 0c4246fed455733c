// memfit CLI: a thin adapter over the core's JSON API (core/include/memfit/api.hpp).
//
//   memfit estimate REQUEST.json [--json]   per-GPU peak memory, explained
//   memfit plan REQUEST.json [--json]       which distributed methods fit, fastest first
//   memfit models                           bundled config library
//   memfit gpus                             GPU catalog
//   memfit inspect CONFIG.json              how memfit reads a config.json
//   memfit defaults                         every request field with its default
//   memfit validate CASES.json ...          run real training steps and compare (validate_command.cpp)
//   memfit validate --serve-log LOG ...     a vLLM / SGLang start-up log vs task "serve" (serve_log.cpp)
// REQUEST.json may be "-" for standard input. Errors: exit 2 and one line on stderr.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "memfit/api.hpp"
#include "report.hpp"
#include "serve_log.hpp"
#include "validate_command.hpp"

namespace {

constexpr int kBadInput = 2;
constexpr int kUsage = 64;

int usage() {
  std::fprintf(stderr,
               "usage: memfit estimate REQUEST.json [--json]\n"
               "       memfit plan REQUEST.json [--json]\n"
               "       memfit models | gpus | defaults\n"
               "       memfit inspect CONFIG.json\n"
               "       memfit validate CASES.json [--device cpu|cuda] [--json|--markdown] [--record FILE]\n"
               "       memfit validate --replay FILE [--json|--markdown]\n"
               "       memfit validate --serve-log LOG.txt --request REQUEST.json [--json]\n"
               "       memfit validate --serve-launch REQUEST.json --model-path PATH [--timeout S]   (GPU; untested)\n"
               "REQUEST.json may be - for standard input; see README.md for the request fields.\n");
  return kUsage;
}

bool read_input(const std::string& path, std::string& out) {
  std::ostringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "memfit: cannot read %s: check the path\n", path.c_str());
      return false;
    }
    ss << in.rdbuf();
  }
  out = ss.str();
  return true;
}

/// Prints JSON or a report; returns the exit code. `result` is the API's JSON text.
int emit(const std::string& result, bool as_json, void (*report)(const nlohmann::json&)) {
  const nlohmann::json j = nlohmann::json::parse(result);
  if (j.is_object() && j.contains("error")) {
    std::fprintf(stderr, "memfit: %s\n", j["error"].get<std::string>().c_str());
    return kBadInput;
  }
  if (as_json) std::printf("%s\n", j.dump(2).c_str());
  else report(j);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  bool as_json = false;
  std::vector<std::string> positional;
  for (const std::string& a : args) {
    if (a == "--json") as_json = true;
    else positional.push_back(a);
  }
  if (cmd == "estimate" || cmd == "plan" || cmd == "inspect") {
    if (positional.size() != 1) return usage();
    std::string text;
    if (!read_input(positional[0], text)) return kBadInput;
    if (cmd == "estimate") return emit(memfit::estimate_json(text), as_json, memfit::cli::print_estimate);
    if (cmd == "plan") return emit(memfit::plan_json(text), as_json, memfit::cli::print_plan);
    return emit(memfit::parse_config_json(text), true, nullptr);
  }
  if (cmd == "models") return emit(memfit::models_json(), as_json, memfit::cli::print_models);
  if (cmd == "gpus") return emit(memfit::gpus_json(), as_json, memfit::cli::print_gpus);
  if (cmd == "defaults") return emit(memfit::defaults_json(), true, nullptr);
  if (cmd == "validate")
    return memfit::cli::is_serve_validate(args) ? memfit::cli::run_serve_validate(args) : memfit::cli::run_validate(args);
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage();
    return 0;
  }
  std::fprintf(stderr, "memfit: unknown command \"%s\"\n", cmd.c_str());
  return usage();
}
