// memfit CLI: a thin adapter over the core's JSON API (core/include/memfit/api.hpp).
//
//   memfit estimate REQUEST.json [--json]   per-GPU peak memory, explained
//   memfit estimate --from FILE [--format F] [--gpu NAME] [--json]
//                                           the same for a launch config (Axolotl, LLaMA-Factory,
//                                           torchtune, LitGPT, TrainingArguments, DeepSpeed, accelerate)
//   memfit intake FILE [--format F]         the request a launch config describes, field by field
//   memfit plan REQUEST.json [--json]       which distributed methods fit, fastest first
//   memfit models                           bundled config library
//   memfit gpus                             GPU catalog
//   memfit inspect CONFIG.json              how memfit reads a config.json
//   memfit defaults                         every request field with its default
//   memfit validate CASES.json ...          run real training steps and compare (validate_command.cpp)
// REQUEST.json may be "-" for standard input. Errors: exit 2 and one line on stderr.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "launch_config.hpp"
#include "memfit/api.hpp"
#include "report.hpp"
#include "validate_command.hpp"

namespace {

constexpr int kBadInput = 2;
constexpr int kUsage = 64;

int usage() {
  std::fprintf(stderr,
               "usage: memfit estimate REQUEST.json [--json]\n"
               "       memfit estimate --from LAUNCH_CONFIG [--format NAME] [--gpu NAME] [--json]\n"
               "       memfit intake LAUNCH_CONFIG [--format NAME]\n"
               "       memfit plan REQUEST.json [--json]\n"
               "       memfit models | gpus | defaults\n"
               "       memfit inspect CONFIG.json\n"
               "       memfit validate CASES.json [--device cpu|cuda] [--json|--markdown] [--record FILE]\n"
               "       memfit validate --replay FILE [--json|--markdown]\n"
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

/// Prints where each request field came from, what was defaulted, and the file's notes.
void print_intake(const nlohmann::json& in) {
  std::printf("launch config read as %s:\n", in["format"].get<std::string>().c_str());
  for (auto it = in["sources"].begin(); it != in["sources"].end(); ++it) {
    const nlohmann::json& src = *it;
    std::string where;
    if (src.contains("key")) where = src["key"].get<std::string>();
    else where.append("(").append(src["default"].get<std::string>()).append(")");
    if (src.contains("line")) where += " (line " + std::to_string(src["line"].get<int>()) + ")";
    if (src.contains("file")) where.insert(0, src["file"].get<std::string>() + ": ");
    std::printf("  %-30s <- %s\n", it.key().c_str(), where.c_str());
  }
  std::string defaulted;
  for (const auto& f : in["defaulted"]) defaulted += (defaulted.empty() ? "" : ", ") + f.get<std::string>();
  if (!defaulted.empty()) std::printf("  defaulted (memfit's / the framework's defaults): %s\n", defaulted.c_str());
  for (const auto& n : in["notes"]) std::printf("  note: %s\n", n.get<std::string>().c_str());
  std::printf("\n");
}

/// Reads one launch config and maps it over `base` (the request so far).
bool intake_file(const std::string& path, const std::string& format, const nlohmann::json& base, nlohmann::json& out) {
  std::string text, error;
  if (!read_input(path, text)) return false;
  nlohmann::json input = {{"format", format}, {"base", base}};
  if (!memfit::cli::read_launch_config(text, input, error)) {
    std::fprintf(stderr, "memfit: %s: %s\n", path.c_str(), error.c_str());
    return false;
  }
  out = nlohmann::json::parse(memfit::intake_json(input.dump()));
  if (out.contains("error")) {
    std::fprintf(stderr, "memfit: %s: %s\n", path.c_str(), out["error"].get<std::string>().c_str());
    return false;
  }
  return true;
}

/// `estimate --from FILE [--from FILE2 ...]` and `intake FILE`: file(s) -> core intake ->
/// (estimate). Several files (TrainingArguments + DeepSpeed JSON) are read in order, each over
/// the request of the ones before; sources then name their file.
int from_launch_config(const std::vector<std::string>& args, bool estimate, bool as_json) {
  std::vector<std::string> paths;
  std::string format = "auto", gpu;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool has_value = i + 1 < args.size();
    if (args[i] == "--from" && has_value) paths.push_back(args[++i]);
    else if (args[i] == "--format" && has_value) format = args[++i];
    else if (args[i] == "--gpu" && has_value) gpu = args[++i];
    else if (args[i] == "--json") continue;
    else if (!estimate && args[i].rfind("--", 0) != 0) paths.push_back(args[i]);
    else return usage();
  }
  if (paths.empty()) return usage();
  nlohmann::json base = nlohmann::json::object();
  if (!gpu.empty()) base["gpu"] = {{"name", gpu}};
  nlohmann::json in;
  nlohmann::json sources = nlohmann::json::object(), notes = nlohmann::json::array();
  for (const std::string& path : paths) {
    if (!intake_file(path, paths.size() > 1 ? "auto" : format, base, in)) return kBadInput;
    base = in["request"];
    for (auto it = in["sources"].begin(); it != in["sources"].end(); ++it) {
      sources[it.key()] = *it;
      if (paths.size() > 1) sources[it.key()]["file"] = path;
    }
    for (const auto& n : in["notes"]) notes.push_back(n);
  }
  in["sources"] = sources;
  in["notes"] = notes;
  if (paths.size() > 1) in["format"] = "several files";
  nlohmann::json defaulted = nlohmann::json::array();
  for (const auto& f : in["defaulted"])
    if (!sources.contains(f.get<std::string>())) defaulted.push_back(f);
  in["defaulted"] = defaulted;
  if (!estimate) return emit(in.dump(), true, nullptr);
  const std::string result = memfit::estimate_json(in["request"].dump());
  if (as_json) {
    const nlohmann::json e = nlohmann::json::parse(result);
    std::printf("%s\n", nlohmann::json{{"intake", in}, {"estimate", e}}.dump(2).c_str());
    return e.contains("error") ? kBadInput : 0;
  }
  print_intake(in);
  return emit(result, false, memfit::cli::print_estimate);
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
  const bool from = std::find(args.begin(), args.end(), "--from") != args.end();
  if ((cmd == "estimate" && from) || cmd == "intake") return from_launch_config(args, cmd == "estimate", as_json);
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
  if (cmd == "validate") return memfit::cli::run_validate(args);
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage();
    return 0;
  }
  std::fprintf(stderr, "memfit: unknown command \"%s\"\n", cmd.c_str());
  return usage();
}
