// Launch configs -> requests (see intake.hpp). One mapping function per format; each reads the
// keys the framework documents for its recipe files and records where every request field
// came from. Keys were taken from each framework's documented config schema: Axolotl
// (utils/schemas/config.py), LLaMA-Factory (hparams/*_args.py), torchtune (recipes/configs),
// LitGPT (config_hub/finetune), Transformers TrainingArguments / TRL SFTConfig + ModelConfig,
// DeepSpeed's config JSON, accelerate's config file.
#include "memfit/intake.hpp"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <set>

#include "memfit/error.hpp"
#include "json_object.hpp"

namespace memfit {

using nlohmann::json;
using detail::json_object;

namespace {

/// Reads keys from the parsed tree and writes request fields, remembering where each came from.
struct Mapper {
  const json& tree;
  const json& lines;
  json request = json::object();
  json sources = json::object();
  std::vector<std::string> notes;
  std::set<std::string> used;  ///< top-level keys that mapped (the rest is listed as ignored)

  Mapper(const json& t, const json& l) : tree(t), lines(l) {}

  /// The value at a dotted path ("train.micro_batch_size"), or nullptr; null values count as absent.
  const json* get(const std::string& path) const {
    const json* at = &tree;
    size_t start = 0;
    while (start <= path.size()) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (!at->is_object() || !at->contains(part)) return nullptr;
      at = &(*at)[part];
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return at->is_null() ? nullptr : at;
  }

  /// request[field] = value (dotted field), with the key it came from.
  void set(const std::string& field, json value, const std::string& key) {
    json* at = &request;
    size_t start = 0;
    for (size_t dot = field.find('.'); dot != std::string::npos; dot = field.find('.', start)) {
      at = &(*at)[field.substr(start, dot - start)];
      start = dot + 1;
    }
    (*at)[field.substr(start)] = std::move(value);
    json src = json_object({{"key", key}});
    if (lines.is_object() && lines.contains(key) && lines[key].is_number_integer()) src["line"] = lines[key];
    if (key.front() == '(') src = json_object({{"default", key.substr(1, key.size() - 2)}});
    sources[field] = src;
    if (key.front() != '(') used.insert(key.substr(0, key.find('.')));
  }
  void note(std::string text) { notes.push_back(std::move(text)); }
};

bool truthy(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s == "true" || s == "1" || s == "yes" || s == "auto";
  }
  return false;
}

/// A whole number from a number or a numeric string ("auto" and others: nullopt-like -1).
long long whole(const json& v) {
  if (v.is_number_integer()) return v.get<long long>();
  if (v.is_number_float()) return static_cast<long long>(v.get<double>());
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (!s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); })) return std::stoll(s);
  }
  return -1;
}

/// memfit's name for a bitsandbytes 4-bit setup: its quant type ("fp4" or the default "nf4") and
/// whether the absmax constants are quantized again (memfit models double quantization for NF4).
const char* bnb_4bit(const json* quant_type, bool double_quant) {
  if (quant_type && quant_type->is_string() && quant_type->get<std::string>() == "fp4") return "fp4";
  return double_quant ? "nf4_double" : "nf4";
}

double real(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    try {
      return std::stod(v.get<std::string>());
    } catch (...) {
    }
  }
  return -1;
}

