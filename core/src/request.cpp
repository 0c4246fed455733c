// JSON request -> Request, with every default documented in request.hpp and every bad field
// reported by name.
#include <cmath>
#include <nlohmann/json.hpp>

#include "memfit/allocator.hpp"
#include "memfit/error.hpp"
#include "memfit/gpus.hpp"
#include "memfit/request.hpp"
#include "memfit/serving.hpp"

#include "bitsandbytes.hpp"
#include "frameworks.hpp"
#include "json_object.hpp"

namespace memfit {

using nlohmann::json;
using detail::json_object;

namespace {

template <class E, size_t N>
E pick(const json& v, const char* field, const std::pair<const char*, E> (&options)[N]) {
  std::string all;
  for (const auto& [name, value] : options) {
    if (v.is_string() && v.get<std::string>() == name) return value;
    all += all.empty() ? "" : ", ";
    all += std::string("\"") + name + "\"";
  }
  throw Error(std::string("request field \"") + field + "\" must be one of " + all + "; got " + v.dump());
}

u64 positive(const json& v, const char* field, u64 limit) {
  if (v.is_number_integer() && v.get<std::int64_t>() > 0 && static_cast<u64>(v.get<std::int64_t>()) <= limit)
    return static_cast<u64>(v.get<std::int64_t>());
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (d >= 1 && d == std::floor(d) && d <= static_cast<double>(limit)) return static_cast<u64>(d);
  }
  throw Error(std::string("request field \"") + field + "\" must be a whole number from 1 to " +
              std::to_string(limit) + "; got " + v.dump());
}

bool boolean(const json& v, const char* field) {
  if (!v.is_boolean()) throw Error(std::string("request field \"") + field + "\" must be true or false; got " + v.dump());
  return v.get<bool>();
}

double number(const json& v, const char* field) {
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    throw Error(std::string("request field \"") + field + "\" must be a number; got " + v.dump());
  return v.get<double>();
}

/// Limits that keep hostile requests inside 64-bit arithmetic; anything above is a typo.
constexpr u64 kMaxBatch = u64{1} << 30;       // 10^9 sequences
constexpr u64 kMaxTokens = u64{1} << 30;      // 10^9 tokens per sequence
constexpr u64 kMaxGpus = u64{1} << 20;

constexpr std::pair<const char*, Task> kTasks[] = {
    {"full", Task::Full}, {"lora", Task::Lora}, {"qlora", Task::Qlora}, {"inference", Task::Inference}, {"serve", Task::Serve}};
constexpr std::pair<const char*, Precision> kPrecisions[] = {{"fp32", Precision::Fp32},
                                                             {"amp_bf16", Precision::AmpBf16},
                                                             {"amp_fp16", Precision::AmpFp16},
                                                             {"bf16", Precision::Bf16},
                                                             {"fp16", Precision::Fp16}};
constexpr std::pair<const char*, Quantization> kQuant[] = {
    {"none", Quantization::None},         {"int8", Quantization::Int8},          {"nf4", Quantization::Nf4},
    {"nf4_double", Quantization::Nf4Double}, {"fp4", Quantization::Fp4}, {"gptq_int4", Quantization::GptqInt4}, {"awq_int4", Quantization::AwqInt4},
    {"fp8", Quantization::Fp8},           {"mxfp4", Quantization::Mxfp4},         {"nvfp4", Quantization::Nvfp4}};
constexpr std::pair<const char*, Optimizer> kOptimizers[] = {
    {"adamw", Optimizer::AdamW},           {"adamw_fused", Optimizer::AdamWFused},
    {"adamw_loop", Optimizer::AdamWLoop},  {"adamw_8bit", Optimizer::AdamW8bit},
    {"paged_adamw_8bit", Optimizer::PagedAdamW8bit}, {"paged_adamw", Optimizer::PagedAdamW},
    {"sgd", Optimizer::Sgd},               {"sgd_momentum", Optimizer::SgdMomentum},
    {"adafactor", Optimizer::Adafactor},   {"lion", Optimizer::Lion}};
// "auto" is parsed apart (it resolves per model); these are the kernels that run.
constexpr std::pair<const char*, AttentionImpl> kAttention[] = {
    {"eager", AttentionImpl::Eager}, {"sdpa", AttentionImpl::Sdpa}, {"flash_attention_2", AttentionImpl::FlashAttention2}};
constexpr std::pair<const char*, ParallelMethod> kMethods[] = {
    {"single", ParallelMethod::Single},           {"ddp", ParallelMethod::Ddp},
    {"zero1", ParallelMethod::Zero1},             {"zero2", ParallelMethod::Zero2},
    {"zero3", ParallelMethod::Zero3},             {"fsdp_full_shard", ParallelMethod::FsdpFullShard},
    {"fsdp_shard_grad_op", ParallelMethod::FsdpShardGradOp}, {"fsdp_hybrid", ParallelMethod::FsdpHybrid},
    {"tp", ParallelMethod::Tp},                   {"pp", ParallelMethod::Pp}};
constexpr std::pair<const char*, Device> kDevices[] = {{"cuda", Device::Cuda}, {"cpu", Device::Cpu}};
constexpr std::pair<const char*, u64> kKv[] = {{"bf16", 16}, {"fp16", 16}, {"fp32", 32}, {"fp8", 8}, {"int8", 8}, {"int4", 4}};  // KV cache element bits

template <class E, size_t N>
json names_of(const std::pair<const char*, E> (&options)[N]) {
  json list = json::array();
  for (const auto& [name, value] : options) list.push_back(name);
  return list;
}

template <class E, size_t N>
const char* name_of(E value, const std::pair<const char*, E> (&options)[N]) {
  for (const auto& [name, v] : options)
    if (v == value) return name;
  return "?";
}

void check_keys(const json& obj, const char* where, std::initializer_list<const char*> known) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) {
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      throw Error(std::string("unknown field \"") + it.key() + "\" in " + where + " (known: " + list + ")");
    }
  }
}

