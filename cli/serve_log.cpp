// `memfit validate` serving mode: start-up log parsing and the field-by-field comparison.
// The patterns are the engines' own log lines (vLLM V0 worker.py / V1 gpu_worker.py,
// kv_cache_utils.py, gpu_model_runner.py; SGLang model_runner.py, scheduler), one table row
// per wording, oldest wording last; tested on the published logs of
// data/calibration/serving_logs.json (tests/validate/serve_logs/).
#include "serve_log.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "memfit/api.hpp"

namespace memfit::cli {

namespace {

using nlohmann::json;

struct Pattern {
  const char* key;
  const char* regex;  ///< group 1: the number (group 2 added to it when present: SGLang K + V)
};

constexpr Pattern kPatterns[] = {
    {"weights_gib", R"(Model loading took ([0-9.]+) ?GiB)"},
    {"weights_gib", R"(Loading model weights took ([0-9.]+) ?GB)"},
    {"weights_gib", R"(model weights take\s+([0-9.]+) ?GiB)"},
    {"weights_gib", R"(Load weight end\..*mem usage=([0-9.]+) ?GB)"},
    {"non_torch_gib", R"(non_torch_memory(?:=| takes |\s+)([0-9.]+) ?GiB)"},
    {"activation_peak_gib", R"(PyTorch activation peak memory(?: takes)?\s+([0-9.]+) ?GiB)"},
    {"peak_torch_gib", R"(peak_torch_memory=([0-9.]+) ?GiB)"},
    {"kv_cache_gib", R"(Available KV cache memory: ([0-9.]+) ?GiB)"},
    {"kv_cache_gib", R"(kv_cache_size=([0-9.]+) ?GiB)"},
    {"kv_cache_gib", R"(available_kv_cache_memory\s+([0-9.]+) ?GiB)"},
    {"kv_cache_gib", R"(reserved for KV Cache is ([0-9.]+) ?GiB)"},
    {"kv_cache_gib", R"(K size: ([0-9.]+) GB, V size: ([0-9.]+) GB)"},
    {"kv_cache_tokens", R"(GPU KV cache size: ([0-9,]+) tokens)"},
    {"kv_cache_tokens", R"(KV Cache is allocated\. #tokens: ([0-9]+))"},
    {"kv_cache_tokens", R"(max_total_num_tokens=([0-9]+))"},
    {"num_gpu_blocks", R"(# GPU blocks: ([0-9]+))"},
    {"max_model_len", R"(Maximum concurrency for ([0-9,]+) tokens per request)"},
    {"max_concurrency", R"(Maximum concurrency for [0-9,]+ tokens per request: ([0-9.]+)x)"},
    {"total_gpu_memory_gib", R"(total_gpu_memory(?:=|\s+|\s*\()([0-9.]+) ?GiB)"},
    {"gpu_memory_utilization", R"(gpu_memory_utilization(?:=|\s+|\s*\()([0-9.]+))"},
    {"cuda_graph_gib", R"(Graph capturing finished in [0-9.]+ secs?, took ([0-9.]+) GiB)"},
};

double number(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  return std::stod(s);
}

/// One field of the comparison: logged key, estimate key in "serving", estimate scale.
struct Field {
  const char* label;
  const char* logged;
  const char* estimate;
  double scale;  ///< estimate / scale = logged units
};
constexpr double kGiB = 1073741824.0;
constexpr Field kFields[] = {
    {"model weights (GiB)", "weights_gib", "weights_bytes", kGiB},
    {"non-torch (GiB)", "non_torch_gib", "non_torch_bytes", kGiB},
    {"activation peak (GiB)", "activation_peak_gib", "activation_peak_bytes", kGiB},
    {"KV cache (GiB)", "kv_cache_gib", "kv_cache_bytes", kGiB},
    {"KV cache tokens", "kv_cache_tokens", "kv_cache_tokens", 1},
    {"GPU blocks", "num_gpu_blocks", "num_gpu_blocks", 1},
    {"max concurrency", "max_concurrency", "max_concurrency", 1},
    {"CUDA graphs (GiB)", "cuda_graph_gib", "cuda_graph_bytes", kGiB},
};

bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "memfit validate: %s\n", what.c_str());
  return 2;
}

/// Compares and prints; returns the comparison as JSON.
json compare(const json& logged, const json& estimate) {
  const json& s = estimate["serving"];
  json rows = json::array();
  for (const Field& f : kFields) {
    if (!logged.contains(f.logged)) continue;
    const double est = s[f.estimate].get<double>() / f.scale, log = logged[f.logged].get<double>();
    rows.push_back({{"field", f.label}, {"logged", log}, {"estimate", est},
                    {"error_pct", log != 0 ? 100.0 * (est - log) / log : 0.0}});
  }
  return rows;
}