void take_int(Mapper& m, const std::string& key, const std::string& field) {
  if (const json* v = m.get(key)) {
    const long long n = whole(*v);
    if (n > 0) m.set(field, n, key);
    else if (!(v->is_string() && v->get<std::string>() == "auto")) m.note(key + " = " + v->dump() + " is not a whole number: " + field + " defaulted");
  }
}
void take_bool(Mapper& m, const std::string& key, const std::string& field) {
  if (const json* v = m.get(key)) m.set(field, truthy(*v), key);
}
void take_real(Mapper& m, const std::string& key, const std::string& field) {
  if (const json* v = m.get(key)) {
    const double x = real(*v);
    if (x >= 0) m.set(field, x, key);
  }
}
/// How a launch-config value becomes a request field.
enum class Kind { Whole, Real, Flag };
/// One key of a launch config and the request field it sets.
struct Field {
  const char* key;
  const char* field;
  Kind kind;
};
/// Takes each present key of the table, in order (a later key overrides an earlier one).
void take(Mapper& m, std::initializer_list<Field> fields) {
  for (const Field& f : fields) {
    if (f.kind == Kind::Whole) take_int(m, f.key, f.field);
    else if (f.kind == Kind::Real) take_real(m, f.key, f.field);
    else take_bool(m, f.key, f.field);
  }
}
void take_model(Mapper& m, const std::string& key) {
  if (const json* v = m.get(key); v && v->is_string()) {
    std::string id = v->get<std::string>();
    if (id.rfind("checkpoints/", 0) == 0) id = id.substr(12);  // LitGPT's checkpoint_dir layout
    while (!id.empty() && id.back() == '/') id.pop_back();
    m.set("model.id", id, key);
  }
}

/// Hugging Face `optim` names -> memfit optimizers.
void take_hf_optim(Mapper& m, const std::string& key) {
  const json* v = m.get(key);
  if (!v || !v->is_string()) return;
  static const std::pair<const char*, const char*> kNames[] = {
      {"adamw_torch", "adamw"},           {"adamw_torch_fused", "adamw_fused"}, {"adamw_hf", "adamw_loop"},
      {"adamw_bnb_8bit", "adamw_8bit"},   {"adamw_8bit", "adamw_8bit"},         {"paged_adamw_8bit", "paged_adamw_8bit"},
      {"paged_adamw_32bit", "paged_adamw"}, {"sgd", "sgd"},                     {"adafactor", "adafactor"},
      {"lion_32bit", "lion"},             {"adamw", "adamw"}};
  const std::string name = v->get<std::string>();
  for (const auto& [hf, ours] : kNames)
    if (name == hf) return m.set("optimizer", ours, key);
  m.note(key + " = \"" + name + "\" has no memfit equivalent: optimizer defaulted");
}

/// A list or a comma-separated string of module names; "all"/"all-linear" -> "all-linear".
json targets_of(const json& v) {
  std::vector<std::string> out;
  if (v.is_array()) {
    for (const json& t : v)
      if (t.is_string()) out.push_back(t.get<std::string>());
  } else if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s == "all" || s == "all-linear" || s == "all_linear") return "all-linear";
    size_t start = 0;
    while (start <= s.size()) {
      size_t comma = s.find(',', start);
      std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      part.erase(std::remove(part.begin(), part.end(), ' '), part.end());
      if (!part.empty()) out.push_back(part);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (out.empty()) return nullptr;
  return out;
}

void take_targets(Mapper& m, const std::string& key) {
  if (const json* v = m.get(key)) {
    json t = targets_of(*v);
    if (!t.is_null()) m.set("lora.targets", t, key);
  }
}

/// Half-precision switches (bf16/fp16 flags) -> precision, given what the framework loads.
void take_half_flags(Mapper& m, const char* bf16_key, const char* fp16_key, const char* if_bf16, const char* if_fp16) {
  if (const json* v = m.get(bf16_key); v && truthy(*v)) m.set("precision", if_bf16, bf16_key);
  else if (const json* f = m.get(fp16_key); f && truthy(*f)) m.set("precision", if_fp16, fp16_key);
}

// ---- formats ----------------------------------------------------------------------------------

