// The framework table: one row per framework and version range (see frameworks.hpp).
//
// Facts were read from each framework's own source; the row's `source` says where. A framework
// whose step memfit's CPU validator does not run has measured_on_cpu = false, and the estimate
// says so in its notes.
#include "frameworks.hpp"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "memfit/error.hpp"

namespace memfit {

namespace {

using LT = LoraTargetsDefault;
using LD = LoadDtype;

// clang-format off
constexpr FrameworkTraits kFrameworks[] = {
    // Transformers 5 from_pretrained loads the checkpoint's dtype ("auto" became the default): the LoRA
    // default; full fine-tuning keeps the fp32-load + bf16=True recipe (noted in the output);
    // TrainingArguments has bf16=False and gradient_checkpointing=False; PEFT LoraConfig has
    // lora_dropout=0.0 and target_modules=None -> its per-model_type mapping; the LM loss
    // upcasts the full logits to fp32 (ForCausalLMLoss).
    {Framework::Transformers, "transformers", "5.0", "5.23", 0.0, LT::PeftMapping,
     LD::Fp32Bf16Autocast, LD::Checkpoint, false, true, false, LossKind::Plain, 0, 0, false, false, true,
     "torch.cuda.max_memory_allocated() if the user prints it (the Trainer prints none)",
     "transformers modeling_utils (dtype='auto'), training_args.py; peft tuners_utils._prepare_adapter_config"},
    // TRL 1.0 SFTTrainer: the model id is loaded in float32 (model_init_kwargs), SFTConfig sets
    // bf16=True and gradient_checkpointing=True; TRL's ModelConfig LoRA: r 16, alpha 32,
    // dropout 0.05, targets None (PEFT mapping). Entropy and mean_token_accuracy are computed
    // from the [b, s, V] logits after the loss, so the logits live until the step ends.
    {Framework::Trl, "trl", "1.0", "1.0", 0.05, LT::PeftMapping,
     LD::Fp32Bf16Autocast, LD::Fp32Bf16Autocast, false, true, true, LossKind::Plain, 0, 0, true, false, false,
     "none printed", "trl trainer/sft_config.py, trainer/model_config.py, trainer/sft_trainer.py (compute_loss metrics)"},
    // TRL 1.16: add_fused_lm_head(outputs=("log_probs", "entropy", "is_top1")) computes the
    // loss and both metrics in chunks without materialising the full logits. For a model
    // loaded in 4/8-bit, SFTTrainer.__init__ then casts every trainable parameter except
    // DoRA's magnitude to bf16 (the QLoRA paper's recipe; PEFT's autocast_adapter_dtype=False
    // is not supported for quantized models).
    {Framework::Trl, "trl", "1.16", "1.16", 0.05, LT::PeftMapping,
     LD::Fp32Bf16Autocast, LD::Fp32Bf16Autocast, false, true, true, LossKind::FusedLinear, 0, 0, false, false, true,
     "none printed", "trl 1.16 trainer/sft_trainer.py (add_fused_lm_head; bf16 adapters when _is_quantized_model), trainer/utils.py",
     true},
    // torchtune 0.6 recipes: dtype bf16, CEWithChunkedOutputLoss (8 chunks), LoRA on
    // q/v/output_proj + MLP in the shipped *_lora configs, lora_dropout 0.0 (model builders),
    // adapters in the model dtype.
    {Framework::Torchtune, "torchtune", "0.1", "0.6.1", 0.0, LT::AttentionOutMlp,
     LD::Bf16, LD::Bf16, true, false, false, LossKind::ChunkedOutput, 8, 0, false, true, true,
     "log_memory_stats: torch.cuda.max_memory_allocated / reserved of the step",
     "torchtune models/llama3/_model_builders.py, modules/loss/ce_chunked_output_loss.py, recipes/configs/*_lora*.yaml"},
    // LitGPT 0.5.13 finetune/lora.py: lora_r 8, alpha 16, dropout 0.05, query+value only (one
    // LoRAQKVLinear on the fused qkv); precision get_default_supported_precision(training=True)
    // = "bf16-mixed" (fp32 weights, adapters too; Fabric returns the outputs in fp32);
    // lora.py runs model(input_ids, lm_head_chunk_size=128), full.py model(input_ids), both
    // chunked_cross_entropy (128 rows) on the shifted logits, which fit() keeps referenced until
    // the next forward; torch.optim.AdamW with torch's defaults; no activation checkpointing on
    // one device. Its printed "Memory used" (create_finetuning_performance_report, CUDA only) is
    // max_memory_allocated after fit(): the training steps, the 2-batch sanity validation before
    // them and any interval validation / sample generation, not the final validation (run after
    // the report). Measured on CPU: validate/frameworks.py run_litgpt. (lit-gpt 8641822, Oct 2023,
    // setup.py 0.1.0, ran the same single-device step: lm_head_chunk_size=128, chunked loss.)
    // Its GPT has no dropout module (lit_gpt/model.py at 8641822, litgpt/model.py v0.4.0 and
    // 0.5.13: only scaled_dot_product_attention(dropout_p=0.0)): a config's resid_pdrop /
    // attention_dropout / embd_pdrop (phi-2's HF config: resid_pdrop 0.1) do not apply. Its MLPs
    // call torch.nn.functional.gelu(approximate=config.gelu_approximate) or silu (model.py
    // GptNeoxMLP, LLaMAMLP, GemmaMLP at v0.4.0 and 0.5.13), never a GELU in Python ops. Its QLoRA
    // is Lightning's BitsandbytesPrecision(quantize[4:], dtype) without ignore_modules (finetune/
    // lora.py at 8641822 and v0.4.0): lm_head is quantized too, from an fp16 copy (Lightning
    // fabric/plugins/precision/bitsandbytes.py _Linear4bit.quantize at 71aed751, 527d071f and 2.6).
    // Its GPT always has its own lm_head (model.py: nn.Linear; scripts/convert_hf_checkpoint.py
    // copies transformer.wte.weight into lm_head.weight for tied checkpoints such as Gemma's;
    // finetune/lora.py validate_args rejects train.tie_embeddings; v0.4.0 and 0.5.13).
    // Three rows for its multi-GPU strategy; every one runs the accumulation micro-batches under
    // fabric.no_backward_sync (finetune/lora.py and full.py at 8641822, v0.4.0 to v0.5.13), i.e.
    // FSDP1 no_sync() (Lightning fabric/strategies/fsdp.py _FSDPBackwardSyncControl, 71aed751 and
    // 2.6) or FSDP2 set_requires_gradient_sync(False): unsharded gradients accumulate.
    // 0.1 (8641822) to 0.5.7: lora.py FSDPStrategy(auto_wrap_policy={Block}), whose default
    // use_orig_params=True (fsdp.py at 71aed751) puts each Block's frozen weights and adapters in
    // one flat parameter.
    {Framework::Litgpt, "litgpt", "0.1", "0.5.13", 0.05, LT::QueryValue,
     LD::Fp32Bf16Autocast, LD::Fp32Bf16Autocast, true, false, false, LossKind::ChunkedRows, 0, 128, false, true, true,
     "torch.cuda.max_memory_allocated() after fit(), printed before the final validation: the training steps, the "
     "sanity validation before them and any interval validation / sample generation",
     "litgpt 0.5.13 finetune/lora.py, finetune/full.py, lora.py, model.py, utils.py (chunked_cross_entropy); "
     "FSDP: finetune/lora.py at 8641822..v0.5.7 (FSDPStrategy(auto_wrap_policy={Block}), no_backward_sync)",
     false, true, true, true, false, true, true, true, true, true},
    // 0.5.8 (281510ab "Do not wrap LoRA layers with FSDP", #1538) to 0.5.10: auto_wrap_policy=
    // {torch.nn.Linear}: the frozen Linears are units of their own; the adapters, norms and the
    // embedding share the root unit's flat parameter (its gradient is not modelled).
    {Framework::Litgpt, "litgpt", "0.5.8", "0.5.13", 0.05, LT::QueryValue,
     LD::Fp32Bf16Autocast, LD::Fp32Bf16Autocast, true, false, false, LossKind::ChunkedRows, 0, 128, false, true, true,
     "torch.cuda.max_memory_allocated() after fit(), printed before the final validation: the training steps, the "
     "sanity validation before them and any interval validation / sample generation",
     "litgpt 0.5.13 finetune/lora.py, finetune/full.py, lora.py, model.py, utils.py (chunked_cross_entropy); "
     "FSDP: finetune/lora.py v0.5.8..v0.5.10 (FSDPStrategy(auto_wrap_policy={torch.nn.Linear}), no_backward_sync)",
     false, true, false, true, false, true, true, true, true, true},
    // 0.5.11 (5ac69b06, #2086) on: lora.py ModelParallelStrategy + fully_shard per trainable Linear
    // and Block (FSDP2: per-parameter gradients, only the adapters get one).
    {Framework::Litgpt, "litgpt", "0.5.11", "0.5.13", 0.05, LT::QueryValue,
     LD::Fp32Bf16Autocast, LD::Fp32Bf16Autocast, true, false, false, LossKind::ChunkedRows, 0, 128, false, true, true,
     "torch.cuda.max_memory_allocated() after fit(), printed before the final validation: the training steps, the "
     "sanity validation before them and any interval validation / sample generation",
     "litgpt 0.5.13 finetune/lora.py (ModelParallelStrategy, parallelize_fn), finetune/full.py, lora.py, model.py, utils.py "
     "(chunked_cross_entropy)",
     false, true, false, true, false, true, true, true, true, true},
    // Axolotl: model loaded in bf16 when bf16 is on (its examples set bf16: auto), Trainer
    // underneath; PEFT targets from lora_target_modules / lora_target_linear, dropout 0.0
    // when unset; QLoRA through prepare_model_for_kbit_training.
    {Framework::Axolotl, "axolotl", "0.5", "0.9", 0.0, LT::PeftMapping,
     LD::Bf16, LD::Bf16, false, true, false, LossKind::Plain, 0, 0, false, false, false,
     "none printed by default", "axolotl utils/schemas/peft.py, loaders/model.py"},
    // LLaMA-Factory: LoRA lora_target "all" (all linear), lora_dropout 0.0, model in the
    // compute dtype (bf16); full fine-tuning upcasts the trainable parameters to fp32.
    {Framework::LlamaFactory, "llamafactory", "0.8", "0.9", 0.0, LT::AllLinear,
     LD::Fp32Bf16Autocast, LD::Bf16, false, true, false, LossKind::Plain, 0, 0, false, false, false,
     "none printed", "llamafactory hparams/finetuning_args.py, model/adapter.py"},
    // ms-swift: target_modules all-linear, lora_dropout 0.05, torch_dtype from the checkpoint.
    {Framework::Swift, "swift", "3.0", "3.x", 0.05, LT::AllLinear,
     LD::Checkpoint, LD::Checkpoint, false, true, false, LossKind::Plain, 0, 0, false, false, false,
     "none printed", "swift arguments/tuner_args.py (documented defaults)"},
    // Unsloth FastLanguageModel.get_peft_model: q/k/v/o/gate/up/down, lora_dropout 0,
    // bf16 weights; its offloaded "unsloth" checkpointing and fused kernels are not modelled.
    {Framework::Unsloth, "unsloth", "2024.1", "2025.x", 0.0, LT::AttentionAndMlp,
     LD::Bf16, LD::Bf16, false, true, true, LossKind::FusedLinear, 0, 0, false, true, false,
     "none printed", "unsloth models/llama.py get_peft_model (documented defaults)"},
};
// clang-format on

/// "1.16.0" > "1.2": compares dot-separated numbers (missing parts are 0).
int compare_versions(const std::string& a, const std::string& b) {
  const char* pa = a.c_str();
  const char* pb = b.c_str();
  while (*pa || *pb) {
    char* ea = nullptr;
    char* eb = nullptr;
    const long va = *pa ? std::strtol(pa, &ea, 10) : 0;
    const long vb = *pb ? std::strtol(pb, &eb, 10) : 0;
    if (va != vb) return va < vb ? -1 : 1;
    pa = *pa ? ea : pa;
    pb = *pb ? eb : pb;
    while (*pa && (*pa < '0' || *pa > '9')) ++pa;
    while (*pb && (*pb < '0' || *pb > '9')) ++pb;
  }
  return 0;
}

bool plausible_version(const std::string& v) {
  if (v.empty() || v.size() > 32 || v[0] < '0' || v[0] > '9') return false;
  for (char c : v)
    if (!((c >= '0' && c <= '9') || c == '.' || (c >= 'a' && c <= 'z') || c == '+' || c == '-')) return false;
  return true;
}

Precision load_precision(LoadDtype load, const ModelSpec& m) {
  switch (load) {
    case LoadDtype::Fp32Bf16Autocast: return Precision::AmpBf16;
    case LoadDtype::Bf16: return Precision::Bf16;
    case LoadDtype::Checkpoint:
      if (m.checkpoint_dtype == "bfloat16") return Precision::Bf16;
      if (m.checkpoint_dtype == "float16") return Precision::Fp16;
      return Precision::Fp32;  // "float32", or no dtype in the config: from_pretrained loads fp32
  }
  return Precision::AmpBf16;
}

const char* kernel_name(AttentionImpl a) { return to_string(a); }

/// The kernel that runs when none is named, and an Error for a named one the model lacks.
void resolve_attention(Request& r, const GivenFields& given, const FrameworkTraits& fw) {
  const ModelSpec& m = r.model;
  if (fw.own_model_code) {
    if (!given.attention) r.attention = AttentionImpl::Sdpa;  // torchtune / LitGPT call F.scaled_dot_product_attention
    return;
  }
  if (!given.attention) {
    r.attention = m.default_attention;
    return;
  }
  const bool runs = r.attention == AttentionImpl::Eager       ? !m.remote_code || m.default_attention == AttentionImpl::Eager
                    : r.attention == AttentionImpl::Sdpa      ? m.supports_sdpa
                                                              : m.supports_flash_attention_2;
  if (runs) return;
  const std::string why = m.remote_code ? "its remote modeling code picks the kernel itself"
                                        : "Transformers 5.23 has no such path for it";
  throw Error(std::string("attention \"") + kernel_name(r.attention) + "\" cannot run for model_type \"" + m.model_type +
              "\" (" + why + "): it runs \"" + kernel_name(m.default_attention) + "\"; set attention to \"" +
              kernel_name(m.default_attention) + "\" or \"auto\"");
}

/// LoRA targets the framework picks when the request names none.
void resolve_lora_targets(Request& r, const FrameworkTraits& fw) {
  const ModelSpec& m = r.model;
  auto has_linear = [&](const char* name) {
    for (const LayerGroup& g : m.groups)
      for (const Linear& l : g.linears)
        if (l.name == name) return true;
    return false;
  };
  r.lora.all_linear = false;
  switch (fw.lora_targets) {
    case LoraTargetsDefault::AllLinear: r.lora.all_linear = true; r.lora.targets.clear(); return;
    case LoraTargetsDefault::AttentionAndMlp:
      r.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
      break;
    case LoraTargetsDefault::AttentionOutMlp:
      r.lora.targets = {"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
      break;
    case LoraTargetsDefault::QueryValue: r.lora.targets = {"q_proj", "v_proj"}; break;
    case LoraTargetsDefault::PeftMapping: r.lora.targets = m.peft_lora_targets; break;
  }
  if (fw.lora_targets != LoraTargetsDefault::PeftMapping && has_linear("q_proj")) return;
  // PEFT's mapping (and the fallback for models without q_proj-style names).
  r.lora.targets = m.peft_lora_targets;
  if (!r.lora.targets.empty()) return;
  r.lora.all_linear = true;
  r.warnings.push_back("PEFT has no default LoRA target_modules for model_type \"" + m.model_type +
                       "\" (LoraConfig then raises): estimated for \"all-linear\"; set lora.targets to what you pass");
}

/// Transformers' GELUs written in Python ops -> the fused torch kernel with the same curve
/// (F.gelu(approximate="tanh") for the tanh forms, F.gelu for the erf form).
constexpr std::pair<const char*, const char*> kFusedActivation[] = {
    {"gelu_new", "gelu_pytorch_tanh"}, {"gelu_fast", "gelu_pytorch_tanh"}, {"gelu_python", "gelu"}};

/// The precision the framework loads and trains in when the request names none.
void resolve_precision(Request& r, const FrameworkTraits& fw) {
  if (r.task == Task::Inference) return;
  const bool lora = r.task == Task::Lora || r.task == Task::Qlora;
  r.precision = load_precision(lora ? fw.lora_load : fw.full_load, r.model);
  r.notes.push_back(std::string("precision \"") + to_string(r.precision) + "\": the " + fw.name + " " +
                       fw.modelled_version + " default for " + (lora ? "LoRA/QLoRA" : "full fine-tuning") +
                       (lora && !fw.adapters_in_model_dtype ? (r.lora.adapter_bytes == 2 ? " (bf16 adapters)" : " (fp32 adapters)") : "") + "; set precision to override" +
                       (!lora && fw.lora_load == LoadDtype::Checkpoint && fw.full_load != LoadDtype::Checkpoint
                            ? " (the usual recipe: dtype=float32 with bf16=True; without dtype= Transformers 5 loads the "
                              "checkpoint's dtype: precision \"bf16\" or \"fp16\" then)"
                            : ""));
}

bool bitsandbytes(Quantization q) {
  return q == Quantization::Nf4 || q == Quantization::Nf4Double || q == Quantization::Fp4 || q == Quantization::Int8;
}

}  // namespace

void apply_framework_defaults(Request& r, const GivenFields& given) {
  const FrameworkTraits& fw = framework_traits(r.runtime.framework, r.runtime.framework_version);
  if (r.runtime.framework_version.empty()) r.runtime.framework_version = fw.modelled_version;
  const bool lora = r.task == Task::Lora || r.task == Task::Qlora;
  if (!given.lora_dropout) r.lora.dropout = fw.lora_dropout;
  if (fw.quantized_adapters_bf16 && r.task == Task::Qlora && bitsandbytes(r.quantization) && r.lora.adapter_bytes == 0)
    r.lora.adapter_bytes = 2;
  if (!given.precision) resolve_precision(r, fw);
  // adapters in the weights' dtype (the resolved precision's): fp32 in fp32 and under autocast
  const bool weights_fp32 = r.precision == Precision::Fp32 || r.precision == Precision::AmpBf16 || r.precision == Precision::AmpFp16;
  if (fw.adapters_in_model_dtype && (r.lora.adapter_bytes == 0 || (r.lora.adapter_bytes == 2 && r.precision == Precision::Fp32)))
    r.lora.adapter_bytes = weights_fp32 ? 4 : 2;
  if (fw.keeps_outputs && !given.drop_outputs) r.runtime.drop_outputs_before_backward = false;
  if (!fw.runs_config_dropout) {
    ModelSpec& m = r.model;
    if (m.attention_dropout > 0 || m.hidden_dropout > 0 || m.embedding_dropout > 0)
      r.notes.push_back(std::string(fw.name) + "'s own model has no dropout modules: the config's attention / "
                           "residual / embedding dropout does not apply");
    m.attention_dropout = m.hidden_dropout = m.embedding_dropout = 0;
  }
  if (fw.unties_embeddings && r.model.tied_embeddings) {
    r.model.tied_embeddings = false;
    r.notes.push_back(std::string(fw.name) + " copies the tied embedding into a separate lm_head: counted as two matrices");
  }
  if (fw.fused_mlp_activation)
    for (const auto& [python_ops, fused] : kFusedActivation)
      if (r.model.activation == python_ops) r.model.activation = fused;
  if (!given.frozen_in_trained_units) r.parallelism.frozen_in_trained_units = fw.fsdp_frozen_in_trained_units;
  if (!given.unsharded_grad_accumulation) r.parallelism.unsharded_grad_accumulation = fw.fsdp_no_sync_accumulation;
  if (lora && !given.lora_targets) resolve_lora_targets(r, fw);
  resolve_attention(r, given, fw);
  if (!given.prepare_kbit) r.runtime.prepare_kbit = r.task == Task::Qlora && fw.prepare_kbit && bitsandbytes(r.quantization);
  // prepare_model_for_kbit_training(use_gradient_checkpointing=True) switches checkpointing on;
  // TRL's SFTConfig defaults to gradient_checkpointing=True.
  if (!given.gradient_checkpointing && r.task != Task::Inference)
    r.gradient_checkpointing = fw.gradient_checkpointing || (r.task == Task::Qlora && r.runtime.prepare_kbit);
  if (given.loss_chunks && r.runtime.loss_chunks > 1 && fw.loss == LossKind::ChunkedRows)
    throw Error(std::string("runtime.loss_chunks is torchtune's CEWithChunkedOutputLoss; ") + fw.name +
                " chunks its loss itself (lm_head_chunk_size=128 in finetune/lora.py, 128-row cross-entropy "
                "chunks): leave runtime.loss_chunks out");
  if (!given.loss_chunks && fw.loss == LossKind::ChunkedOutput && r.task != Task::Inference)
    r.runtime.loss_chunks = fw.loss_chunks ? fw.loss_chunks : std::max<u64>(1, div_ceil(r.sequence_length, fw.loss_chunk_tokens));
  if (fw.loss == LossKind::FusedLinear && r.task != Task::Inference)
    r.warnings.push_back(std::string(fw.name) + " " + fw.modelled_version +
                         " fuses the LM head with the loss (no [batch, sequence, vocab] logits); memfit models the "
                         "unfused head, so logits_loss is an over-estimate for it");
  if (r.runtime.framework != Framework::Transformers && r.task != Task::Inference)
    r.notes.push_back(std::string(fw.name) + "'s own memory figure: " + fw.memory_report);
  if (!fw.measured_on_cpu)
    r.warnings.push_back(std::string(fw.name) + ": its defaults are read from its source (" + fw.source +
                         "); memfit's CPU validator does not run its own training step, so its figures are not measured");
}

const FrameworkTraits& framework_traits(Framework f, const std::string& version) {
  const FrameworkTraits* found = nullptr;
  const FrameworkTraits* first = nullptr;
  for (const FrameworkTraits& t : kFrameworks) {
    if (t.id != f) continue;
    if (!first) first = &t;
    if (version.empty() || compare_versions(version, t.since_version) >= 0) found = &t;
  }
  if (!first) throw Error("internal: framework missing from the table");
  if (!version.empty() && !plausible_version(version))
    throw Error("request field \"runtime.framework_version\" must be a version like \"" + std::string(first->modelled_version) +
                "\"; got \"" + version + "\"");
  if (!found)
    throw Error(std::string("runtime.framework_version \"") + version + "\" is older than " + first->name + " " +
                first->since_version + ", the first version memfit models: use " + first->since_version + " or newer");
  return *found;
}

std::vector<const FrameworkTraits*> framework_rows() {
  std::vector<const FrameworkTraits*> out;
  for (const FrameworkTraits& t : kFrameworks) out.push_back(&t);
  return out;
}

std::vector<std::string> framework_names() {
  std::vector<std::string> out;
  for (const FrameworkTraits& t : kFrameworks)
    if (out.empty() || out.back() != t.name) out.push_back(t.name);
  out.push_back("hf");
  return out;
}

bool framework_from_name(const std::string& name, Framework& out) {
  if (name == "hf") {
    out = Framework::Transformers;
    return true;
  }
  for (const FrameworkTraits& t : kFrameworks)
    if (name == t.name) {
      out = t.id;
      return true;
    }
  return false;
}

}  // namespace memfit
