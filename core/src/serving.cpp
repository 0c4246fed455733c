// Serving engines' start-up accounting (see serving.hpp): budget, weights per rank, profile-run
// activation peak, non-torch memory, CUDA graphs, then the KV cache in blocks and tokens.
//
// Read from the engines' sources (stored snapshots, read through the project's search tools):
//  vLLM  vllm/v1/worker/gpu_worker.py determine_available_memory: KV = total x
//        gpu_memory_utilization - non-KV memory (early V1: torch peak + all non-torch memory;
//        >= 0.9: weights + torch peak increase + non-torch increase since the worker started,
//        so the CUDA context is outside the budget).
//        vllm/v1/core/kv_cache_utils.py: num_blocks = available // page_size // layers;
//        "GPU KV cache size" = num_blocks // groups * block_size; max concurrency = num_blocks /
//        blocks one max_model_len request needs (get_max_concurrency_for_kv_cache_config);
//        hybrid models (sliding window + full) get one group per `group_size` layers of a kind.
//        V0 / V1 <= 0.8 logged num_tokens / max_model_len (vllm PR #13596).
//  SGLang python/sglang/srt/model_executor/model_runner.py profile_max_num_token: rest =
//        available-after-load - total x (1 - mem_fraction_static); tokens = rest // cell_size,
//        cell = kv_heads/tp x head_dim x 2 x layers x dtype (MLA: kv_lora_rank + rope dim).
//        server_args.py: mem_fraction_static by TP size (<= 0.4.6) or by GPU size (later).
#include "memfit/serving.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>

#include "memfit/error.hpp"
#include "memfit/gpus.hpp"
#include "parallel.hpp"
#include "states.hpp"
#include "json_object.hpp"