void map_axolotl(Mapper& m) {
  m.set("runtime.framework", "axolotl", "(file format)");
  take_model(m, "base_model");
  take(m, {{"micro_batch_size", "micro_batch_size", Kind::Whole},
           {"sequence_len", "sequence_length", Kind::Whole},
           {"gradient_accumulation_steps", "gradient_accumulation_steps", Kind::Whole}});
  if (const json* v = m.get("gradient_checkpointing")) m.set("gradient_checkpointing", truthy(*v) || v->is_string(), "gradient_checkpointing");
  if (const json* a = m.get("adapter"); a && a->is_string()) {
    const std::string ad = a->get<std::string>();
    m.set("task", ad == "qlora" ? "qlora" : "lora", "adapter");
  } else {
    m.set("task", "full", "base_model");
  }
  if (const json* v = m.get("load_in_4bit"); v && truthy(*v)) m.set("quantization", "nf4", "load_in_4bit");
  if (const json* v = m.get("load_in_8bit"); v && truthy(*v)) m.set("quantization", "int8", "load_in_8bit");
  take(m, {{"lora_r", "lora.rank", Kind::Whole},
           {"lora_alpha", "lora.alpha", Kind::Real},
           {"lora_dropout", "lora.dropout", Kind::Real}});
  if (const json* v = m.get("lora_target_linear"); v && truthy(*v)) m.set("lora.targets", "all-linear", "lora_target_linear");
  else take_targets(m, "lora_target_modules");
  take_half_flags(m, "bf16", "fp16", "bf16", "fp16");  // Axolotl loads the model in the half dtype
  take_hf_optim(m, "optimizer");
  if (const json* v = m.get("flash_attention"); v && truthy(*v)) m.set("attention", "flash_attention_2", "flash_attention");
  else if (const json* s = m.get("sdp_attention"); s && truthy(*s)) m.set("attention", "sdpa", "sdp_attention");
  if (m.get("deepspeed")) m.note("deepspeed: " + m.get("deepspeed")->dump() + " names a DeepSpeed JSON: read it with --from too, or set parallelism");
}

void map_llamafactory(Mapper& m) {
  m.set("runtime.framework", "llamafactory", "(file format)");
  take_model(m, "model_name_or_path");
  const json* ft = m.get("finetuning_type");
  const std::string type = ft && ft->is_string() ? ft->get<std::string>() : "lora";  // FinetuningArguments default
  const json* qbit = m.get("quantization_bit");
  if (type == "full" || type == "freeze") m.set("task", "full", ft ? "finetuning_type" : "model_name_or_path");
  else m.set("task", qbit ? "qlora" : "lora", qbit ? "quantization_bit" : (ft ? "finetuning_type" : "model_name_or_path"));
  if (type == "freeze") m.note("finetuning_type freeze trains the last layers only: estimated as full fine-tuning (an over-estimate)");
  if (qbit) {
    const long long bits = whole(*qbit);
    const json* dq = m.get("double_quantization");  // LLaMA-Factory default: true
    const json* qt = m.get("quantization_type");    // default nf4
    m.set("quantization", bits == 8 ? "int8" : bnb_4bit(qt, !dq || truthy(*dq)), "quantization_bit");
  }
  take(m, {{"per_device_train_batch_size", "micro_batch_size", Kind::Whole},
           {"cutoff_len", "sequence_length", Kind::Whole},
           {"gradient_accumulation_steps", "gradient_accumulation_steps", Kind::Whole},
           {"lora_rank", "lora.rank", Kind::Whole},
           {"lora_alpha", "lora.alpha", Kind::Real},
           {"lora_dropout", "lora.dropout", Kind::Real}});
  take_targets(m, "lora_target");
  // LLaMA-Factory switches gradient checkpointing on unless disable_gradient_checkpointing.
  if (const json* v = m.get("disable_gradient_checkpointing")) m.set("gradient_checkpointing", !truthy(*v), "disable_gradient_checkpointing");
  else m.set("gradient_checkpointing", true, "(llamafactory default)");
  take_half_flags(m, "bf16", "fp16", type == "full" ? "amp_bf16" : "bf16", type == "full" ? "amp_fp16" : "fp16");
  take_hf_optim(m, "optim");
  if (const json* v = m.get("flash_attn"); v && v->is_string()) {
    const std::string fa = v->get<std::string>();
    if (fa == "fa2") m.set("attention", "flash_attention_2", "flash_attn");
    else if (fa == "sdpa") m.set("attention", "sdpa", "flash_attn");
    else if (fa == "disabled") m.set("attention", "eager", "flash_attn");
  }
  if (m.get("deepspeed")) m.note("deepspeed: " + m.get("deepspeed")->dump() + " names a DeepSpeed JSON: read it with --from too, or set parallelism");
}