/// Splits each layer group into a frozen and a trained part. Groups gather identical layers
/// wherever they sit, so the N bottom layers are taken from every group in proportion to its
/// size (exact for models whose layers are all alike; for alternating layouts the frozen share
/// of each kind is what an interleaved bottom block holds).
std::vector<LayerGroup> freeze_bottom_layers(const std::vector<LayerGroup>& groups, u64 frozen, u64 total) {
  std::vector<LayerGroup> out;
  u64 left = frozen;
  for (size_t i = 0; i < groups.size(); ++i) {
    const LayerGroup& g = groups[i];
    u64 f = i + 1 == groups.size() ? left : std::min(left, (g.count * frozen + total / 2) / total);
    f = std::min(f, g.count);
    left -= f;
    if (f > 0) {
      LayerGroup fg = g;
      fg.count = f;
      fg.frozen = true;
      out.push_back(fg);
    }
    if (g.count > f) {
      LayerGroup tg = g;
      tg.count = g.count - f;
      out.push_back(tg);
    }
  }
  return out;
}

constexpr std::pair<const char*, u64> kAdapter[] = {{"auto", 0}, {"fp32", 4}, {"bf16", 2}, {"fp16", 2}};

json attention_names() {
  json names = names_of(kAttention);
  names.insert(names.begin(), "auto");
  return names;
}

AttentionImpl pick_attention(const json& v) {
  std::string all;
  for (const json& n : attention_names()) all += (all.empty() ? "\"" : ", \"") + n.get<std::string>() + "\"";
  for (const auto& [name, value] : kAttention)
    if (v.is_string() && v.get<std::string>() == name) return value;
  throw Error("request field \"attention\" must be one of " + all + "; got " + v.dump());
}

/// What the hardware cannot run: FlashAttention-2 on CPU or before Ampere (flash-attn 2 needs
/// sm80+). Warnings: bf16 on GPUs without it (V100, T4), a context beyond the model's positions.
void check_capabilities(Request& r) {
  const bool bf16 = r.precision == Precision::Bf16 || r.precision == Precision::AmpBf16;
  const GpuSpec* gpu = r.device == Device::Cuda ? find_gpu(r.gpu.name) : nullptr;
  // PyTorch >= 2.3 emulates bf16 there (torch.cuda.is_bf16_supported(including_emulation=True),
  // which Transformers' bf16 check calls): the run starts and the memory is as estimated.
  if (gpu && !gpu->bf16 && bf16)
    r.warnings.push_back(std::string("the ") + gpu->label + " has no native bf16: PyTorch emulates it (same memory, "
                         "much slower); fp16 (\"amp_fp16\" / \"fp16\") is the usual choice on it");
  if (r.attention == AttentionImpl::FlashAttention2) {
    if (r.device == Device::Cpu)
      throw Error("FlashAttention-2 runs on CUDA GPUs only: use attention \"sdpa\" or \"eager\" on the CPU");
    if (gpu && !gpu->bf16)
      throw Error(std::string("FlashAttention-2 needs an Ampere or newer GPU (sm80+); the ") + gpu->label +
                  " is older: use attention \"sdpa\"");
    // flash_attn takes fp16 / bf16 only (flash_api.cpp: "FlashAttention only support fp16 and bf16
    // data type"), and Transformers casts fp32 q/k/v to the autocast dtype, else to the dtype of the
    // module's first Linear weight (integrations/flash_attention.py get_target_dtype; a quantized
    // model's config.dtype), which is fp32 when the weights are and nothing autocasts.
    if (r.precision == Precision::Fp32)
      throw Rejected("FlashAttention-2 computes in fp16 / bf16 only: with fp32 weights and no autocast the run fails at "
                     "its first forward (\"FlashAttention only support fp16 and bf16 data type\"); use precision "
                     "\"amp_bf16\" (fp32 weights, bf16 autocast) or \"bf16\", or attention \"sdpa\"");
  }
  const u64 context = r.task == Task::Inference ? r.inference.context_length : r.sequence_length;
  if (r.model.max_positions == 0 || context <= r.model.max_positions) return;
  const std::string field = r.task == Task::Inference ? "inference.context_length" : "sequence_length";
  // Learned absolute positions (GPT-2, OPT, BLOOM-free families) index an embedding table of
  // max_position_embeddings rows: a longer input fails at the first forward.
  if (r.model.learned_positions)
    throw Error(field + " " + std::to_string(context) + " exceeds the " + std::to_string(r.model.max_positions) +
                " positions this model learned (max_position_embeddings): the first forward fails; set " + field +
                " to at most " + std::to_string(r.model.max_positions));
  r.warnings.push_back("context " + std::to_string(context) + " exceeds the model's max_position_embeddings (" +
                       std::to_string(r.model.max_positions) + "): it runs, but quality degrades without RoPE scaling");
}

}  // namespace