namespace memfit {

using nlohmann::json;
using detail::json_object;

namespace {

constexpr double kGiB = 1073741824.0;

// One row per engine version range where the accounting changed. non_torch_* were not read
// from a source (they are allocations the engines measure): see data/calibration/serving_logs.json
// for the logs they were set on (role "fit").
const std::vector<EngineProfile> kProfiles = {
    {"vllm", "vLLM 0.6.0-0.6.4 (V0 engine)", 600, ServeBudget::UtilMinusPeak, ServeConcurrency::TokensOverLen,
     ServeFraction::Fixed, 0.90, false, false, false, 16, 0.0, 0.55,
     "vllm/worker/worker.py determine_num_available_blocks (peak torch memory + non-torch memory)"},
    // PR #10511 (0.6.5) measures non-torch memory against a baseline taken before the model
    // loads. Its own example printed 1.79 GiB (H100, TP 1), later 0.7-0.8 logs 0.2-0.45 GiB
    // (RTX 4090 TP 2, A100-40GB TP 4): the row keeps the CUDA context only, nothing fitted.
    {"vllm", "vLLM 0.6.5-0.7 (V0 engine, PR #10511 profiling)", 605, ServeBudget::UtilMinusPeak,
     ServeConcurrency::TokensOverLen, ServeFraction::Fixed, 0.90, false, false, false, 16, 0.0, 0.1,
     "vllm/worker/worker.py determine_num_available_blocks (memory_profiling, PR #10511)"},
    {"vllm", "vLLM 0.8 (V1 engine)", 800, ServeBudget::UtilMinusPeak, ServeConcurrency::TokensOverLen,
     ServeFraction::Fixed, 0.90, false, true, false, 16, 0.0, 0.55,
     "vllm/v1/worker/gpu_worker.py determine_available_memory (peak + non-torch allocations)"},
    {"vllm", "vLLM 0.9 (V1 engine)", 900, ServeBudget::UtilMinusIncrease, ServeConcurrency::BlocksPerRequest,
     ServeFraction::Fixed, 0.90, false, true, false, 16, 0.10, 0.55,
     "vllm/v1/worker/gpu_worker.py (requested_memory - non_kv_cache_memory); kv_cache_utils.py"},
    {"vllm", "vLLM 0.10-0.20 (V1, hybrid KV manager)", 1000, ServeBudget::UtilMinusIncrease,
     ServeConcurrency::BlocksPerRequest, ServeFraction::Fixed, 0.90, true, true, false, 16, 0.10, 0.55,
     "vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size, _report_kv_cache_config"},
    // "the CUDA-graph memory profiling (default since v0.21)" takes the graph pool out of the
    // budget before the KV cache is sized (vLLM's own start-up note, quoted in
    // github.com/eugr/spark-vllm-docker/issues/396).
    // The stable docs (docs.vllm.ai/en/stable/cli/serve) give gpu_memory_utilization 0.92 by
    // default; the release that raised it from 0.9 was not established: taken as this row.
    {"vllm", "vLLM 0.21+ (V1, CUDA graphs profiled)", 2100, ServeBudget::UtilMinusIncrease,
     ServeConcurrency::BlocksPerRequest, ServeFraction::Fixed, 0.92, true, true, true, 16, 0.10, 0.55,
     "vllm/v1/worker/gpu_worker.py (CUDA graph memory profiled into non-KV memory)"},
    {"sglang", "SGLang 0.3-0.4.6", 300, ServeBudget::StaticMinusUsed, ServeConcurrency::TokensOverLen,
     ServeFraction::ByTpSize, 0.88, false, true, true, 1, 0.0, 0.55,
     "sglang/srt/model_executor/model_runner.py profile_max_num_token; server_args.py __post_init__"},
    {"sglang", "SGLang 0.4.7+", 407, ServeBudget::StaticMinusUsed, ServeConcurrency::TokensOverLen,
     ServeFraction::ByGpuMemory, 0.88, false, true, true, 1, 0.0, 0.55,
     "sglang/srt/server_args.py (reserved_mem by GPU memory and tp x pp)"},
};

/// SGLang >= 0.4.7 reserved memory (MiB) by GPU memory (MiB): (2.8 + parallel/10) GiB under
/// 35 GiB, (9.5 + parallel/2) under 90, (12 + parallel/2) under 160, else 32 GiB.
struct ReservedRow {
  double below_mib, base_gib, per_parallel_gib;
};
constexpr ReservedRow kSglangReserved[] = {
    {35 * 1024.0, 2.8, 0.1}, {90 * 1024.0, 9.5, 0.5}, {160 * 1024.0, 12.0, 0.5}, {1e18, 32.0, 0.0}};
/// SGLang <= 0.4.6 mem_fraction_static by TP size (first row whose tp_at_least <= tp).
struct TpFractionRow {
  u64 tp_at_least;
  double fraction;
};
constexpr TpFractionRow kSglangTpFraction[] = {{16, 0.79}, {8, 0.81}, {4, 0.85}, {2, 0.87}, {1, 0.88}};

/// vLLM V1 scheduler defaults (vllm/engine/arg_utils.py _set_default_args_v1): larger batches
/// on >= 70 GiB GPUs that are not A100s; `vllm serve` and the offline LLM class differ.
struct VllmDefaultRow {
  bool big_gpu, llm_class;
  u64 max_num_batched_tokens, max_num_seqs;
};
constexpr VllmDefaultRow kVllmDefaults[] = {{true, false, 8192, 1024},
                                            {true, true, 16384, 1024},
                                            {false, false, 2048, 256},
                                            {false, true, 8192, 256}};

/// Sampler work per (request x vocabulary entry) in the profile's dummy sampler run: the
/// half-precision logits, their fp32 copy, the temperature-scaled logits, the probabilities and
/// the exponential noise of random sampling (vllm/v1/sample/sampler.py), 2 + 4 x 4 bytes.
constexpr u64 kSamplerBytesPerLogit = 18;

/// vLLM V1 CUDA graph capture sizes (compilation config default): 1, 2, 4, then 8..512 step 8,
/// capped at max_num_seqs. Each graph keeps its kernel nodes; the pool holds the largest
/// batch's activations. Per-graph bytes per layer: a rough figure (not checked against logs).
constexpr u64 kGraphBytesPerLayer = 64 * 1024;

/// The total the engines budget from (torch.cuda.mem_get_info), below nvidia-smi's total by
/// what the driver keeps. Where public start-up logs print it: H100 80GB 79.11-79.33 GiB in
/// vLLM logs quoted in public repositories (79.19 taken; also the research notes' "physical
/// 79.19 GiB"), A100-40GB 39.38 GiB (vllm issue #16570), RTX 3090 23.58 GiB (vllm issue #14447).
/// Used only when the request names a catalog GPU without its own memory_gib.
struct VisibleRow {
  const char* gpu;
  double gib;
};
constexpr VisibleRow kCudaVisible[] = {{"H100-SXM-80GB", 79.19}, {"A100-40GB", 39.38}, {"RTX3090-24GB", 23.58}};

u64 cuda_visible_bytes(const GpuSetup& g) {
  const GpuSpec* spec = find_gpu(g.name);
  if (!spec || spec->memory_bytes != g.memory_bytes) return g.memory_bytes;  // a size the user gave
  for (const VisibleRow& row : kCudaVisible)
    if (g.name == row.gpu) return static_cast<u64>(row.gib * 1073741824.0);
  return g.memory_bytes;
}

[[noreturn]] void bad(const std::string& what) { throw Error(what); }

u64 whole(const json& v, const char* field, u64 lo, u64 hi) {
  if (v.is_number_integer() && v.get<std::int64_t>() >= static_cast<std::int64_t>(lo) &&
      static_cast<u64>(v.get<std::int64_t>()) <= hi)
    return static_cast<u64>(v.get<std::int64_t>());
  bad(std::string("request field \"serving.") + field + "\" must be a whole number from " + std::to_string(lo) + " to " +
      std::to_string(hi) + "; got " + v.dump());
}

double fraction(const json& v, const char* field) {
  if (v.is_number() && v.get<double>() > 0 && v.get<double>() <= 1) return v.get<double>();
  bad(std::string("request field \"serving.") + field + "\" must be a fraction above 0 and at most 1 (e.g. 0.9); got " + v.dump());
}

bool flag(const json& v, const char* field) {
  if (!v.is_boolean()) bad(std::string("request field \"serving.") + field + "\" must be true or false");
  return v.get<bool>();
}

struct KvDtypeRow {
  const char* name;
  u64 bits;
};
constexpr KvDtypeRow kKvDtypes[] = {{"auto", 0}, {"bf16", 16}, {"fp16", 16}, {"fp8", 8}, {"fp8_e4m3", 8}, {"fp8_e5m2", 8}};

}  // namespace

u64 parse_engine_version(const std::string& v) {
  u64 parts[3] = {0, 0, 0};
  size_t i = (!v.empty() && (v[0] == 'v' || v[0] == 'V')) ? 1 : 0;
  for (int k = 0; k < 3 && i < v.size(); ++k) {
    if (!std::isdigit(static_cast<unsigned char>(v[i]))) return 0;
    while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])) && parts[k] < 1000) parts[k] = parts[k] * 10 + (v[i++] - '0');
    if (i < v.size() && v[i] == '.') ++i;
    else break;
  }
  if (parts[1] > 99 || parts[2] > 99) return 0;
  return parts[0] * 10000 + parts[1] * 100 + parts[2];
}

const std::vector<EngineProfile>& engine_profiles() { return kProfiles; }