/// torchtune builder names -> Hugging Face ids of the checkpoints their recipes download.
const char* torchtune_model_id(const std::string& builder) {
  static const std::pair<const char*, const char*> kModels[] = {
      {"llama3_1_8b", "meta-llama/Llama-3.1-8B"},   {"llama3_1_70b", "meta-llama/Llama-3.1-70B"},
      {"llama3_1_405b", "meta-llama/Llama-3.1-405B"}, {"llama3_2_1b", "meta-llama/Llama-3.2-1B"},
      {"llama3_2_3b", "meta-llama/Llama-3.2-3B"},   {"llama3_8b", "meta-llama/Meta-Llama-3-8B"},
      {"llama3_70b", "meta-llama/Meta-Llama-3-70B"}, {"llama2_7b", "meta-llama/Llama-2-7b-hf"},
      {"llama2_13b", "meta-llama/Llama-2-13b-hf"},  {"llama2_70b", "meta-llama/Llama-2-70b-hf"},
      {"mistral_7b", "mistralai/Mistral-7B-v0.1"},  {"gemma_2b", "google/gemma-2b"},
      {"gemma_7b", "google/gemma-7b"},              {"qwen2_5_7b", "Qwen/Qwen2.5-7B"},
      {"qwen2_5_1_5b", "Qwen/Qwen2.5-1.5B"},        {"phi3_mini", "microsoft/Phi-3-mini-4k-instruct"}};
  for (const auto& [name, id] : kModels)
    if (builder.size() >= std::string(name).size() && builder.ends_with(name)) return id;
  return nullptr;
}

void map_torchtune(Mapper& m) {
  m.set("runtime.framework", "torchtune", "(file format)");
  const json* comp = m.get("model._component_");
  const std::string builder = comp && comp->is_string() ? comp->get<std::string>() : "";
  const std::string last = builder.substr(builder.rfind('.') == std::string::npos ? 0 : builder.rfind('.') + 1);
  const bool qlora = last.rfind("qlora_", 0) == 0;
  const bool lora = qlora || last.rfind("lora_", 0) == 0;
  m.set("task", qlora ? "qlora" : lora ? "lora" : "full", "model._component_");
  if (qlora) m.set("quantization", "nf4", "model._component_");  // torchao NF4Tensor
  if (const char* id = torchtune_model_id(last)) m.set("model.id", id, "model._component_");
  else m.note("model._component_ " + builder + ": no known checkpoint; give the model's config.json");
  take(m, {{"batch_size", "micro_batch_size", Kind::Whole},
           {"tokenizer.max_seq_len", "sequence_length", Kind::Whole},
           {"gradient_accumulation_steps", "gradient_accumulation_steps", Kind::Whole},
           {"enable_activation_checkpointing", "gradient_checkpointing", Kind::Flag},
           {"enable_activation_offloading", "runtime.activation_offloading", Kind::Flag},
           {"compile", "runtime.compile", Kind::Flag},
           {"optimizer_in_bwd", "runtime.optimizer_in_backward", Kind::Flag}});
  // distributed recipes: custom_sharded_layers makes the named modules FSDP units of their own
  if (const json* v = m.get("custom_sharded_layers"); v && v->is_array() && !v->empty())
    m.set("parallelism.separate_embedding_units", true, "custom_sharded_layers");
  if (const json* v = m.get("dtype"); v && v->is_string())
    m.set("precision", v->get<std::string>() == "fp32" ? "fp32" : "bf16", "dtype");
  take(m, {{"model.lora_rank", "lora.rank", Kind::Whole},
           {"model.lora_alpha", "lora.alpha", Kind::Real},
           {"model.lora_dropout", "lora.dropout", Kind::Real}});
  if (const json* mods = m.get("model.lora_attn_modules"); mods && mods->is_array()) {
    json targets = json::array();
    for (const json& t : *mods)
      if (t.is_string()) targets.push_back(t.get<std::string>() == "output_proj" ? "o_proj" : t.get<std::string>());
    if (const json* mlp = m.get("model.apply_lora_to_mlp"); mlp && truthy(*mlp))
      for (const char* n : {"gate_proj", "up_proj", "down_proj"}) targets.push_back(n);
    if (!targets.empty()) m.set("lora.targets", targets, "model.lora_attn_modules");
  }
  if (const json* opt = m.get("optimizer._component_"); opt && opt->is_string()) {
    const std::string o = opt->get<std::string>();
    const json* fused = m.get("optimizer.fused");
    const char* ours = o.find("PagedAdamW8bit") != std::string::npos ? "paged_adamw_8bit"
                       : o.find("AdamW8bit") != std::string::npos    ? "adamw_8bit"
                       : o.find("SGD") != std::string::npos          ? "sgd"
                       : (fused && truthy(*fused))                   ? "adamw_fused"
                                                                     : "adamw";
    m.set("optimizer", ours, "optimizer._component_");
  }
  if (const json* loss = m.get("loss._component_"); loss && loss->is_string() &&
                                                    loss->get<std::string>().find("Chunked") != std::string::npos) {
    const json* n = m.get("loss.num_output_chunks");
    m.set("runtime.loss_chunks", n && whole(*n) > 0 ? whole(*n) : 8, "loss._component_");
  }
}