/// The engine's command line for the request (vLLM's and SGLang's own flag names).
std::string launch_command(const json& req, const std::string& model_path) {
  const json s = req.value("serving", json::object());
  const bool sglang = s.value("engine", std::string("vllm")) == "sglang";
  std::string cmd = sglang ? "python3 -m sglang.launch_server --model-path '" + model_path + "'"
                           : "vllm serve '" + model_path + "'";
  auto flag = [&](const char* key, const char* vllm_flag, const char* sglang_flag) {
    if (s.contains(key)) cmd += std::string(" ") + (sglang ? sglang_flag : vllm_flag) + " " + (s[key].is_string() ? s[key].get<std::string>() : s[key].dump());
  };
  flag("gpu_memory_utilization", "--gpu-memory-utilization", "--mem-fraction-static");
  flag("mem_fraction_static", "--gpu-memory-utilization", "--mem-fraction-static");
  flag("max_model_len", "--max-model-len", "--context-length");
  flag("tensor_parallel_size", "--tensor-parallel-size", "--tp-size");
  flag("pipeline_parallel_size", "--pipeline-parallel-size", "--pp-size");
  flag("max_num_seqs", "--max-num-seqs", "--max-running-requests");
  flag("max_num_batched_tokens", "--max-num-batched-tokens", "--chunked-prefill-size");
  flag("kv_cache_dtype", "--kv-cache-dtype", "--kv-cache-dtype");
  flag("block_size", "--block-size", "--page-size");
  if (s.value("enforce_eager", false)) cmd += sglang ? " --disable-cuda-graph" : " --enforce-eager";
  return cmd;
}

std::string arg_after(const std::vector<std::string>& args, const std::string& name) {
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == name) return args[i + 1];
  return "";
}

}  // namespace

json parse_serve_log(const std::string& text) {
  json out = json::object();
  for (const Pattern& p : kPatterns) {
    if (out.contains(p.key)) continue;  // an earlier wording (or rank) already gave it
    std::smatch m;
    const std::regex re(p.regex);
    if (!std::regex_search(text, m, re)) continue;
    double v = number(m[1].str());
    if (m.size() > 2 && m[2].matched) v += number(m[2].str());
    out[p.key] = v;
  }
  const bool sglang = text.find("KV Cache is allocated") != std::string::npos || text.find("max_total_num_tokens") != std::string::npos ||
                      text.find("sglang") != std::string::npos;
  out["engine"] = sglang ? "sglang" : "vllm";
  if (out.contains("peak_torch_gib") && out.contains("weights_gib") && !out.contains("activation_peak_gib"))
    out["activation_peak_gib"] = out["peak_torch_gib"].get<double>() - out["weights_gib"].get<double>();
  if (!out.contains("kv_cache_tokens") && out.contains("num_gpu_blocks") && !sglang) {
    out["kv_cache_tokens"] = out["num_gpu_blocks"].get<double>() * 16;  // V0: blocks of the default block_size
    out["kv_cache_tokens_derived"] = true;
  }
  return out;
}

bool is_serve_validate(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--serve-log" || a == "--serve-launch") return true;
  return false;
}

int run_serve_validate(const std::vector<std::string>& args) {
  bool as_json = false;
  for (const std::string& a : args) as_json = as_json || a == "--json";
  std::string log_text, req_text;
  std::string req_path = arg_after(args, "--request");
  const std::string launch = arg_after(args, "--serve-launch");
  if (!launch.empty()) {
    // GPU machines only; written for issue 11 and NOT yet run on a GPU (none was lent).
    req_path = launch;
    const std::string model_path = arg_after(args, "--model-path");
    if (model_path.empty()) return fail("--serve-launch needs --model-path PATH (the checkpoint the engine loads)");
    if (!read_file(req_path, req_text)) return fail("cannot read " + req_path);
    const std::string timeout = arg_after(args, "--timeout").empty() ? "900" : arg_after(args, "--timeout");
    const std::string log_path = "memfit-serve-launch.log";
    const std::string cmd = "timeout " + timeout + " sh -c \"" + launch_command(json::parse(req_text), model_path) + " 2>&1 | tee " +
                            log_path + " | grep -m1 -E 'Maximum concurrency|max_total_num_tokens' >/dev/null\"";
    std::fprintf(stderr, "memfit validate: launching (untested on GPU): %s\n", cmd.c_str());
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "memfit validate: the engine did not print its KV cache line; comparing what it logged\n");
    if (!read_file(log_path, log_text)) return fail("the engine wrote no log");
  } else {
    const std::string log_path = arg_after(args, "--serve-log");
    if (log_path.empty() || !read_file(log_path, log_text)) return fail("cannot read the log given to --serve-log");
    if (req_path.empty()) {  // no request: the figures the log prints, nothing to compare with
      std::printf("%s\n", parse_serve_log(log_text).dump(2).c_str());
      return 0;
    }
    if (!read_file(req_path, req_text)) return fail("cannot read " + req_path + " (task \"serve\" with the settings the engine ran)");
  }
  const json logged = parse_serve_log(log_text);
  const json estimate = json::parse(memfit::estimate_json(req_text));
  if (estimate.contains("error")) return fail(estimate["error"].get<std::string>());
  if (!estimate.contains("serving")) return fail("the request must have \"task\": \"serve\"");
  const json rows = compare(logged, estimate);
  if (as_json) {
    std::printf("%s\n", json{{"logged", logged}, {"comparison", rows}}.dump(2).c_str());
    return 0;
  }
  std::printf("%s start-up log vs memfit (%s)\n\n", logged["engine"].get<std::string>().c_str(),
              estimate["serving"]["engine_profile"].get<std::string>().c_str());
  std::printf("  %-24s %14s %14s %9s\n", "field", "logged", "memfit", "error");
  for (const json& r : rows)
    std::printf("  %-24s %14.2f %14.2f %+8.2f%%\n", r["field"].get<std::string>().c_str(), r["logged"].get<double>(),
                r["estimate"].get<double>(), r["error_pct"].get<double>());
  if (rows.empty()) std::printf("  (no figure recognised in the log)\n");
  return 0;
}

}  // namespace memfit::cli
