// `memfit validate` serving mode (issue 11): read a vLLM / SGLang start-up log, pull out the
// figures the engine printed, and hold them against memfit's task "serve" estimate field by
// field. `--serve-launch` starts the engine itself on a GPU machine and reads its log.
//
//   memfit validate --serve-log LOG.txt --request REQUEST.json [--json]
//   memfit validate --serve-launch REQUEST.json --model-path PATH [--timeout S] [--json]   (GPU only)
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace memfit::cli {

/// The figures a start-up log prints (GiB as printed; absent keys were not printed):
/// engine, weights_gib, non_torch_gib, activation_peak_gib, kv_cache_gib, kv_cache_tokens,
/// num_gpu_blocks, max_concurrency, max_model_len, total_gpu_memory_gib,
/// gpu_memory_utilization, cuda_graph_gib. Lines of every rank repeat: the first one counts.
[[nodiscard]] nlohmann::json parse_serve_log(const std::string& text);

/// True when `args` ask for the serving mode (--serve-log / --serve-launch).
[[nodiscard]] bool is_serve_validate(const std::vector<std::string>& args);
int run_serve_validate(const std::vector<std::string>& args);

}  // namespace memfit::cli