void map_litgpt(Mapper& m) {
  m.set("runtime.framework", "litgpt", "(file format)");
  take_model(m, "checkpoint_dir");
  const json* q = m.get("quantize");
  const std::string quant = q && q->is_string() ? q->get<std::string>() : "";
  const bool lora = m.get("lora_r") || quant.rfind("bnb.", 0) == 0;
  m.set("task", !quant.empty() ? "qlora" : lora ? "lora" : "full", !quant.empty() ? "quantize" : lora ? "lora_r" : "checkpoint_dir");
  if (!quant.empty()) {
    const char* ours = quant == "bnb.nf4" ? "nf4" : quant == "bnb.nf4-dq" ? "nf4_double" : quant.rfind("bnb.fp4", 0) == 0 ? "fp4"
                                                                                                                   : "int8";
    m.set("quantization", ours, "quantize");
  }
  if (const json* p = m.get("precision"); p && p->is_string()) {
    const std::string s = p->get<std::string>();
    const char* ours = s == "bf16-true" ? "bf16" : s == "bf16-mixed" ? "amp_bf16" : s == "16-true" ? "fp16"
                       : s == "16-mixed" ? "amp_fp16" : "fp32";
    m.set("precision", ours, "precision");
  }
  take(m, {{"lora_r", "lora.rank", Kind::Whole},
           {"lora_alpha", "lora.alpha", Kind::Real},
           {"lora_dropout", "lora.dropout", Kind::Real}});
  json targets = json::array();
  bool any_flag = false;
  static const std::pair<const char*, std::vector<const char*>> kFlags[] = {
      {"lora_query", {"q_proj"}}, {"lora_key", {"k_proj"}}, {"lora_value", {"v_proj"}}, {"lora_projection", {"o_proj"}},
      {"lora_mlp", {"gate_proj", "up_proj", "down_proj"}}};
  for (const auto& [flag, names] : kFlags)
    if (const json* v = m.get(flag)) {
      any_flag = true;
      if (truthy(*v))
        for (const char* n : names) targets.push_back(n);
    }
  if (any_flag && !targets.empty()) m.set("lora.targets", targets, "lora_query");
  take(m, {{"train.micro_batch_size", "micro_batch_size", Kind::Whole},
           {"train.max_seq_length", "sequence_length", Kind::Whole}});
  const json* global = m.get("train.global_batch_size");
  const json* micro = m.get("train.micro_batch_size");
  const long long devices = m.get("devices") ? whole(*m.get("devices")) : 1;
  if (global && micro && whole(*micro) > 0 && devices > 0 && whole(*global) >= whole(*micro) * devices)
    m.set("gradient_accumulation_steps", whole(*global) / (whole(*micro) * devices), "train.global_batch_size");
  if (devices > 1) {
    m.set("parallelism.method", "fsdp_full_shard", "devices");  // LitGPT's multi-device strategy
    m.set("parallelism.dp", devices, "devices");
    // litgpt 0.5.13 checkpoints every Block on more than one device: full.py's
    // FSDPStrategy(activation_checkpointing_policy={Block}), lora.py's parallelize_fn
    m.set("gradient_checkpointing", true, "devices");
  }
}

