// memfit: serving capacity — how a serving engine (vLLM, SGLang) sizes its KV cache at
// start-up, and so what context length and how many concurrent requests fit.
//
// The engines grab everything their memory budget leaves after weights and a profile run, so
// the answer users want is the inversion "this model, these GPUs -> KV tokens, blocks, max
// concurrency, longest max_model_len". The accounting follows each engine's own code, version
// by version; the differences between versions are rows of a table (EngineProfile), not
// branches. Sources are cited next to each table row in serving.cpp.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "memfit/checked.hpp"
#include "memfit/request.hpp"

namespace memfit {

/// What the engine subtracts from its budget before the KV cache.
enum class ServeBudget {
  UtilMinusPeak,        ///< vLLM V0 and early V1: total x util - (torch peak + non-torch incl. CUDA context)
  UtilMinusIncrease,    ///< vLLM >= 0.9: total x util - (weights + activation peak + non-torch increase since start)
  StaticMinusUsed,      ///< SGLang: total x mem_fraction_static - memory used after loading (activations not counted)
};

/// How the engine reports "maximum concurrency" (the start-up log line).
enum class ServeConcurrency {
  TokensOverLen,        ///< KV tokens / max_model_len (vLLM V0, V1 <= 0.8, SGLang by our definition)
  BlocksPerRequest,     ///< vLLM >= 0.9: num_blocks / blocks one max_model_len request needs (windows honoured)
};

/// How the engine picks its default budget fraction.
enum class ServeFraction {
  Fixed,                ///< one value (vLLM gpu_memory_utilization)
  ByTpSize,             ///< SGLang <= 0.4.6: 0.88 / 0.87 / 0.85 / 0.83 / 0.79 by TP size
  ByGpuMemory,          ///< SGLang >= 0.4.7: (memory - reserved(GPU size, TP x PP)) / memory
};

/// One engine version range and its accounting rules.
struct EngineProfile {
  const char* engine;            ///< "vllm" | "sglang"
  const char* label;             ///< "vLLM 0.10 (V1)"
  u64 first_version;             ///< major * 10000 + minor * 100 + patch, inclusive
  ServeBudget budget;
  ServeConcurrency concurrency;
  ServeFraction fraction;
  double default_fraction;       ///< gpu_memory_utilization / mem_fraction_static when Fixed
  bool hybrid_kv;                ///< sliding-window layers keep only their window (vLLM hybrid KV manager)
  bool chunked_prefill_default;  ///< profile run of max_num_batched_tokens (else max(max_model_len, 2048))
  bool cuda_graph_in_budget;     ///< graphs captured before the KV cache is sized
  u64 default_block_size;        ///< vLLM block_size / SGLang page_size
  double non_torch_gib;          ///< non-torch memory counted against the budget at TP 1 (cuBLAS, context when counted)
  double non_torch_tp_gib;       ///< extra per GPU when TP > 1 (NCCL + custom all-reduce buffers)
  const char* source;            ///< where the rules were read
};

/// The version table (newest last per engine).
[[nodiscard]] const std::vector<EngineProfile>& engine_profiles();
/// The profile of an engine + version ("" = newest). Throws Error naming the known ones.
[[nodiscard]] const EngineProfile& engine_profile(const std::string& engine, const std::string& version);

/// KV cache bytes one token occupies on one GPU, per layer kind.
struct KvPerToken {
  u64 full_layers = 0;           ///< layers caching every token (on this rank)
  u64 window_layers = 0;         ///< sliding-window layers (on this rank)
  u64 window = 0;                ///< their window (tokens)
  u64 bytes_per_layer = 0;       ///< one token, one layer, this rank (K + V, or MLA latent + rope key)
  [[nodiscard]] u64 bytes_all_layers() const { return mul(bytes_per_layer, add(full_layers, window_layers)); }
};
/// `kv_bits`: bits per cached element; `tp`: KV heads split over TP (replicated when tp > heads);
/// `latent`: MLA caches kv_lora_rank + qk_rope_head_dim per token, shared by all heads.
[[nodiscard]] KvPerToken kv_per_token(const ModelSpec& m, u64 kv_bits, u64 tp, bool latent = true);

/// A single change that would make the setup fit, with its effect.
struct ServeFix {
  std::string change;            ///< "tensor_parallel_size 2", "kv_cache_dtype fp8", ...
  u64 kv_cache_tokens = 0;       ///< KV tokens per GPU after the change
  double max_concurrency = 0;
  std::string detail;
};

/// Per-GPU figures of the engine's start-up accounting.
struct ServingEstimate {
  const EngineProfile* profile = nullptr;
  u64 gpu_memory_bytes = 0;
  double fraction = 0;                 ///< gpu_memory_utilization / mem_fraction_static used
  u64 budget_bytes = 0;                ///< fraction x total
  u64 weights_bytes = 0;               ///< "Model loading took" (per rank)
  u64 activation_peak_bytes = 0;       ///< torch peak increase of the profile run
  u64 non_torch_bytes = 0;             ///< counted against the budget
  u64 cuda_graph_bytes = 0;            ///< CUDA graph pool (outside the budget unless the profile says so)
  u64 kv_cache_bytes = 0;              ///< "Available KV cache memory"
  u64 kv_bytes_per_token = 0;          ///< all layers of this rank
  u64 block_bytes = 0;                 ///< one block of all layers of this rank
  u64 num_gpu_blocks = 0;
  u64 kv_cache_tokens = 0;             ///< "GPU KV cache size: N tokens"
  double max_concurrency = 0;          ///< "Maximum concurrency for max_model_len tokens per request"
  u64 max_model_len = 0;
  u64 max_model_len_that_fits = 0;     ///< longest one request the KV cache holds (0: none)
  u64 max_num_seqs = 0, max_num_batched_tokens = 0, block_size = 0;
  u64 tp = 1, pp = 1, dp = 1, ep = 1;
  u64 shortfall_bytes = 0;             ///< memory missing for one max_model_len request (0: fits)
  bool fits = false;
  std::vector<ServeFix> fixes;         ///< when it does not fit: single changes that would
  std::vector<std::string> notes;
};

/// Reads the "serving" request object into `s` (unknown fields are errors naming the known ones).
void parse_serving_setup(const nlohmann::json& j, ServingSetup& s);
[[nodiscard]] nlohmann::json serving_setup_to_json(const ServingSetup& s);

/// The engine's start-up accounting for `r` (task "serve"). Throws Error for combinations the
/// engine rejects (naming the alternative).
[[nodiscard]] ServingEstimate serve(const Request& r);
[[nodiscard]] nlohmann::json serving_to_json(const ServingEstimate& e);

/// One serving layout of a cluster: TP x PP GPUs per replica, `replicas` of them.
struct ServeLayout {
  u64 tp = 1, pp = 1, replicas = 1;
  bool expert_parallel = false;
  std::string label;               ///< "TP 4 x PP 1, 2 replicas (EP)"
  bool fits = false;
  ServingEstimate per_gpu;
  double concurrency_per_replica = 0;  ///< requests of `context` tokens one replica's KV cache holds
  double concurrency_total = 0;        ///< x replicas
  u64 unused_gpus = 0;                 ///< GPUs left over when num_gpus is not a multiple of tp x pp
};
struct ServePlan {
  u64 context = 0;                     ///< the target context (serving.max_model_len)
  std::vector<ServeLayout> layouts;    ///< fitting first, most total concurrency first
  std::string recommendation;
};
/// Serving mode of the planner: every TP (dividing the attention heads) x PP layout of
/// r.num_gpus GPUs, the rest as data-parallel replicas; tokens/s are not estimated (no
/// published serving benchmark in data/ justifies a throughput model yet).
[[nodiscard]] ServePlan plan_serving(const Request& r);
[[nodiscard]] nlohmann::json serve_plan_to_json(const ServePlan& p);

/// Parses "0.10.1" / "v0.4.6.post1" into major * 10000 + minor * 100 + patch (0 if unreadable).
[[nodiscard]] u64 parse_engine_version(const std::string& v);

}  // namespace memfit