const EngineProfile& engine_profile(const std::string& engine, const std::string& version) {
  const EngineProfile* found = nullptr;
  const u64 want = version.empty() ? ~u64{0} : parse_engine_version(version);
  std::string known;
  for (const EngineProfile& p : kProfiles) {
    if (engine != p.engine) continue;
    known += (known.empty() ? "" : ", ") + std::string(p.label);
    if (p.first_version <= want) found = &p;
  }
  if (known.empty()) bad("serving.engine must be \"vllm\" or \"sglang\"; got \"" + engine + "\"");
  if (!version.empty() && want == 0) bad("serving.engine_version \"" + version + "\" is not a version like \"0.10.1\"");
  if (!found) bad("memfit models " + engine + " from version " + known + "; \"" + version + "\" is older: use one of those");
  return *found;
}

void parse_serving_setup(const json& j, ServingSetup& s) {
  if (!j.is_object()) bad("request field \"serving\" must be an object like {\"engine\": \"vllm\", \"max_model_len\": 8192}");
  static const char* kKnown[] = {"engine", "engine_version", "gpu_memory_utilization", "mem_fraction_static", "max_model_len",
                                 "context_length", "max_num_seqs", "max_running_requests", "max_num_batched_tokens",
                                 "chunked_prefill_size", "max_total_tokens", "block_size", "page_size", "kv_cache_dtype",
                                 "enforce_eager", "disable_cuda_graph", "tensor_parallel_size", "tp_size",
                                 "pipeline_parallel_size", "pp_size", "data_parallel_size", "dp_size",
                                 "enable_expert_parallel", "usage_context"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find_if(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return it.key() == k; }) != std::end(kKnown)) continue;
    std::string list;
    for (const char* k : kKnown) list += (list.empty() ? "" : ", ") + std::string(k);
    bad("unknown field \"" + it.key() + "\" in \"serving\" (known: " + list + ")");
  }
  if (j.contains("engine")) {
    if (!j["engine"].is_string()) bad("request field \"serving.engine\" must be \"vllm\" or \"sglang\"");
    s.engine = j["engine"].get<std::string>();
  }
  if (j.contains("engine_version")) {
    if (!j["engine_version"].is_string()) bad("request field \"serving.engine_version\" must be a string like \"0.10.1\"");
    s.engine_version = j["engine_version"].get<std::string>();
  }
  (void)engine_profile(s.engine, s.engine_version);  // reject unknown engines / versions now
  constexpr u64 kMaxTokens = u64{1} << 30;
  // vLLM's names, then SGLang's names for the same knob.
  auto take = [&](const char* a, const char* b, auto&& read) {
    if (j.contains(a)) read(j[a], a);
    else if (b && j.contains(b)) read(j[b], b);
  };
  if (j.contains("gpu_memory_utilization")) s.gpu_memory_utilization = fraction(j["gpu_memory_utilization"], "gpu_memory_utilization");
  if (j.contains("mem_fraction_static")) s.mem_fraction_static = fraction(j["mem_fraction_static"], "mem_fraction_static");
  take("max_model_len", "context_length", [&](const json& v, const char* f) { s.max_model_len = whole(v, f, 1, kMaxTokens); });
  take("max_num_seqs", "max_running_requests", [&](const json& v, const char* f) { s.max_num_seqs = whole(v, f, 1, 1 << 20); });
  if (j.contains("max_num_batched_tokens")) s.max_num_batched_tokens = whole(j["max_num_batched_tokens"], "max_num_batched_tokens", 1, kMaxTokens);
  if (j.contains("chunked_prefill_size")) s.chunked_prefill_size = whole(j["chunked_prefill_size"], "chunked_prefill_size", 1, kMaxTokens);
  if (j.contains("max_total_tokens")) s.max_total_tokens = whole(j["max_total_tokens"], "max_total_tokens", 1, kMaxTokens);
  take("block_size", "page_size", [&](const json& v, const char* f) { s.block_size = whole(v, f, 1, 1024); });
  take("enforce_eager", "disable_cuda_graph", [&](const json& v, const char* f) { s.enforce_eager = flag(v, f); });
  take("tensor_parallel_size", "tp_size", [&](const json& v, const char* f) { s.tensor_parallel_size = whole(v, f, 1, 1024); });
  take("pipeline_parallel_size", "pp_size", [&](const json& v, const char* f) { s.pipeline_parallel_size = whole(v, f, 1, 1024); });
  take("data_parallel_size", "dp_size", [&](const json& v, const char* f) { s.data_parallel_size = whole(v, f, 1, 1024); });
  if (j.contains("enable_expert_parallel")) s.enable_expert_parallel = flag(j["enable_expert_parallel"], "enable_expert_parallel");
  if (j.contains("usage_context")) {
    const json& u = j["usage_context"];
    if (!(u.is_string() && (u == "serve" || u == "llm")))
      bad("request field \"serving.usage_context\" must be \"serve\" (vllm serve, the default) or \"llm\" (offline LLM class)");
    s.llm_class = u == "llm";
  }
  if (j.contains("kv_cache_dtype")) {
    const json& v = j["kv_cache_dtype"];
    std::string names;
    for (const KvDtypeRow& row : kKvDtypes) {
      if (v.is_string() && v.get<std::string>() == row.name) {
        s.kv_cache_bits = row.bits;
        return;
      }
      names += (names.empty() ? "\"" : ", \"") + std::string(row.name) + "\"";
    }
    bad("request field \"serving.kv_cache_dtype\" must be one of " + names + "; got " + v.dump());
  }
}