void map_training_args(Mapper& m) {
  // TRL's scripts add model/PEFT fields (ModelConfig) and max_length to TrainingArguments.
  const bool trl = m.get("max_length") || m.get("use_peft") || m.get("max_seq_length") || m.get("packing");
  m.set("runtime.framework", trl ? "trl" : "transformers", "(file format)");
  take_model(m, "model_name_or_path");
  take(m, {{"per_device_train_batch_size", "micro_batch_size", Kind::Whole},
           {"gradient_accumulation_steps", "gradient_accumulation_steps", Kind::Whole},
           {"max_length", "sequence_length", Kind::Whole},
           {"max_seq_length", "sequence_length", Kind::Whole},
           {"gradient_checkpointing", "gradient_checkpointing", Kind::Flag},
           {"torch_compile", "runtime.compile", Kind::Flag}});
  take_hf_optim(m, "optim");
  const bool peft = m.get("use_peft") && truthy(*m.get("use_peft"));
  const bool k4 = m.get("load_in_4bit") && truthy(*m.get("load_in_4bit"));
  const bool k8 = m.get("load_in_8bit") && truthy(*m.get("load_in_8bit"));
  if (peft || k4 || k8) m.set("task", k4 || k8 ? "qlora" : "lora", k4 ? "load_in_4bit" : k8 ? "load_in_8bit" : "use_peft");
  if (k4) {
    const json* qt = m.get("bnb_4bit_quant_type");
    const json* nested = m.get("use_bnb_nested_quant");
    m.set("quantization", bnb_4bit(qt, nested && truthy(*nested)), "load_in_4bit");
  }
  if (k8) m.set("quantization", "int8", "load_in_8bit");
  take(m, {{"lora_r", "lora.rank", Kind::Whole},
           {"lora_alpha", "lora.alpha", Kind::Real},
           {"lora_dropout", "lora.dropout", Kind::Real}});
  take_targets(m, "lora_target_modules");
  if (const json* v = m.get("attn_implementation"); v && v->is_string()) m.set("attention", v->get<std::string>(), "attn_implementation");
  // bf16/fp16 = autocast over the loaded weights; the load dtype is the framework's (or dtype=).
  const json* dtype = m.get("dtype") ? m.get("dtype") : m.get("torch_dtype");
  const std::string load = dtype && dtype->is_string() ? dtype->get<std::string>() : "";
  const bool half_load = load == "bfloat16" || load == "float16";
  if (half_load) m.set("precision", load == "bfloat16" ? "bf16" : "fp16", m.get("dtype") ? "dtype" : "torch_dtype");
  else if (load == "float32") take_half_flags(m, "bf16", "fp16", "amp_bf16", "amp_fp16");
  else if (trl) take_half_flags(m, "bf16", "fp16", "amp_bf16", "amp_fp16");  // TRL loads a model id in fp32
  if (m.get("deepspeed")) m.note("deepspeed: " + m.get("deepspeed")->dump() + " names a DeepSpeed JSON: read it with --from too, or set parallelism");
  if (const json* f = m.get("fsdp"); f && f->is_string() && !f->get<std::string>().empty()) {
    const std::string s = f->get<std::string>();
    m.set("parallelism.method", s.find("shard_grad_op") != std::string::npos ? "fsdp_shard_grad_op"
                                : s.find("hybrid") != std::string::npos     ? "fsdp_hybrid"
                                                                            : "fsdp_full_shard",
          "fsdp");
    if (s.find("offload") != std::string::npos) m.set("parallelism.offload_params", true, "fsdp");
  }
}

/// The ZeRO stage a DeepSpeed config names: 0 to 3, as DeepSpeed accepts (its config check
/// rejects any other stage, so a file with one would not launch: say so rather than ignore it).
long long zero_stage(const json& stage, const char* key) {
  const long long s = whole(stage);
  if (s < 0 || s > 3)
    throw Error(std::string(key) + " is " + stage.dump() + ": DeepSpeed's ZeRO stages are 0, 1, 2 and 3 (it refuses to " +
                "start with another); fix the file");
  return s;
}

