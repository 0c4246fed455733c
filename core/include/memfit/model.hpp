// memfit: what a Hugging Face config.json says about a model, in the terms memory depends on.
//
// `parse_model_config` reads an authentic config.json (any supported `model_type`, nested
// `text_config` of multimodal files included) into a ModelSpec: every parameter tensor the
// Transformers implementation creates, grouped into layer groups of identical decoder layers,
// plus the traits the activation model needs (norm kind, MLP kind, attention kind, dropouts).
// Parameter counts are exact: tied embeddings once, biases, norms, routers, experts, MLA
// projections and learned position embeddings all included.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "memfit/checked.hpp"

namespace memfit {

/// How tensor parallelism (Megatron-style) splits a linear layer.
enum class TpSplit { Column, Row, Replicated };

/// Which activation a Linear reads: what autograd keeps for its weight gradient depends on it.
enum class LinearInput {
  AttnIn,     ///< the normed hidden state entering attention (q/k/v, fused qkv, MLA down-projections)
  AttnOut,    ///< the attention output entering o_proj
  MlpIn,      ///< the normed hidden state entering the MLP (gate/up/fc1, routers, experts)
  MlpHidden,  ///< the MLP's intermediate activation entering down_proj / fc2
  Latent,     ///< MLA: a compressed latent entering q_b_proj / kv_b_proj
};

/// One nn.Linear (or a stack of identical ones, e.g. the routed experts of a MoE layer).
struct Linear {
  std::string name;       ///< Transformers module name ("q_proj", "c_attn", ...); LoRA targets match it
  u64 in = 0;             ///< in_features
  u64 out = 0;            ///< out_features
  bool bias = false;
  u64 copies = 1;         ///< identical modules (routed experts); 1 otherwise
  TpSplit split = TpSplit::Replicated;
  bool routed = false;    ///< a routed expert: only `experts_per_token / experts` of tokens pass it
  LinearInput input = LinearInput::AttnIn;
  bool checkpoint_quantized = false;  ///< stored in the checkpoint's quantized format (ModelSpec::checkpoint_quant)
  bool peft_module = true;  ///< an nn.Linear PEFT can wrap; false for a custom module holding weight/bias (gpt-oss router)
  bool stored_with_next = false;  ///< this weight and the next Linear's are one parameter (fused experts' gate_up_proj)

  [[nodiscard]] u64 weight_params() const { return mul(in, out, copies); }
  [[nodiscard]] u64 bias_params() const { return bias ? mul(out, copies) : 0; }
  [[nodiscard]] u64 params() const { return add(weight_params(), bias_params()); }
};

enum class NormKind { RMSNorm, LayerNorm, LayerNormNoBias, NonParametric };
enum class MlpKind { Gated, Plain };         ///< Gated: act(gate(x)) * up(x) (SwiGLU, GeGLU)
enum class AttentionKind { Standard, MultiLatent };
/// The attention kernel that runs. The request's "auto" resolves, per model, to what the
/// implementation runs when attn_implementation is not given (ModelSpec::default_attention).
enum class AttentionImpl { Eager, Sdpa, FlashAttention2 };

/// What one decoder layer attends to, i.e. what its KV cache must hold (serving reads it).
enum class LayerAttention {
  Full,           ///< every earlier token
  SlidingWindow,  ///< the last `sliding_window` tokens (Mistral, Gemma 2/3, gpt-oss)
  Chunked,        ///< tokens of the same `attention_chunk`-sized block (Llama 4 RoPE layers)
};

/// `count` consecutive decoder layers with the same structure.
struct LayerGroup {
  u64 count = 0;
  std::vector<Linear> linears;
  u64 other_params = 0;     ///< norms, q/k norms and other non-Linear parameters of one layer
  bool moe = false;
  u64 mlp_intermediate = 0; ///< dense MLP width (dense layers) or per-expert width (MoE layers)
  u64 experts = 0;          ///< routed experts (MoE layers)
  u64 experts_per_token = 0;
  u64 shared_intermediate = 0;  ///< total width of the always-on shared expert(s), 0 if none
  bool experts_on_every_token = false;  ///< every expert runs on every token, its input weighted by the
                                        ///< router's scores (Llama4TextMoe); else the routed slots only
  u64 sliding_window = 0;   ///< 0 = full causal attention; else tokens attended in this layer
  u64 attention_chunk = 0;  ///< chunked attention: tokens per chunk (Llama 4); 0 otherwise
  bool rope = true;         ///< false for NoPE layers (no rotary embedding: SmolLM3, Llama 4 global layers)
  bool qk_l2_norm = false;  ///< q and k L2-normalised per head in fp32, without a weight (Llama 4 RoPE layers)
  bool clamped_glu_experts = false;  ///< experts gate with clamp, x * sigmoid(alpha x) and (up + 1) (gpt-oss)
  bool frozen = false;      ///< full fine-tuning with these (bottom) layers frozen: no gradients,
                            ///< and nothing below the first trained layer is saved for backward

