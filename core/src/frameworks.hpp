// memfit: what each training framework does by default, as data (frameworks.cpp holds the table).
//
// A framework decides things the user rarely writes down: the dtype the model is loaded in,
// which Linears get LoRA and with what dropout, how the loss is computed, whether QLoRA runs
// PEFT's prepare_model_for_kbit_training, and what its own printed "memory used" covers.
// Every default here can be overridden in the request.
#pragma once

#include <string>
#include <vector>

#include "memfit/request.hpp"

namespace memfit {

/// Which modules get LoRA when the request names none.
enum class LoraTargetsDefault {
  PeftMapping,      ///< PEFT's per-model_type mapping (family_traits.cpp); all-linear where it has none
  AllLinear,        ///< every Linear in the decoder layers
  AttentionAndMlp,  ///< q, k, v, o, gate, up, down (Unsloth's documented call)
  AttentionOutMlp,  ///< torchtune recipes: q, v, output projection + the MLP
  QueryValue,       ///< q and v only (LitGPT's lora_query / lora_value)
};

/// The dtype the base weights are loaded in when the request gives no precision.
enum class LoadDtype {
  Checkpoint,          ///< the config's torch_dtype / dtype (Transformers 5 from_pretrained default)
  Fp32Bf16Autocast,    ///< fp32 weights, bf16 autocast (amp_bf16)
  Bf16,                ///< bf16 weights (pure half)
};

/// How the loss reaches the logits.
enum class LossKind {
  Plain,               ///< full [b, s, V] logits, upcast to fp32 inside cross-entropy
  ChunkedOutput,       ///< the head output is a list of chunks, each upcast separately (torchtune, LitGPT)
  FusedLinear,         ///< the head and the loss fused: no [b, s, V] logits (TRL's fused LM head, Liger FLCE)
  /// LitGPT chunked_cross_entropy: cross-entropy per loss_chunk_tokens rows of the shifted
  /// logits; LoRA (finetune/lora.py) also runs the head in chunks of loss_chunk_tokens positions,
  /// full fine-tuning (finetune/full.py) in one piece. See activations.cpp litgpt_head.
  ChunkedRows,
};

struct FrameworkTraits {
  Framework id;
  const char* name;               ///< request value
  const char* since_version;      ///< this row applies from this version on (rows of one framework ascend)
  const char* modelled_version;   ///< the version whose source the row was read from
  double lora_dropout;            ///< default lora_dropout
  LoraTargetsDefault lora_targets;
  LoadDtype full_load;            ///< full fine-tuning precision default
  LoadDtype lora_load;            ///< LoRA/QLoRA base-weight precision default
  bool adapters_in_model_dtype;   ///< adapters stay in the base dtype (false: PEFT upcasts them to fp32)
  bool prepare_kbit;              ///< QLoRA runs prepare_model_for_kbit_training by default
  bool gradient_checkpointing;    ///< switched on by default (TRL's SFTConfig)
  LossKind loss;
  u64 loss_chunks;                ///< ChunkedOutput: a fixed number of chunks (0: see chunk_tokens)
  u64 loss_chunk_tokens;          ///< ChunkedOutput: chunks of this many tokens (LitGPT: 128)
  bool logits_metrics;            ///< [b, s, V] logits stay alive after the loss for metrics (TRL 1.0)
  bool own_model_code;            ///< runs its own model implementation (Transformers' kernel flags do not apply)
  bool measured_on_cpu;           ///< its own training step runs in memfit's CPU validator
  const char* memory_report;      ///< what the framework's own printed memory figure covers
  const char* source;             ///< where the row's facts were read
  /// The trainer casts the trainable parameters of a bitsandbytes-quantized (QLoRA) model to
  /// bf16 after get_peft_model, whatever the precision (TRL's SFTTrainer).
  bool quantized_adapters_bf16 = false;
  /// The training loop keeps the model output (the logits) referenced through backward and the
  /// optimizer step until the next forward returns (LitGPT's fit(): `logits = model(...)`).
  bool keeps_outputs = false;
  /// FSDP (FSDP1, use_orig_params=True) wraps each decoder layer as one unit, so one flat parameter
  /// holds the layer's frozen base weights and its adapters; it requires grad because an adapter
  /// does, and backward fills a gradient for all of it (torch fsdp/_wrap_utils.py
  /// _validate_frozen_params: "total numel instead of nonfrozen numel before sharding"). Default of
  /// parallelism.frozen_in_trained_units.
  bool fsdp_frozen_in_trained_units = false;
  /// Gradient-accumulation micro-batches run without gradient sync (Fabric no_backward_sync ->
  /// FSDP1 no_sync() / FSDP2 set_requires_gradient_sync(False)): each GPU accumulates unsharded
  /// gradients until the synchronising micro-batch. Default of parallelism.unsharded_grad_accumulation.
  bool fsdp_no_sync_accumulation = false;
  /// The framework's model runs the dropouts of the checkpoint's config (attention, residual,
  /// embedding). False: its own modules have none (LitGPT's GPT: litgpt/model.py has no
  /// nn.Dropout, only scaled_dot_product_attention(dropout_p=0.0)).
  bool runs_config_dropout = true;
  /// The framework's MLP calls torch's fused activation (F.gelu / F.silu, which keep only their
  /// input) where Transformers runs a GELU written in Python ops (gelu_new and alike keep four
  /// [T, i] tensors): LitGPT model.py GptNeoxMLP / LLaMAMLP / GemmaMLP.
  bool fused_mlp_activation = false;
  /// QLoRA through Lightning's BitsandbytesPrecision (LitGPT --quantize bnb.*): every nn.Linear is
  /// replaced, lm_head's too (no ignore_modules), where Transformers' BitsAndBytesConfig skips it.
  bool bnb_quantizes_lm_head = false;
  /// ... and Lightning's _Linear4bit.quantize casts the weight to fp16 before quantize_4bit, so
  /// dequantize_4bit returns fp16 and MatMul4Bit's .to(A.dtype) makes a second dense copy in the
  /// compute dtype (bitsandbytes 0.41/0.42 autograd/_functions.py; functional.py dequantize_4bit
  /// allocates quant_state.dtype).
  bool bnb_quantized_from_fp16 = false;
  /// The framework's model has its own lm_head even where the checkpoint ties it to the embedding
  /// (LitGPT: GPT.lm_head is an nn.Linear; convert_hf_checkpoint copies wte into it; finetune
  /// rejects train.tie_embeddings).
  bool unties_embeddings = false;
  /// The optimizer steps lm_head right before the token table (LitGPT's GPT registers lm_head, then
  /// transformer.wte; litgpt/model.py GPT.__init__), so a per-tensor step's temporaries of the one
  /// still exist at the other's (states.cpp step_pair_x2).
  bool head_steps_before_embedding = false;
};

/// The row for a framework at a version ("" = the newest row). Throws Error for a version
/// older than the first row (named in the message).
[[nodiscard]] const FrameworkTraits& framework_traits(Framework f, const std::string& version);

/// Which request fields the user gave (the others take the framework's defaults).
struct GivenFields {
  bool precision = false;
  bool attention = false;
  bool lora_targets = false;
  bool lora_dropout = false;
  bool prepare_kbit = false;
  bool gradient_checkpointing = false;
  bool loss_chunks = false;
  bool drop_outputs = false;  ///< runtime.drop_outputs_before_backward
  bool frozen_in_trained_units = false;      ///< parallelism.frozen_in_trained_units
  bool unsharded_grad_accumulation = false;  ///< parallelism.unsharded_grad_accumulation
};

/// Fills every field the user left out with what the request's framework does for that model
/// and task, and rejects a named kernel the model cannot run. Notes what it chose in r.warnings.
void apply_framework_defaults(Request& r, const GivenFields& given);

/// Every row of the table, in order (one framework may have several version rows).
[[nodiscard]] std::vector<const FrameworkTraits*> framework_rows();

/// The accepted request values of runtime.framework ("hf" is an alias of "transformers").
[[nodiscard]] std::vector<std::string> framework_names();

/// Parses a request value; false if unknown.
[[nodiscard]] bool framework_from_name(const std::string& name, Framework& out);

}  // namespace memfit