json precision_meanings() {
  return json_object({{"fp32", "fp32 weights and compute (from_pretrained(dtype=float32), no bf16/fp16 flag)"},
                      {"amp_bf16", "fp32 weights, bf16 autocast (fp32-loaded model + Trainer bf16=True / LitGPT bf16-mixed)"},
                      {"amp_fp16", "fp32 weights, fp16 autocast + GradScaler (fp32-loaded model + Trainer fp16=True)"},
                      {"bf16", "bf16 weights (from_pretrained(dtype=bfloat16) or a bf16 checkpoint; torchtune dtype: bf16; "
                   "LitGPT bf16-true); LoRA adapters fp32 under PEFT"},
                      {"fp16", "fp16 weights (dtype=float16 or an fp16 checkpoint); LoRA adapters fp32 under PEFT"}});
}

namespace {

/// runtime.* (framework defaults are applied later, once the task is known).
void parse_runtime(const json& rt, Runtime& out, bool& prepare_kbit_given) {
  if (!rt.is_object()) throw Error("request field \"runtime\" must be an object");
  check_keys(rt, "\"runtime\"",
             {"cuda_context_mib", "drop_outputs_before_backward", "use_cache_in_training", "zero_grad_to_none", "framework",
              "framework_version", "bitsandbytes_version", "prepare_kbit", "loss_chunks", "optimizer_in_backward", "activation_offloading", "compile",
              "alloc_conf", "later_steps_shorter"});
  if (rt.contains("compile")) out.compile = boolean(rt["compile"], "runtime.compile");
  if (rt.contains("zero_grad_to_none")) out.zero_grad_to_none = boolean(rt["zero_grad_to_none"], "runtime.zero_grad_to_none");
  if (rt.contains("framework")) {
    const json& f = rt["framework"];
    if (!f.is_string() || !framework_from_name(f.get<std::string>(), out.framework)) {
      std::string all;
      for (const std::string& n : framework_names()) all += (all.empty() ? "\"" : ", \"") + n + "\"";
      throw Error("request field \"runtime.framework\" must be one of " + all + "; got " + f.dump());
    }
  }
  if (rt.contains("framework_version")) {
    if (!rt["framework_version"].is_string())
      throw Error("request field \"runtime.framework_version\" must be a string like \"1.16\"");
    out.framework_version = rt["framework_version"].get<std::string>();
  }
  if (rt.contains("bitsandbytes_version")) {
    if (!rt["bitsandbytes_version"].is_string())
      throw Error(std::string("request field \"runtime.bitsandbytes_version\" must be a string like \"") + kBnbDefaultVersion + "\"");
    out.bitsandbytes_version = rt["bitsandbytes_version"].get<std::string>();
    (void)bnb_context(out.bitsandbytes_version);  // a malformed or too old version is an error here
  }
  prepare_kbit_given = rt.contains("prepare_kbit");
  if (prepare_kbit_given) out.prepare_kbit = boolean(rt["prepare_kbit"], "runtime.prepare_kbit");
  if (rt.contains("loss_chunks") && !(rt["loss_chunks"].is_number_integer() && rt["loss_chunks"].get<std::int64_t>() == 0))
    out.loss_chunks = positive(rt["loss_chunks"], "runtime.loss_chunks", 1 << 16);  // 0: not chunked
  if (rt.contains("optimizer_in_backward"))
    out.optimizer_in_backward = boolean(rt["optimizer_in_backward"], "runtime.optimizer_in_backward");
  if (rt.contains("activation_offloading"))
    out.activation_offloading = boolean(rt["activation_offloading"], "runtime.activation_offloading");
  if (rt.contains("cuda_context_mib"))
    out.cuda_context_bytes = mul(positive(rt["cuda_context_mib"], "runtime.cuda_context_mib", 1 << 20), 1 << 20);
  if (rt.contains("drop_outputs_before_backward"))
    out.drop_outputs_before_backward = boolean(rt["drop_outputs_before_backward"], "runtime.drop_outputs_before_backward");
  if (rt.contains("alloc_conf")) {
    if (!rt["alloc_conf"].is_string())
      throw Error("request field \"runtime.alloc_conf\" must be a PYTORCH_CUDA_ALLOC_CONF string like \"expandable_segments:True\"");
    out.alloc_conf = rt["alloc_conf"].get<std::string>();
    (void)alloc::config_from_alloc_conf(out.alloc_conf);  // a bad option is reported with the request
  }
  if (rt.contains("later_steps_shorter"))
    out.later_steps_shorter = boolean(rt["later_steps_shorter"], "runtime.later_steps_shorter");
  if (rt.contains("use_cache_in_training"))
    out.use_cache_in_training = boolean(rt["use_cache_in_training"], "runtime.use_cache_in_training");
}

}  // namespace