  [[nodiscard]] u64 params_per_layer() const;
  [[nodiscard]] u64 params() const { return mul(count, params_per_layer()); }
  [[nodiscard]] LayerAttention attention_kind() const {
    if (sliding_window > 0) return LayerAttention::SlidingWindow;
    if (attention_chunk > 0) return LayerAttention::Chunked;
    return LayerAttention::Full;
  }
  /// Transformers gives a window (or chunk) no longer than the sequence an explicit mask: its SDPA
  /// mask may skip to is_causal only while the keys are fewer than the window (transformers 5.23
  /// masking_utils.py _ignore_causal_mask_sdpa: `kv_length >= local_attention_size` keeps the mask).
  [[nodiscard]] bool local_mask(u64 seq) const {
    return (sliding_window > 0 && sliding_window <= seq) || (attention_chunk > 0 && attention_chunk <= seq);
  }
};

/// How the checkpoint itself stores some weights (config.json `quantization_config`), as plain
/// data for what loads the checkpoint as published (serving engines). Linears with
/// `checkpoint_quantized` use it; every other tensor keeps the checkpoint's float dtype.
struct CheckpointQuant {
  std::string method;       ///< "mxfp4"; empty = not quantized (or a method memfit does not read)
  u64 block = 0;            ///< elements sharing one scale
  u64 bits_x1024 = 0;       ///< storage bits per weight element x1024, scales included
};

struct ModelSpec {
  std::string model_type;       ///< as read from the config (text part for multimodal files)
  std::string family;           ///< the implementation memfit models it as ("llama", "gpt2", ...)
  bool approximate = false;     ///< unknown model_type estimated from standard fields
  std::vector<std::string> notes;     ///< what the reader should know (heads, storage formats)
  std::vector<std::string> warnings;  ///< what makes the figure less certain (approximations, parts not counted)

  u64 hidden = 0;
  u64 vocab = 0;
  u64 layers = 0;               ///< total decoder (or encoder) layers
  u64 heads = 0;                ///< query heads
  u64 kv_heads = 0;             ///< key/value heads (GQA/MQA); == heads for MHA
  u64 head_dim = 0;             ///< per-head dim of q/k (standard attention)
  u64 v_head_dim = 0;           ///< per-head dim of v (== head_dim except MLA)
  u64 max_positions = 0;        ///< max_position_embeddings (0 if the config gives none)

  AttentionKind attention = AttentionKind::Standard;
  u64 q_lora_rank = 0;          ///< MLA: 0 = plain q_proj
  u64 kv_lora_rank = 0;         ///< MLA: compressed KV width (what the KV cache holds)
  u64 qk_rope_head_dim = 0;     ///< MLA: decoupled rope key width (also cached)
  u64 qk_nope_head_dim = 0;

  NormKind norm = NormKind::RMSNorm;
  MlpKind mlp = MlpKind::Gated;
  std::string activation = "silu";
  bool parallel_block = false;  ///< attention and MLP read the same normed input (GPT-J, CodeGen, Phi, Falcon-7B)
  bool attention_sinks = false; ///< one learned sink logit per head joins the softmax (gpt-oss)
  bool parallel_two_norms = false;  ///< attention and MLP read the same residual through two norms (NeoX, Falcon-40B)
  bool fused_qkv = false;       ///< one Linear produces q, k and v
  bool learned_positions = false;
  bool alibi = false;
  bool causal = true;           ///< false for encoders (BERT)
  double attention_dropout = 0; ///< dropout probabilities: a p > 0 keeps a mask for backward
  double hidden_dropout = 0;
  double embedding_dropout = 0;
  bool logits_fp32_in_model = false;  ///< the model itself casts logits to fp32 (CodeGen, GPT-Neo)
  bool final_logit_softcapping = false;
  /// MoE routers: top-k weights renormalised to sum 1 (config norm_topk_prob, else the
  /// configuration class's default; Mixtral always renormalises).
  bool norm_topk_prob = true;
  /// Group-limited routing (DeepSeek-V3 n_group / topk_group): the experts form `router_groups`
  /// groups and a token's experts come from its `router_topk_groups` best groups; 0: none.
  u64 router_groups = 0, router_topk_groups = 0;