json serving_setup_to_json(const ServingSetup& s) {
  return json_object({{"engine", s.engine},
                      {"engine_version", s.engine_version},
                      {"gpu_memory_utilization", s.gpu_memory_utilization},
                      {"mem_fraction_static", s.mem_fraction_static},
                      {"max_model_len", s.max_model_len},
                      {"max_num_seqs", s.max_num_seqs},
                      {"max_num_batched_tokens", s.max_num_batched_tokens},
                      {"chunked_prefill_size", s.chunked_prefill_size},
                      {"max_total_tokens", s.max_total_tokens},
                      {"block_size", s.block_size},
                      {"kv_cache_dtype", s.kv_cache_bits == 0 ? "auto" : s.kv_cache_bits == 8 ? "fp8" : "bf16"},
                      {"enforce_eager", s.enforce_eager},
                      {"tensor_parallel_size", s.tensor_parallel_size},
                      {"pipeline_parallel_size", s.pipeline_parallel_size},
                      {"data_parallel_size", s.data_parallel_size},
                      {"enable_expert_parallel", s.enable_expert_parallel},
                      {"usage_context", s.llm_class ? "llm" : "serve"}});
}

KvPerToken kv_per_token(const ModelSpec& m, u64 kv_bits, u64 tp, bool latent) {
  KvPerToken k;
  for (const LayerGroup& g : m.groups) {
    if (g.sliding_window > 0) {
      k.window_layers = add(k.window_layers, g.count);
      k.window = std::max(k.window, g.sliding_window);
    } else {
      k.full_layers = add(k.full_layers, g.count);
    }
  }
  if (m.attention == AttentionKind::MultiLatent && latent) {
    // one latent vector + the shared rope key per token, the same on every TP rank
    k.bytes_per_layer = bytes_of_bits(add(m.kv_lora_rank, m.qk_rope_head_dim), kv_bits);
  } else {
    // KV heads split over TP; with fewer KV heads than ranks each rank keeps one (replicated)
    const u64 heads = m.kv_heads >= tp ? div_ceil(m.kv_heads, tp) : 1;
    k.bytes_per_layer = bytes_of_bits(mul(heads, add(m.head_dim, m.v_head_dim)), kv_bits);
  }
  return k;
}