/// A ZeRO stage and its offload devices ("cpu" / "nvme" offload, "none" does not), under the key
/// names of a DeepSpeed JSON or of accelerate's deepspeed_config.
void take_zero(Mapper& m, const char* stage_key, const char* optimizer_device_key, const char* param_device_key) {
  if (const json* stage = m.get(stage_key)) {
    const long long s = zero_stage(*stage, stage_key);
    m.set("parallelism.method", s == 0 ? std::string("ddp") : "zero" + std::to_string(s), stage_key);
  }
  const auto offloads = [&](const char* key) {
    const json* d = m.get(key);
    return d && d->is_string() && d->get<std::string>() != "none";
  };
  if (offloads(optimizer_device_key)) m.set("parallelism.offload_optimizer", true, optimizer_device_key);
  if (offloads(param_device_key)) m.set("parallelism.offload_params", true, param_device_key);
}

void map_deepspeed(Mapper& m) {
  take_zero(m, "zero_optimization.stage", "zero_optimization.offload_optimizer.device",
            "zero_optimization.offload_param.device");
  for (const char* key : {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
    const json* v = m.get(key);
    if (v && whole(*v) < 0) m.note(std::string(key) + " is \"auto\": it comes from the Trainer's arguments");
  }
  take_int(m, "train_micro_batch_size_per_gpu", "micro_batch_size");
  if (const json* v = m.get("gradient_accumulation_steps"); v && whole(*v) > 0) take_int(m, "gradient_accumulation_steps", "gradient_accumulation_steps");
  // "auto" follows the Trainer's bf16/fp16 flags: only an explicit true decides here.
  if (const json* b = m.get("bf16.enabled"); b && b->is_boolean() && b->get<bool>()) m.set("precision", "amp_bf16", "bf16.enabled");
  else if (const json* f = m.get("fp16.enabled"); f && f->is_boolean() && f->get<bool>()) m.set("precision", "amp_fp16", "fp16.enabled");
}

void map_accelerate(Mapper& m) {
  const json* dt = m.get("distributed_type");
  const std::string type = dt && dt->is_string() ? dt->get<std::string>() : "NO";
  const long long procs = m.get("num_processes") ? whole(*m.get("num_processes")) : 1;
  if (procs > 0) m.set("num_gpus", procs, "num_processes");
  if (type == "MULTI_GPU") m.set("parallelism.method", "ddp", "distributed_type");
  if (type == "DEEPSPEED")
    take_zero(m, "deepspeed_config.zero_stage", "deepspeed_config.offload_optimizer_device",
              "deepspeed_config.offload_param_device");
  if (type == "FSDP") {
    const json* s = m.get("fsdp_config.fsdp_sharding_strategy");
    const std::string strat = s ? (s->is_string() ? s->get<std::string>() : s->dump()) : "FULL_SHARD";
    m.set("parallelism.method", strat == "SHARD_GRAD_OP" || strat == "2" ? "fsdp_shard_grad_op"
                                : strat == "HYBRID_SHARD" || strat == "4" ? "fsdp_hybrid"
                                                                          : "fsdp_full_shard",
          s ? "fsdp_config.fsdp_sharding_strategy" : "distributed_type");
    if (const json* o = m.get("fsdp_config.fsdp_offload_params"); o && truthy(*o))
      m.set("parallelism.offload_params", true, "fsdp_config.fsdp_offload_params");
    if (const json* c = m.get("fsdp_config.fsdp_activation_checkpointing"); c && truthy(*c))
      m.set("gradient_checkpointing", true, "fsdp_config.fsdp_activation_checkpointing");
  }
  if (procs > 1 && (type == "MULTI_GPU" || type == "DEEPSPEED" || type == "FSDP")) m.set("parallelism.dp", procs, "num_processes");
  if (const json* mp = m.get("mixed_precision"); mp && mp->is_string()) {
    const std::string s = mp->get<std::string>();
    if (s == "bf16") m.set("precision", "amp_bf16", "mixed_precision");
    else if (s == "fp16") m.set("precision", "amp_fp16", "mixed_precision");
    else if (s == "no") m.set("precision", "fp32", "mixed_precision");
  }
}

using MapFn = void (*)(Mapper&);
struct Format {
  const char* name;
  MapFn map;
  std::vector<const char*> signature;  ///< any of these keys present: the file is this format
};

const std::vector<Format>& formats() {
  static const std::vector<Format> table = {
      {"deepspeed", map_deepspeed, {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"}},
      {"accelerate", map_accelerate, {"compute_environment", "distributed_type"}},
      {"torchtune", map_torchtune, {"model._component_", "tokenizer._component_", "checkpointer._component_"}},
      {"llamafactory", map_llamafactory, {"finetuning_type", "stage", "cutoff_len", "lora_target"}},
      {"axolotl", map_axolotl, {"base_model", "sequence_len", "lora_target_linear"}},
      {"litgpt", map_litgpt, {"checkpoint_dir", "train.global_batch_size", "lora_query"}},
      {"training_args", map_training_args, {"per_device_train_batch_size", "output_dir", "max_length"}},
  };
  return table;
}

const Format& detect(const json& tree, const std::string& hint) {
  json empty = json::object();
  for (const Format& f : formats()) {
    if (!hint.empty() && hint != "auto") {
      if (hint == f.name) return f;
      continue;
    }
    Mapper probe{tree, empty};
    for (const char* key : f.signature)
      if (probe.get(key)) return f;
  }
  std::string names;
  for (const Format& f : formats()) names += (names.empty() ? "" : ", ") + std::string(f.name);
  if (!hint.empty() && hint != "auto") throw Error("unknown launch-config format \"" + hint + "\" (known: " + names + ")");
  throw Error("this file is none of the launch configs memfit reads (" + names +
              "): no key any of them requires was found; pass the format explicitly, or write a request");
}

/// The request fields a reader should check when the file did not give them.
constexpr const char* kReported[] = {
    "model.id", "task", "precision", "quantization", "optimizer", "micro_batch_size", "sequence_length",
    "gradient_accumulation_steps", "gradient_checkpointing", "attention", "lora.rank", "lora.alpha", "lora.dropout",
    "lora.targets", "parallelism.method", "num_gpus", "runtime.framework", "gpu"};

/// Deep merge: `over` wins.
void merge(json& into, const json& over) {
  for (auto it = over.begin(); it != over.end(); ++it) {
    if (it->is_object() && into.contains(it.key()) && into[it.key()].is_object()) merge(into[it.key()], *it);
    else into[it.key()] = *it;
  }
}

}  // namespace

std::vector<std::string> intake_formats() {
  std::vector<std::string> out;
  for (const Format& f : formats()) out.push_back(f.name);
  return out;
}

json intake(const json& input) {
  if (!input.is_object() || !input.contains("config") || !input["config"].is_object())
    throw Error("intake needs {\"config\": {...the parsed launch config...}}");
  const json& tree = input["config"];
  const json lines = input.value("lines", json::object());
  const std::string hint = input.contains("format") && input["format"].is_string() ? input["format"].get<std::string>() : "auto";
  const Format& f = detect(tree, hint);
  Mapper m{tree, lines};
  f.map(m);
  json request = input.value("base", json::object());
  if (!request.is_object()) throw Error("intake: \"base\" must be a request object");
  merge(request, m.request);
  json defaulted = json::array();
  for (const char* field : kReported) {
    const std::string fs = field;
    const bool from_base = (fs == "gpu" && request.contains("gpu")) || (fs == "model.id" && request.contains("model"));
    if (!m.sources.contains(fs) && !from_base) defaulted.push_back(fs);
  }
  json ignored = json::array();
  for (auto it = tree.begin(); it != tree.end(); ++it)
    if (!m.used.count(it.key())) ignored.push_back(it.key());
  return json_object({{"format", f.name}, {"request", request}, {"sources", m.sources}, {"defaulted", defaulted},
                      {"ignored", ignored}, {"notes", m.notes}});
}

}  // namespace memfit