  // What the implementation supports (family_traits.cpp, one row per model_type).
  bool supports_sdpa = true;              ///< Transformers `_supports_sdpa`
  bool supports_flash_attention_2 = true; ///< Transformers `_supports_flash_attn`
  bool remote_code = false;               ///< trust_remote_code model: its own file picks the kernel
  AttentionImpl default_attention = AttentionImpl::Sdpa;  ///< what runs when no kernel is named
  /// The checkpoint's dtype (config `dtype`, or `torch_dtype` in older files): "bfloat16",
  /// "float16", "float32", or "" when the config names none (from_pretrained then loads fp32).
  std::string checkpoint_dtype;
  /// PEFT's default LoRA target_modules for this model_type (empty: PEFT has none).
  std::vector<std::string> peft_lora_targets;
  bool attn_logit_softcapping = false;

  u64 embedding_params = 0;     ///< token embedding (vocab x embed_dim)
  u64 position_params = 0;      ///< learned absolute positions (and BERT token types)
  u64 other_params = 0;         ///< embedding norms, final norm, OPT project_in/out, BERT pooler, ...
  bool tied_embeddings = false;
  u64 buffer_bytes = 0;         ///< non-parameter buffers the modules register (causal-mask and sin/cos tables)
  Linear lm_head;               ///< counted only if !tied_embeddings (its bias always)
  /// nn.Linear modules outside the layers and other than the head (BERT's MLM transform or pooler
  /// dense; their parameters are in other_params): PEFT wraps them when a LoRA target names them.
  std::vector<Linear> outer_linears;
  u64 vision_params = 0;        ///< multimodal: vision tower + projector (also included in other_params)
  CheckpointQuant checkpoint_quant;
  std::vector<LayerGroup> groups;
  /// The decoder in layer order: runs of consecutive layers of one group (an index into `groups`,
  /// which merge identical layers wherever they are). Empty: the groups in order.
  struct LayerRun {
    size_t group = 0;
    u64 count = 0;
  };
  std::vector<LayerRun> layer_runs;

  /// Linear layers outside the decoder layers that LoRA "all-linear" may target (OPT project_in/out).
  std::vector<Linear> extra_linears;
  /// Partial rotary embeddings: the per-head dims rotated (GPT-NeoX rotary_pct, Phi / StableLM
  /// partial_rotary_factor); 0 = the whole head.
  u64 rotary_dim = 0;
};

/// Parameter counts in elements.
struct ParamCounts {
  u64 total = 0;
  u64 embedding = 0;            ///< token + position embeddings
  u64 layers = 0;               ///< all decoder layers
  u64 lm_head = 0;              ///< untied head weight + head bias (0 when tied and bias-free)
  u64 other = 0;                ///< norms outside layers, poolers, projections, vision tower
  u64 vision = 0;               ///< of `other`: the vision tower and projector of a multimodal model
  u64 active_per_token = 0;     ///< MoE: what one token passes through (speed, not memory)
};

/// Reads a config.json object. Throws Error naming the missing or bad field.
/// `head`: "auto" (the architecture the config names), "lm" or "classification" (a 2-label
/// sequence classifier, as HF's AutoModelForSequenceClassification builds for encoders).
[[nodiscard]] ModelSpec parse_model_config(const nlohmann::json& config, const std::string& head = "auto");

[[nodiscard]] ParamCounts count_params(const ModelSpec& model);

/// Bytes of the weights as the checkpoint stores them: quantized Linears (ModelSpec::checkpoint_quant)
/// at their storage bits, everything else at `float_bytes` per parameter.
[[nodiscard]] u64 checkpoint_weight_bytes(const ModelSpec& model, u64 float_bytes);

/// The model_type values parse_model_config knows exactly (others are estimated approximately).
[[nodiscard]] std::vector<std::string> supported_model_types();

}  // namespace memfit