json request_options() {
  return json_object({{"task", names_of(kTasks)},           {"precision", names_of(kPrecisions)},
                      {"quantization", names_of(kQuant)},   {"optimizer", names_of(kOptimizers)},
                      {"attention", attention_names()},     {"parallelism.method", names_of(kMethods)},
                      {"inference.kv_cache_dtype", names_of(kKv)}, {"runtime.framework", framework_names()},
                      {"lora.adapter_dtype", names_of(kAdapter)}});
}

const char* to_string(Task t) { return name_of(t, kTasks); }
const char* to_string(Precision p) { return name_of(p, kPrecisions); }
const char* to_string(Quantization q) { return name_of(q, kQuant); }
const char* to_string(Optimizer o) { return name_of(o, kOptimizers); }
const char* to_string(AttentionImpl a) { return name_of(a, kAttention); }
const char* to_string(ParallelMethod m) { return name_of(m, kMethods); }
const char* to_string(Framework f) { return framework_traits(f, "").name; }

namespace {

/// "model": a bundled id (looked up through config_for_id) or an inline config.json.
void parse_model(const json& j, ConfigLookup config_for_id, Request& r) {
  auto model = j.find("model");
  if (model == j.end() || !model->is_object())
    throw Error("the request needs \"model\": {\"id\": \"org/name\"} (a bundled model) or {\"config\": {...config.json...}}");
  check_keys(*model, "\"model\"", {"id", "config", "head"});
  std::string head = "auto";
  if (model->contains("head")) {
    if (!(*model)["head"].is_string()) throw Error("request field \"model.head\" must be a string");
    head = (*model)["head"].get<std::string>();
  }
  if (model->contains("config")) {
    r.model = parse_model_config((*model)["config"], head);
    if (model->contains("id") && (*model)["id"].is_string()) r.model_id = (*model)["id"].get<std::string>();
  } else if (model->contains("id")) {
    if (!(*model)["id"].is_string()) throw Error("request field \"model.id\" must be a string like \"org/name\"");
    r.model_id = (*model)["id"].get<std::string>();
    json cfg;
    if (!config_for_id || !config_for_id(r.model_id, cfg))
      throw Error("model \"" + r.model_id +
                  "\" is not in the bundled library: pass its config.json as {\"model\": {\"config\": {...}}} "
                  "(run `memfit models` to list bundled ids)");
    r.model = parse_model_config(cfg, head);
  } else {
    throw Error("\"model\" needs \"id\" or \"config\"");
  }
}

/// The top-level training fields: task, dtypes, optimizer, kernel, device, batch shape, GPUs and
/// frozen layers (the model is parsed already: frozen_layers is checked against its depth).
void parse_training_fields(const json& j, const GivenFields& given, Request& r) {
  if (j.contains("task")) r.task = pick(j["task"], "task", kTasks);
  if (j.contains("precision")) r.precision = pick(j["precision"], "precision", kPrecisions);
  if (j.contains("quantization")) r.quantization = pick(j["quantization"], "quantization", kQuant);
  if (j.contains("optimizer")) r.optimizer = pick(j["optimizer"], "optimizer", kOptimizers);
  if (given.attention) r.attention = pick_attention(j["attention"]);
  if (j.contains("device")) r.device = pick(j["device"], "device", kDevices);
  if (j.contains("micro_batch_size")) r.micro_batch_size = positive(j["micro_batch_size"], "micro_batch_size", kMaxBatch);
  if (j.contains("sequence_length")) r.sequence_length = positive(j["sequence_length"], "sequence_length", kMaxTokens);
  if (j.contains("gradient_accumulation_steps"))
    r.gradient_accumulation_steps = positive(j["gradient_accumulation_steps"], "gradient_accumulation_steps", kMaxBatch);
  if (j.contains("gradient_checkpointing")) r.gradient_checkpointing = boolean(j["gradient_checkpointing"], "gradient_checkpointing");
  if (j.contains("num_gpus")) r.num_gpus = positive(j["num_gpus"], "num_gpus", kMaxGpus);
  if (j.contains("frozen_layers")) {
    const json& f = j["frozen_layers"];
    if (!(f.is_number_integer() && f.get<std::int64_t>() >= 0 && static_cast<u64>(f.get<std::int64_t>()) < r.model.layers))
      throw Error("request field \"frozen_layers\" must be a whole number from 0 to " + std::to_string(r.model.layers - 1) +
                  " (the model has " + std::to_string(r.model.layers) + " layers)");
    r.frozen_layers = static_cast<u64>(f.get<std::int64_t>());
  }
}

/// lora.targets: "all-linear" or a non-empty list of module names.
void parse_lora_targets(const json& t, LoraSetup& lora) {
  if (t.is_string() && t.get<std::string>() == "all-linear") {
    lora.all_linear = true;
    lora.targets.clear();
  } else if (t.is_array() && !t.empty()) {
    lora.targets.clear();
    for (const json& name : t) {
      if (!name.is_string() || name.get<std::string>().empty())
        throw Error("request field \"lora.targets\" must list module names like \"q_proj\"");
      lora.targets.push_back(name.get<std::string>());
    }
  } else {
    throw Error("request field \"lora.targets\" must be \"all-linear\" or a non-empty list of module names");
  }
}

/// lora.*
void parse_lora(const json& l, LoraSetup& lora, GivenFields& given) {
  if (!l.is_object()) throw Error("request field \"lora\" must be an object like {\"rank\": 16, \"targets\": [\"q_proj\"]}");
  check_keys(l, "\"lora\"", {"rank", "alpha", "targets", "adapter_dtype", "dropout"});
  if (l.contains("dropout")) {
    const double p = number(l["dropout"], "lora.dropout");
    if (!(p >= 0 && p < 1)) throw Error("request field \"lora.dropout\" must be a probability from 0 to below 1 (e.g. 0.05)");
    lora.dropout = p;
    given.lora_dropout = true;
  }
  if (l.contains("rank")) lora.rank = positive(l["rank"], "lora.rank", 1 << 20);
  if (l.contains("alpha")) lora.alpha = number(l["alpha"], "lora.alpha");
  if (l.contains("targets")) parse_lora_targets(l["targets"], lora);
  if (l.contains("adapter_dtype")) {
    lora.adapter_bytes = pick(l["adapter_dtype"], "lora.adapter_dtype", kAdapter);
  }
}

/// inference.* (new_tokens is checked against the context_length given beside it).
void parse_inference(const json& in, InferenceSetup& inference) {
  if (!in.is_object()) throw Error("request field \"inference\" must be an object");
  check_keys(in, "\"inference\"", {"batch_size", "context_length", "kv_cache_dtype", "mla_cache", "prompt_logits", "new_tokens"});
  if (in.contains("batch_size")) inference.batch_size = positive(in["batch_size"], "inference.batch_size", kMaxBatch);
  if (in.contains("context_length"))
    inference.context_length = positive(in["context_length"], "inference.context_length", kMaxTokens);
  if (in.contains("kv_cache_dtype")) {
    inference.kv_cache_bits = pick(in["kv_cache_dtype"], "inference.kv_cache_dtype", kKv);
  }
  if (in.contains("mla_cache")) {
    constexpr std::pair<const char*, bool> kMla[] = {{"compressed", false}, {"expanded", true}};
    inference.expanded_mla_cache = pick(in["mla_cache"], "inference.mla_cache", kMla);
  }
  if (in.contains("prompt_logits")) inference.full_prompt_logits = boolean(in["prompt_logits"], "inference.prompt_logits");
  if (in.contains("new_tokens")) {
    const json& n = in["new_tokens"];
    if (!(n.is_number_integer() && n.get<std::int64_t>() >= 0 &&
          static_cast<u64>(n.get<std::int64_t>()) < inference.context_length))
      throw Error("request field \"inference.new_tokens\" must be a whole number below context_length (" +
                  std::to_string(inference.context_length) + ")");
    inference.new_tokens = static_cast<u64>(n.get<std::int64_t>());
  }
}

/// "cluster" (the planner's form): headroom, GPU count and node size. Returns its "gpu", or null.
const json* parse_cluster(const json& c, Request& r) {
  if (!c.is_object()) throw Error("request field \"cluster\" must be an object like {\"gpu\": {\"name\": \"H100-80GB\"}, \"num_gpus\": 8}");
  check_keys(c, "\"cluster\"", {"gpu", "num_gpus", "gpus_per_node", "headroom"});
  if (c.contains("headroom")) {
    const double f = number(c["headroom"], "cluster.headroom");
    if (!(f >= 0 && f <= 0.5)) throw Error("request field \"cluster.headroom\" must be a fraction from 0 to 0.5 (e.g. 0.05)");
    r.headroom_permille = static_cast<u64>(std::llround(f * 1000));
  }
  const json* gpu = c.contains("gpu") ? &c["gpu"] : nullptr;
  if (c.contains("num_gpus")) r.num_gpus = positive(c["num_gpus"], "cluster.num_gpus", kMaxGpus);
  if (c.contains("gpus_per_node")) r.parallelism.gpus_per_node = positive(c["gpus_per_node"], "cluster.gpus_per_node", 1024);
  return gpu;
}

/// "gpu": a catalog name, a custom size, or both (a name the catalog lacks needs the size).
/// Null: the default A100-80GB.
GpuSetup parse_gpu(const json* gpu) {
  GpuSetup out = {"A100-80GB", find_gpu("A100-80GB")->memory_bytes};
  if (!gpu) return out;
  if (!gpu->is_object()) throw Error("request field \"gpu\" must be {\"name\": \"A100-80GB\"} or {\"memory_gib\": 80}");
  check_keys(*gpu, "\"gpu\"", {"name", "memory_gib"});
  if (gpu->contains("name")) {
    if (!(*gpu)["name"].is_string()) throw Error("request field \"gpu.name\" must be a string");
    std::string name = (*gpu)["name"].get<std::string>();
    const GpuSpec* spec = find_gpu(name);
    if (!spec && !gpu->contains("memory_gib"))
      throw Error("unknown GPU \"" + name + "\": use a catalog name (run `memfit gpus`) or give {\"memory_gib\": N}");
    out.name = spec ? spec->name : name;
    if (spec) out.memory_bytes = spec->memory_bytes;
  }
  if (gpu->contains("memory_gib")) {
    double gib = number((*gpu)["memory_gib"], "gpu.memory_gib");
    if (!(gib > 0 && gib <= 1e6)) throw Error("request field \"gpu.memory_gib\" must be between 0 and 10^6");
    out.memory_bytes = static_cast<u64>(std::llround(gib * 1073741824.0));
    if (!gpu->contains("name")) out.name = "custom";
  }
  return out;
}

/// parallelism.*
void parse_parallelism(const json& p, Parallelism& par, GivenFields& given) {
  if (!p.is_object()) throw Error("request field \"parallelism\" must be an object like {\"method\": \"zero3\"}");
  check_keys(p, "\"parallelism\"",
             {"method", "dp", "tp", "pp", "cp", "sequence_parallel", "offload_optimizer", "offload_params", "gpus_per_node",
              "gradient_as_bucket_view", "pipeline_schedule", "separate_embedding_units", "frozen_in_trained_units",
              "unsharded_grad_accumulation"});
  if (p.contains("method")) par.method = pick(p["method"], "parallelism.method", kMethods);
  if (p.contains("dp")) par.dp = positive(p["dp"], "parallelism.dp", kMaxGpus);
  if (p.contains("tp")) par.tp = positive(p["tp"], "parallelism.tp", kMaxGpus);
  if (p.contains("pp")) par.pp = positive(p["pp"], "parallelism.pp", kMaxGpus);
  if (p.contains("cp")) par.cp = positive(p["cp"], "parallelism.cp", kMaxGpus);
  if (p.contains("sequence_parallel")) par.sequence_parallel = boolean(p["sequence_parallel"], "parallelism.sequence_parallel");
  if (p.contains("offload_optimizer")) par.offload_optimizer = boolean(p["offload_optimizer"], "parallelism.offload_optimizer");
  if (p.contains("offload_params")) par.offload_params = boolean(p["offload_params"], "parallelism.offload_params");
  if (p.contains("gpus_per_node")) par.gpus_per_node = positive(p["gpus_per_node"], "parallelism.gpus_per_node", 1024);
  if (p.contains("gradient_as_bucket_view"))
    par.gradient_as_bucket_view = boolean(p["gradient_as_bucket_view"], "parallelism.gradient_as_bucket_view");
  if (p.contains("separate_embedding_units"))
    par.separate_embedding_units = boolean(p["separate_embedding_units"], "parallelism.separate_embedding_units");
  given.frozen_in_trained_units = p.contains("frozen_in_trained_units");
  if (given.frozen_in_trained_units)
    par.frozen_in_trained_units = boolean(p["frozen_in_trained_units"], "parallelism.frozen_in_trained_units");
  given.unsharded_grad_accumulation = p.contains("unsharded_grad_accumulation");
  if (given.unsharded_grad_accumulation)
    par.unsharded_grad_accumulation = boolean(p["unsharded_grad_accumulation"], "parallelism.unsharded_grad_accumulation");
  if (p.contains("pipeline_schedule")) {
    constexpr std::pair<const char*, bool> kSchedules[] = {{"1f1b", false}, {"gpipe", true}};
    par.gpipe = pick(p["pipeline_schedule"], "parallelism.pipeline_schedule", kSchedules);
  }
}

/// Consistency between fields: the task a quantized base implies, what bitsandbytes runs on,
/// and lengths the model cannot hold (j tells which were given).
void reconcile_fields(const json& j, Request& r) {
  // QLoRA: bitsandbytes 4/8-bit, or LoRA over a GPTQ / AWQ checkpoint (PEFT wraps their
  // quantized Linears too). FP8 / MXFP4 / NVFP4 bases are for inference and serving here.
  if (r.task == Task::Qlora && (r.quantization == Quantization::Fp8 || r.quantization == Quantization::Mxfp4 ||
                                r.quantization == Quantization::Nvfp4))
    throw Error("task \"qlora\" trains LoRA over bitsandbytes, GPTQ or AWQ weights: use quantization \"nf4\", "
                "\"nf4_double\", \"fp4\", \"int8\", \"gptq_int4\" or \"awq_int4\"");
  if (r.task == Task::Qlora && r.quantization == Quantization::None) r.quantization = Quantization::Nf4;
  if (r.runtime.bitsandbytes_version.empty()) r.runtime.bitsandbytes_version = kBnbDefaultVersion;
  const bool bnb_layers = r.quantization == Quantization::Nf4 || r.quantization == Quantization::Nf4Double ||
                          r.quantization == Quantization::Fp4 || r.quantization == Quantization::Int8;
  if (bnb_layers && r.device == Device::Cpu && !bnb_context(r.runtime.bitsandbytes_version).runs_on_cpu)
    throw Error("bitsandbytes " + r.runtime.bitsandbytes_version + " has no CPU backend (it came in 0.46.0): "
                "use device \"cuda\", or runtime.bitsandbytes_version 0.46.0 or newer");
  if ((r.task == Task::Full || r.task == Task::Lora) && r.quantization != Quantization::None) {
    if (r.task == Task::Full)
      throw Error("full fine-tuning cannot train quantized weights: set quantization to \"none\", or use task \"qlora\"");
    r.task = Task::Qlora;  // LoRA over quantized weights is QLoRA
  }
  if (!j.contains("sequence_length") && r.model.max_positions > 0 && r.sequence_length > r.model.max_positions) {
    r.sequence_length = r.model.max_positions;  // the default 2048 is longer than the model
    r.warnings.push_back("sequence_length " + std::to_string(r.sequence_length) + ": the model's max_position_embeddings");
  }
  if (r.task == Task::Inference && !(j.contains("inference") && j["inference"].contains("context_length")) &&
      r.model.max_positions > 0 && r.inference.context_length > r.model.max_positions)
    r.inference.context_length = r.model.max_positions;
}

}  // namespace