namespace {

/// The request resolved against the engine version's defaults.
struct Resolved {
  const EngineProfile* profile = nullptr;
  double fraction = 0;
  u64 tp = 1, pp = 1, dp = 1, ep = 1;
  u64 block = 16, max_model_len = 0, batched_tokens = 0, max_num_seqs = 0;
  u64 kv_bits = 16, weight_bytes = 2;
  bool vllm = true;
};

bool is_moe(const ModelSpec& m) {
  return std::any_of(m.groups.begin(), m.groups.end(), [](const LayerGroup& g) { return g.moe; });
}

double default_fraction(const EngineProfile& p, const ServingSetup& s, u64 gpu_bytes) {
  const u64 tp = s.tensor_parallel_size;
  switch (p.fraction) {
    case ServeFraction::Fixed: return p.default_fraction;
    case ServeFraction::ByTpSize:
      for (const TpFractionRow& row : kSglangTpFraction)
        if (tp >= row.tp_at_least) return row.fraction;
      return p.default_fraction;
    case ServeFraction::ByGpuMemory: {
      const double mib = static_cast<double>(gpu_bytes) / 1048576.0;
      const double parallel = static_cast<double>(tp * s.pipeline_parallel_size);
      for (const ReservedRow& row : kSglangReserved)
        if (mib < row.below_mib) return std::round((mib - (row.base_gib + parallel * row.per_parallel_gib) * 1024) / mib * 1000) / 1000;
      return p.default_fraction;
    }
  }
  return p.default_fraction;
}

/// Engine checks that reject a layout, with the alternative named.
void check_layout(const ModelSpec& m, const Resolved& x, const ServingSetup& s) {
  if (m.heads % x.tp != 0) {
    std::string ok;
    for (u64 t = 1; t <= m.heads && t <= 64; t *= 2)
      if (m.heads % t == 0) ok += (ok.empty() ? "" : ", ") + std::to_string(t);
    bad("tensor_parallel_size " + std::to_string(x.tp) + " does not divide num_attention_heads (" + std::to_string(m.heads) +
        "), which the engine requires: use tensor_parallel_size " + ok +
        ", and more GPUs as pipeline_parallel_size or data_parallel_size (replicas)");
  }
  if (x.pp > m.layers) bad("pipeline_parallel_size " + std::to_string(x.pp) + " exceeds the model's " + std::to_string(m.layers) + " layers");
  if (s.enable_expert_parallel && !is_moe(m)) bad("enable_expert_parallel needs a mixture-of-experts model; this one is dense: drop it");
  if (!x.vllm && x.pp > 1 && m.attention == AttentionKind::MultiLatent)
    bad("SGLang's MLA backend does not run with pipeline parallelism (model_runner asserts pp_size == 1): use tp_size instead");
}

Resolved resolve(const Request& r) {
  const ServingSetup& s = r.serving;
  const ModelSpec& m = r.model;
  Resolved x;
  x.profile = &engine_profile(s.engine, s.engine_version);
  x.vllm = std::string(x.profile->engine) == "vllm";
  x.tp = s.tensor_parallel_size;
  x.pp = s.pipeline_parallel_size;
  x.dp = s.data_parallel_size;
  x.ep = s.enable_expert_parallel ? x.tp * x.dp : 1;
  const double chosen = x.vllm ? s.gpu_memory_utilization : s.mem_fraction_static;
  x.fraction = chosen > 0 ? chosen : default_fraction(*x.profile, s, r.gpu.memory_bytes);
  if (!(x.fraction > 0 && x.fraction <= 1))
    bad("SGLang reserves more than this GPU's memory by default: set serving.mem_fraction_static (e.g. 0.8)");
  x.block = s.block_size ? s.block_size : x.profile->default_block_size;
  x.max_model_len = s.max_model_len ? s.max_model_len : m.max_positions;
  if (x.max_model_len == 0)
    bad("the config gives no max_position_embeddings: set serving.max_model_len (the longest request to serve)");
  x.weight_bytes = r.precision == Precision::Fp32 ? 4 : 2;
  x.kv_bits = s.kv_cache_bits ? s.kv_cache_bits : 8 * x.weight_bytes;
  const bool big_gpu = r.gpu.memory_bytes >= u64{70} << 30 && r.gpu.name.find("A100") == std::string::npos;
  u64 def_tokens = 2048, def_seqs = 256;
  for (const VllmDefaultRow& row : kVllmDefaults)
    if (row.big_gpu == big_gpu && row.llm_class == s.llm_class) def_tokens = row.max_num_batched_tokens, def_seqs = row.max_num_seqs;
  if (!x.vllm) {
    // SGLang chunked_prefill_size: 2048 under 35 GiB (25 GB before 0.4.7), 8192 below 160 GiB, else 16384
    const double gib = static_cast<double>(r.gpu.memory_bytes) / kGiB;
    def_tokens = gib < 35 ? 2048 : gib < 160 ? 8192 : 16384;
  } else if (!x.profile->chunked_prefill_default) {
    // V0 without chunked prefill profiles one max_model_len prompt (chunked prefill, 2048 tokens
    // per step, is the default above 32K: vllm/engine/arg_utils.py)
    def_seqs = 256;
    def_tokens = x.max_model_len <= 32768 ? std::max<u64>(x.max_model_len, 2048) : 2048;
  }
  x.batched_tokens = s.max_num_batched_tokens ? s.max_num_batched_tokens : s.chunked_prefill_size ? s.chunked_prefill_size : def_tokens;
  x.max_num_seqs = s.max_num_seqs ? s.max_num_seqs : def_seqs;
  check_layout(m, x, s);
  if ((r.quantization == Quantization::Mxfp4 || r.quantization == Quantization::Nvfp4) && x.vllm && x.profile->first_version < 1000)
    bad("vLLM loads MXFP4/NVFP4 checkpoints from 0.10 on: set serving.engine_version to \"0.10.0\" or later");
  if (r.quantization == Quantization::Nf4Double) bad("serving engines load bitsandbytes NF4 without double quantization: use quantization \"nf4\"");
  return x;
}

/// Weights on the busiest rank (bytes): TP splits the column/row Linears and the vocabulary
/// (vocab-parallel embedding and head); norms, routers and biases of row Linears stay whole.
/// MoE experts are sharded over tp x dp ranks (vLLM's MoE layers use the whole tp x dp group,
/// as experts under expert parallelism or TP-sharded otherwise). PP: layers split by stage,
/// embedding on the first, head on the last (a tied head is a copy there).
u64 weights_per_rank(const Request& r, const Resolved& x) {
  Request q = r;
  q.task = Task::Inference;
  q.precision = x.weight_bytes == 4 ? Precision::Fp32 : Precision::Bf16;
  const detail::ModelStates st = detail::model_states(q, detail::MixedMode::None);
  const ModelSpec& m = r.model;
  const u64 moe_shards = is_moe(m) ? mul(x.tp, x.dp) : x.tp;
  u64 layers = 0;
  for (size_t i = 0; i < m.groups.size(); ++i) {
    const LayerGroup& g = m.groups[i];
    u64 routed = 0, split = 0;
    for (const Linear& l : g.linears) {
      if (l.split != TpSplit::Replicated) split = add(split, l.params());
      if (l.routed) routed = add(routed, l.params());
    }
    const u64 routed_w = detail::scale(st.groups[i].w_split, routed, std::max<u64>(split, 1));
    const u64 per_layer = add(div_ceil(st.groups[i].w_split - routed_w, x.tp), add(div_ceil(routed_w, moe_shards), st.groups[i].w_repl));
    layers = add(layers, mul(div_ceil(mul(g.count, div_ceil(m.layers, x.pp)), m.layers), per_layer));
  }
  const u64 emb = div_ceil(st.emb_w, x.tp);
  const u64 head = add(div_ceil(m.tied_embeddings ? st.emb_w : st.head_w_split, x.tp), st.head_w_repl);
  // the rotary cos/sin cache: [max_position, rotary dim] in the model dtype (one, shared)
  const u64 rope = m.learned_positions || m.alibi ? 0
                   : mul(m.max_positions, m.attention == AttentionKind::MultiLatent ? m.qk_rope_head_dim : m.head_dim, x.weight_bytes);
  const u64 ends = x.pp == 1 ? add(emb, m.tied_embeddings ? st.head_w_repl : head) : std::max(emb, head);
  return add(add(layers, ends), rope);
}

/// Torch peak increase of the engine's profile run (vLLM): one forward over `batched_tokens`
/// tokens, then the dummy sampler over min(max_num_seqs, tokens) requests. Within a decoder
/// layer the fused kernels keep the hidden state and residual ([T, h] each) and, at the MLP,
/// the gate_up output [T, 2i/tp] and the activation [T, i/tp] (MoE: fused_moe's per-slot
/// caches [T k, max(2i, h)] and [T k, i] over the expert shard), or at attention q/k/v and
/// the output.
u64 activation_peak(const ModelSpec& m, const Resolved& x) {
  const u64 T = x.batched_tokens, tp = x.tp, b = x.weight_bytes;
  u64 widest = 0;
  for (const LayerGroup& g : m.groups) {
    const u64 attn = div_ceil(add(mul(m.heads, add(m.head_dim, m.v_head_dim)), mul(2, m.kv_heads, m.head_dim)), tp);
    u64 mlp = 0;
    if (g.moe) {
      const u64 i = div_ceil(g.mlp_intermediate, tp);
      mlp = add(mul(g.experts_per_token, add(std::max(mul(2, i), m.hidden), i)), mul(3, div_ceil(g.shared_intermediate, tp)));
    } else {
      mlp = mul(3, div_ceil(g.mlp_intermediate, tp));
    }
    widest = std::max(widest, std::max(attn, mlp));
  }
  const u64 forward = mul(T, b, add(widest, mul(2, m.hidden)));
  const u64 reqs = std::min(x.max_num_seqs, T);
  const u64 sampler = add(mul(T, b, m.hidden), mul(reqs, m.vocab, kSamplerBytesPerLogit));
  return std::max(forward, sampler);
}

u64 non_torch(const Request& r, const Resolved& x) {
  const EngineProfile& p = *x.profile;
  u64 bytes = static_cast<u64>(p.non_torch_gib * kGiB);
  if (x.tp * x.pp > 1) bytes = add(bytes, static_cast<u64>(p.non_torch_tp_gib * kGiB));
  const bool counts_context = p.budget != ServeBudget::UtilMinusIncrease;
  if (counts_context) {
    const GpuSpec* g = find_gpu(r.gpu.name);
    bytes = add(bytes, r.runtime.cuda_context_bytes ? r.runtime.cuda_context_bytes : g ? g->cuda_context_bytes : u64{500} << 20);
  }
  return bytes;
}

/// CUDA graph pool: the largest captured decode batch's activations plus per-graph kernel nodes.
u64 cuda_graph_bytes(const ModelSpec& m, const Resolved& x, const ServingSetup& s) {
  if (s.enforce_eager) return 0;
  const u64 largest = std::min<u64>(x.vllm ? 512 : 160, x.max_num_seqs);
  const u64 graphs = (largest >= 1) + (largest >= 2) + (largest >= 4) + largest / 8;  // 1, 2, 4, 8, 16, ...
  Resolved d = x;
  d.batched_tokens = largest;
  d.max_num_seqs = 0;
  return add(activation_peak(m, d), mul(graphs, div_ceil(m.layers, x.pp), kGraphBytesPerLayer));
}

/// How the KV pool divides into blocks and what one request needs.
struct KvLayout {
  KvPerToken per_token;
  u64 layers = 0;          ///< layers on this rank
  u64 full = 0, window = 0;///< of them: full-attention / sliding-window layers
  u64 group_size = 0;      ///< layers per KV cache group (vLLM hybrid manager)
  u64 groups = 1;
  u64 page = 0;            ///< one block of one layer (bytes)
  bool hybrid = false;
};

KvLayout kv_layout(const ModelSpec& m, const Resolved& x) {
  KvLayout k;
  k.per_token = kv_per_token(m, x.kv_bits, x.tp);
  const u64 stage = div_ceil(m.layers, x.pp);
  k.full = div_ceil(mul(k.per_token.full_layers, stage), m.layers);
  k.window = std::min(sub_floor(stage, k.full), k.per_token.window_layers);
  k.layers = add(k.full, k.window);
  k.page = mul(x.block, k.per_token.bytes_per_layer);
  k.hybrid = x.profile->hybrid_kv && k.window > 0 && k.full > 0;
  k.group_size = k.layers;
  if (k.hybrid) {
    const u64 lo = std::min(k.full, k.window), hi = std::max(k.full, k.window);
    k.group_size = 2 * hi < 3 * lo ? hi : lo;  // kv_cache_utils: the larger count when < 1.5 x the smaller
    k.groups = add(div_ceil(k.full, k.group_size), div_ceil(k.window, k.group_size));
  }
  return k;
}

/// Blocks (of all layers) one request of `len` tokens needs: full layers every token; window
/// layers (only with the hybrid manager, or when every layer is windowed) window - 1 + one
/// prefill chunk, plus one block.
u64 blocks_per_request(const KvLayout& k, const Resolved& x, u64 len) {
  const u64 full_blocks = div_ceil(len, x.block);
  const u64 win_tokens = std::min(len, sub_floor(add(k.per_token.window, x.batched_tokens), 1));
  const u64 win_blocks = add(div_ceil(win_tokens, x.block), 1);
  if (k.hybrid) return add(mul(div_ceil(k.full, k.group_size), full_blocks), mul(div_ceil(k.window, k.group_size), win_blocks));
  const bool all_window = k.full == 0 && k.window > 0 && x.profile->hybrid_kv;
  return all_window ? win_blocks : full_blocks;
}

/// Bytes the KV pool needs for one request of `len` tokens on this rank.
u64 request_bytes(const KvLayout& k, const Resolved& x, u64 len) {
  if (!x.vllm) return mul(len, k.per_token.bytes_per_layer, k.layers);
  return mul(blocks_per_request(k, x, len), k.page, k.group_size);
}

u64 longest_fitting(const KvLayout& k, const Resolved& x, u64 kv_bytes, u64 limit) {
  if (request_bytes(k, x, 1) > kv_bytes) return 0;
  u64 lo = 1, hi = limit;
  while (lo < hi) {
    const u64 mid = lo + (hi - lo + 1) / 2;
    if (request_bytes(k, x, mid) <= kv_bytes) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

ServingEstimate account(const Request& r) {
  const Resolved x = resolve(r);
  const ModelSpec& m = r.model;
  ServingEstimate e;
  e.profile = x.profile;
  e.gpu_memory_bytes = cuda_visible_bytes(r.gpu);
  e.fraction = x.fraction;
  e.budget_bytes = static_cast<u64>(std::floor(static_cast<double>(e.gpu_memory_bytes) * x.fraction));
  e.weights_bytes = weights_per_rank(r, x);
  const bool activations_counted = x.profile->budget != ServeBudget::StaticMinusUsed;
  e.activation_peak_bytes = activations_counted ? activation_peak(m, x) : 0;
  e.non_torch_bytes = non_torch(r, x);
  e.cuda_graph_bytes = cuda_graph_bytes(m, x, r.serving);
  u64 used = add(add(e.weights_bytes, e.activation_peak_bytes), e.non_torch_bytes);
  if (x.profile->cuda_graph_in_budget && x.vllm) used = add(used, e.cuda_graph_bytes);
  e.kv_cache_bytes = sub_floor(e.budget_bytes, used);
  e.max_model_len = x.max_model_len;
  e.max_num_seqs = x.max_num_seqs;
  e.max_num_batched_tokens = x.batched_tokens;
  e.block_size = x.block;
  e.tp = x.tp, e.pp = x.pp, e.dp = x.dp, e.ep = x.ep;

  const KvLayout k = kv_layout(m, x);
  e.kv_bytes_per_token = mul(k.per_token.bytes_per_layer, k.layers);
  e.block_bytes = mul(k.page, k.layers);
  if (x.vllm) {
    e.num_gpu_blocks = k.page && k.group_size ? e.kv_cache_bytes / k.page / k.group_size : 0;
    e.kv_cache_tokens = mul(e.num_gpu_blocks / k.groups, x.block);
    const u64 per_request = blocks_per_request(k, x, x.max_model_len);
    e.max_concurrency = x.profile->concurrency == ServeConcurrency::BlocksPerRequest && per_request > 0
                            ? static_cast<double>(e.num_gpu_blocks) / static_cast<double>(per_request)
                            : static_cast<double>(e.kv_cache_tokens) / static_cast<double>(x.max_model_len);
  } else {
    u64 tokens = e.kv_bytes_per_token ? e.kv_cache_bytes / e.kv_bytes_per_token : 0;
    if (r.serving.max_total_tokens) tokens = std::min(tokens, r.serving.max_total_tokens);
    e.kv_cache_tokens = tokens / x.block * x.block;
    e.num_gpu_blocks = e.kv_cache_tokens / x.block;
    e.max_concurrency = static_cast<double>(e.kv_cache_tokens) / static_cast<double>(x.max_model_len);
  }
  e.max_model_len_that_fits = longest_fitting(k, x, e.kv_cache_bytes, u64{1} << 30);
  const u64 need = request_bytes(k, x, x.max_model_len);
  e.fits = e.kv_cache_bytes > 0 && need <= e.kv_cache_bytes && e.weights_bytes <= r.gpu.memory_bytes;
  e.shortfall_bytes = e.fits ? 0 : sub_floor(add(need, used), e.budget_bytes);
  if (m.attention == AttentionKind::MultiLatent)
    e.notes.push_back("MLA: the cache holds the compressed latent (kv_lora_rank + qk_rope_head_dim) per token, the same on every TP rank");
  if (k.per_token.window_layers > 0 && !k.hybrid && x.vllm)
    e.notes.push_back(std::string(x.profile->label) + " caches every token in the sliding-window layers too (no hybrid KV manager)");
  if (m.kv_heads < x.tp && m.attention != AttentionKind::MultiLatent)
    e.notes.push_back("tensor_parallel_size exceeds the KV heads: each rank keeps a replicated KV head");
  if (x.dp > 1) e.notes.push_back("data_parallel_size " + std::to_string(x.dp) + ": each replica has this KV cache; total concurrency is " +
                                  std::to_string(x.dp) + " x the figure");
  return e;
}

/// Single changes that would make the setup fit, each evaluated by the same accounting.
std::vector<ServeFix> fixes_for(const Request& r, const ServingEstimate& e) {
  std::vector<ServeFix> out;
  auto attempt = [&](const std::string& change, Request q, const std::string& detail) {
    try {
      const ServingEstimate f = account(q);
      if (f.fits) out.push_back({change, f.kv_cache_tokens, f.max_concurrency, detail});
    } catch (const Error&) {
      // a change the engine rejects is not offered
    }
  };
  for (u64 tp = r.serving.tensor_parallel_size * 2; tp <= 64; tp *= 2) {
    Request q = r;
    q.serving.tensor_parallel_size = tp;
    const size_t before = out.size();
    attempt("tensor_parallel_size " + std::to_string(tp), q, std::to_string(tp) + " GPUs per replica");
    if (out.size() > before) break;
  }
  if (e.profile && r.serving.kv_cache_bits != 8) {
    Request q = r;
    q.serving.kv_cache_bits = 8;
    attempt("kv_cache_dtype fp8", q, "half the KV bytes per token");
  }
  if (e.max_model_len_that_fits > 0) {
    Request q = r;
    const u64 len = e.max_model_len_that_fits;
    q.serving.max_model_len = len;
    attempt("max_model_len " + std::to_string(len), q, "the longest request that fits");
  }
  if (r.quantization == Quantization::None) {
    for (Quantization qz : {Quantization::Fp8, Quantization::AwqInt4}) {
      Request q = r;
      q.quantization = qz;
      attempt(std::string("quantization ") + to_string(qz), q, "a quantized checkpoint");
    }
  }
  return out;
}

}  // namespace

ServingEstimate serve(const Request& r) {
  if (r.task != Task::Serve) bad("serving figures need task \"serve\"");
  ServingEstimate e = account(r);
  if (!e.fits) e.fixes = fixes_for(r, e);
  return e;
}

json serving_to_json(const ServingEstimate& e) {
  json fixes = json::array();
  for (const ServeFix& f : e.fixes)
    fixes.push_back(json_object({{"change", f.change}, {"kv_cache_tokens", f.kv_cache_tokens},
                                 {"max_concurrency", f.max_concurrency}, {"detail", f.detail}}));
  return json_object({{"engine", e.profile->engine},
                      {"engine_profile", e.profile->label},
                      {"engine_source", e.profile->source},
                      {"gpu_memory_bytes", e.gpu_memory_bytes},
                      {"memory_fraction", e.fraction},
                      {"budget_bytes", e.budget_bytes},
                      {"weights_bytes", e.weights_bytes},
                      {"activation_peak_bytes", e.activation_peak_bytes},
                      {"non_torch_bytes", e.non_torch_bytes},
                      {"cuda_graph_bytes", e.cuda_graph_bytes},
                      {"cuda_graph_in_budget", e.profile->cuda_graph_in_budget},
                      {"kv_cache_bytes", e.kv_cache_bytes},
                      {"kv_bytes_per_token", e.kv_bytes_per_token},
                      {"block_bytes", e.block_bytes},
                      {"num_gpu_blocks", e.num_gpu_blocks},
                      {"kv_cache_tokens", e.kv_cache_tokens},
                      {"max_concurrency", e.max_concurrency},
                      {"max_model_len", e.max_model_len},
                      {"max_model_len_that_fits", e.max_model_len_that_fits},
                      {"max_num_seqs", e.max_num_seqs},
                      {"max_num_batched_tokens", e.max_num_batched_tokens},
                      {"block_size", e.block_size},
                      {"tensor_parallel_size", e.tp},
                      {"pipeline_parallel_size", e.pp},
                      {"data_parallel_size", e.dp},
                      {"expert_parallel_size", e.ep},
                      {"fits", e.fits},
                      {"shortfall_bytes", e.shortfall_bytes},
                      {"fixes", fixes},
                      {"notes", e.notes}});
}

ServePlan plan_serving(const Request& r) {
  if (r.task != Task::Serve) bad("the serving planner needs task \"serve\"");
  ServePlan plan;
  const ModelSpec& m = r.model;
  const u64 n = r.num_gpus;
  for (u64 tp = 1; tp <= n && tp <= 64; tp *= 2) {
    if (m.heads % tp != 0) continue;  // the engines require heads divisible by TP
    for (u64 pp = 1; tp * pp <= n && pp <= m.layers; pp *= 2) {
      for (bool ep : {false, true}) {
        // MoE: the replicas can instead run as one data-parallel engine whose expert layers span
        // all tp x dp GPUs (vLLM DP + EP), so each GPU holds fewer experts and more KV cache.
        if (ep && (!is_moe(m) || n / (tp * pp) < 2 || pp > 1)) continue;
        Request q = r;
        q.serving.tensor_parallel_size = tp;
        q.serving.pipeline_parallel_size = pp;
        q.serving.data_parallel_size = ep ? n / (tp * pp) : 1;
        q.serving.enable_expert_parallel = ep;
        ServeLayout l;
        l.tp = tp, l.pp = pp, l.replicas = n / (tp * pp), l.expert_parallel = ep;
        l.unused_gpus = n - l.replicas * tp * pp;
        l.label = "TP " + std::to_string(tp) + " x PP " + std::to_string(pp) + ", " + std::to_string(l.replicas) +
                  (l.replicas == 1 ? " replica" : " replicas") + (ep ? " as DP ranks, experts over all GPUs (EP)" : "") +
                  (l.unused_gpus ? ", " + std::to_string(l.unused_gpus) + " GPU(s) unused" : "");
        try {
          l.per_gpu = account(q);
        } catch (const Error&) {
          continue;
        }
        l.fits = l.per_gpu.fits;
        plan.context = l.per_gpu.max_model_len;
        l.concurrency_per_replica = l.fits ? static_cast<double>(l.per_gpu.kv_cache_tokens) / static_cast<double>(plan.context) : 0;
        l.concurrency_total = l.concurrency_per_replica * static_cast<double>(l.replicas);
        plan.layouts.push_back(l);
      }
    }
  }
  std::stable_sort(plan.layouts.begin(), plan.layouts.end(), [](const ServeLayout& a, const ServeLayout& b) {
    if (a.fits != b.fits) return a.fits;
    return a.concurrency_total > b.concurrency_total;
  });
  if (plan.layouts.empty() || !plan.layouts.front().fits)
    plan.recommendation = "no layout of " + std::to_string(n) + " GPUs holds one " + std::to_string(plan.context) +
                          "-token request: add GPUs, use an FP8 KV cache, a shorter max_model_len or a quantized checkpoint";
  else
    plan.recommendation = plan.layouts.front().label + ": about " +
                          std::to_string(static_cast<u64>(plan.layouts.front().concurrency_total)) + " concurrent " +
                          std::to_string(plan.context) + "-token requests (KV cache bound; throughput not estimated)";
  return plan;
}

json serve_plan_to_json(const ServePlan& p) {
  json layouts = json::array();
  for (const ServeLayout& l : p.layouts)
    layouts.push_back(json_object({{"label", l.label},
                                   {"tensor_parallel_size", l.tp},
                                   {"pipeline_parallel_size", l.pp},
                                   {"replicas", l.replicas},
                                   {"enable_expert_parallel", l.expert_parallel},
                                   {"unused_gpus", l.unused_gpus},
                                   {"fits", l.fits},
                                   {"concurrency_per_replica", l.concurrency_per_replica},
                                   {"concurrency_total", l.concurrency_total},
                                   {"serving", serving_to_json(l.per_gpu)}}));
  return json_object({{"context", p.context}, {"layouts", layouts}, {"recommendation", p.recommendation},
                      {"tokens_per_s", nullptr},
                      {"tokens_per_s_note", "not estimated: no published serving benchmark in the project's data justifies a throughput model"}});
}

}  // namespace memfit