Request parse_request(const json& j, ConfigLookup config_for_id) {
  if (!j.is_object()) throw Error("the request must be a JSON object, e.g. {\"model\": {\"id\": \"meta-llama/Llama-2-7b-hf\"}}");
  check_keys(j, "the request",
             {"model", "task", "lora", "precision", "quantization", "optimizer", "micro_batch_size", "sequence_length",
              "gradient_accumulation_steps", "gradient_checkpointing", "frozen_layers", "attention", "inference", "serving", "gpu", "num_gpus",
              "parallelism", "runtime", "device", "cluster", "name"});
  Request r;

  // Model: bundled id or inline config.
  parse_model(j, config_for_id, r);

  GivenFields given;
  given.precision = j.contains("precision");
  given.gradient_checkpointing = j.contains("gradient_checkpointing");
  given.attention = j.contains("attention") && !(j["attention"].is_string() && j["attention"].get<std::string>() == "auto");
  given.lora_targets = j.contains("lora") && j["lora"].is_object() && j["lora"].contains("targets");
  parse_training_fields(j, given, r);
  if (j.contains("lora")) parse_lora(j["lora"], r.lora, given);
  if (j.contains("inference")) parse_inference(j["inference"], r.inference);

  if (j.contains("serving")) {
    if (r.task != Task::Serve) throw Error("request field \"serving\" applies to task \"serve\"; set \"task\": \"serve\"");
    parse_serving_setup(j["serving"], r.serving);
  }

  // GPU: catalog name or a custom size. "cluster" (the planner's form) may carry it too.
  const json* gpu = j.contains("gpu") ? &j["gpu"] : nullptr;
  if (j.contains("cluster")) {
    if (const json* cluster_gpu = parse_cluster(j["cluster"], r)) gpu = cluster_gpu;
  }
  r.gpu = parse_gpu(gpu);

  if (j.contains("parallelism")) parse_parallelism(j["parallelism"], r.parallelism, given);

  // Degrees given without num_gpus: the GPUs they describe.
  if (!j.contains("num_gpus") && !(j.contains("cluster") && j["cluster"].contains("num_gpus"))) {
    const Parallelism& par = r.parallelism;
    r.num_gpus = mul(mul(par.dp, par.tp), mul(par.pp, par.cp));
  }

  if (j.contains("runtime")) parse_runtime(j["runtime"], r.runtime, given.prepare_kbit);
  given.loss_chunks = j.contains("runtime") && j["runtime"].contains("loss_chunks");
  given.drop_outputs = j.contains("runtime") && j["runtime"].contains("drop_outputs_before_backward");

  if (r.frozen_layers > 0) {
    if (r.task != Task::Full) throw Error("frozen_layers applies to full fine-tuning (LoRA freezes the base model already)");
    r.model.groups = freeze_bottom_layers(r.model.groups, r.frozen_layers, r.model.layers);
  }

  // Consistency between fields.
  reconcile_fields(j, r);
  apply_framework_defaults(r, given);
  check_capabilities(r);
  return r;
}

std::vector<std::string> warnings_of(const Request& r) {
  std::vector<std::string> w = r.model.warnings;
  w.insert(w.end(), r.warnings.begin(), r.warnings.end());
  return w;
}

json request_to_json(const Request& r) {
  json j;
  j["model"] = r.model_id.empty() ? json_object({{"config", "(inline)"}}) : json_object({{"id", r.model_id}});
  j["task"] = to_string(r.task);
  j["lora"] = json_object({{"rank", r.lora.rank},
                           {"alpha", r.lora.alpha},
                           {"targets", r.lora.all_linear ? json("all-linear") : json(r.lora.targets)},
                           {"adapter_dtype", r.lora.adapter_bytes == 0 ? "auto" : r.lora.adapter_bytes == 4 ? "fp32" : "bf16"},
                           {"dropout", r.lora.dropout}});
  j["precision"] = to_string(r.precision);
  j["quantization"] = to_string(r.quantization);
  j["optimizer"] = to_string(r.optimizer);
  j["micro_batch_size"] = r.micro_batch_size;
  j["sequence_length"] = r.sequence_length;
  j["gradient_accumulation_steps"] = r.gradient_accumulation_steps;
  j["gradient_checkpointing"] = r.gradient_checkpointing;
  j["frozen_layers"] = r.frozen_layers;
  j["attention"] = to_string(r.attention);
  const u64 kv = r.inference.kv_cache_bits;
  j["inference"] = json_object({{"batch_size", r.inference.batch_size},
                                {"context_length", r.inference.context_length},
                                {"new_tokens", r.inference.new_tokens},
                                {"kv_cache_dtype", kv == 32 ? "fp32" : kv == 8 ? "fp8" : kv == 4 ? "int4" : "bf16"},
                                {"mla_cache", r.inference.expanded_mla_cache ? "expanded" : "compressed"}});
  if (r.task == Task::Serve) j["serving"] = serving_setup_to_json(r.serving);
  j["gpu"] = json_object({{"name", r.gpu.name}, {"memory_gib", static_cast<double>(r.gpu.memory_bytes) / 1073741824.0}});
  j["num_gpus"] = r.num_gpus;
  const Parallelism& p = r.parallelism;
  j["parallelism"] = json_object({{"method", to_string(p.method)}, {"dp", p.dp}, {"tp", p.tp}, {"pp", p.pp}, {"cp", p.cp},
                                  {"sequence_parallel", p.sequence_parallel}, {"offload_optimizer", p.offload_optimizer},
                                  {"offload_params", p.offload_params}, {"gpus_per_node", p.gpus_per_node},
                                  {"gradient_as_bucket_view", p.gradient_as_bucket_view},
                                  {"separate_embedding_units", p.separate_embedding_units},
                                  {"frozen_in_trained_units", p.frozen_in_trained_units},
                                  {"unsharded_grad_accumulation", p.unsharded_grad_accumulation},
                                  {"pipeline_schedule", p.gpipe ? "gpipe" : "1f1b"}});
  j["device"] = r.device == Device::Cuda ? "cuda" : "cpu";
  j["runtime"] = json_object({{"framework", to_string(r.runtime.framework)},
                              {"framework_version", r.runtime.framework_version},
                              {"bitsandbytes_version", r.runtime.bitsandbytes_version},
                              {"prepare_kbit", r.runtime.prepare_kbit},
                              {"zero_grad_to_none", r.runtime.zero_grad_to_none},
                              {"loss_chunks", r.runtime.loss_chunks},
                              {"optimizer_in_backward", r.runtime.optimizer_in_backward},
                              {"activation_offloading", r.runtime.activation_offloading},
                              {"compile", r.runtime.compile},
                              {"alloc_conf", r.runtime.alloc_conf},
                              {"drop_outputs_before_backward", r.runtime.drop_outputs_before_backward},
                               {"later_steps_shorter", r.runtime.later_steps_shorter}});
  return j;
}

}  // namespace memfit
