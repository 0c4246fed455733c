// Activation memory of one decoder layer and of the head/loss, for a training step or a
// no-grad forward. Internal to the core: estimate.cpp composes these into the timeline.
#pragma once

#include <string>
#include <vector>

#include "memfit/checked.hpp"
#include "memfit/model.hpp"
#include "memfit/request.hpp"

namespace memfit::detail {

/// Element sizes in force for a precision mode.
struct Dtypes {
  u64 compute = 2;   ///< bytes of Linear outputs / attention (bf16/fp16: 2, fp32: 4)
  u64 residual = 2;  ///< bytes of the residual stream (fp32 under AMP: fp32 embedding + promotion)
  bool amp = false;  ///< autocast: Linear inputs are cast to half per consumer
};
[[nodiscard]] Dtypes dtypes_for(Precision p);
/// The element sizes a request's activations run in (QLoRA with prepare_kbit: see kbit_upcast).
[[nodiscard]] Dtypes dtypes_for(const Request& r);
/// QLoRA over bitsandbytes layers with PEFT's prepare_model_for_kbit_training: every
/// non-quantized parameter (embeddings, norms, head, biases) is upcast to fp32 (peft
/// utils/other.py: params of dtype fp16/bf16 that are not Params4bit).
[[nodiscard]] bool kbit_upcast(const Request& r);

/// Where a family's Transformers implementation departs from the Llama-like layer the engine
/// counts: one row per family (activations.cpp kFamilyActivations, each column citing its
/// modeling file or measurement). Falcon's rotary and alibi paths are separate rows.
struct FamilyActivations {
  const char* family = "";
  bool qk_in_fp32 = false;               ///< eager QK^T computed in fp32 whatever the dtype
  bool v_view_of_fused_qkv = false;      ///< eager v is a view of the fused q/k/v output
  u64 v_view_max_heads = 0;              ///< ... only up to this many heads (0: any)
  bool loop_keeps_attention_probs = false;  ///< the block returns its probabilities, the loop keeps them
  bool window_from_buffer = false;       ///< local layers mask with a causal buffer of the module
  bool softmax_in_model_dtype = false;   ///< eager softmax without an fp32 upcast
  bool probs_to_value_dtype = false;     ///< eager probabilities cast to v's dtype before dropout
  bool norm_fp32_one_plus_weight = false;   ///< RMSNorm multiplies in fp32 by (1 + weight)
  bool qk_norm_per_head = false;         ///< RMSNorm on q and k per head
  bool qk_norm_full_width = false;       ///< RMSNorm on q and k over the whole width
  bool rotary_by_cat = false;            ///< rotated q/k built by cat of rotary and pass-through parts
  bool post_norms = false;               ///< norms after attention and MLP, before the residual add
  bool block_keeps_attn_output = false;  ///< the block keeps attn_output as a local through the MLP
  bool block_keeps_first_norm_output = false;  ///< the block keeps its first norm's output as a local through the MLP
  bool fp32_router = false;              ///< MoE router scores in fp32
  bool fp32_route_weights = false;       ///< MoE routing weights stay fp32
  bool sigmoid_gated_shared_expert = false;  ///< the shared expert's output is gated by a sigmoid
  bool shared_expert_first = false;      ///< the shared expert runs before the router and routed experts
  bool scores_locals = false;            ///< eager attention holds raw, masked and softmaxed scores at once
  bool scores_locals_fp32 = false;       ///< the same, counted here in fp32 only (half: the upcast rule)
  bool per_layer_mask = false;           ///< a causal model builds the mask in each layer
  bool mlp_norm_before_attention = false;   ///< with two parallel norms, the MLP's norm runs first
  bool no_grad_four_scores = false;      ///< no-grad eager forward: four score tensors alive
  bool baddbmm_attention = false;        ///< alibi scores by baddbmm (bloom_attention_moment)
  bool fused_qkv_local = false;          ///< attention keeps query_key_value's output as a local
  bool embedding_layernorm = false;      ///< a LayerNorm right after the word embedding
  bool head_transform = false;           ///< the LM head runs dense + activation + LayerNorm before the decoder
  bool loss_in_logits_dtype = false;     ///< cross-entropy on the logits as they are (no fp32 upcast)
  u64 tokenizer_inputs = 1;              ///< int64 [b, s] tensors of the tokenizer the model reads
  bool post_norm_layers = false;         ///< LayerNorm after each residual add (the layer's last node)
  bool inputs_embeds_apart = false;      ///< the word-embedding output is not the first layer's input
};
/// The row of a model (Falcon with alibi has its own); an all-false row for Llama-like families.
[[nodiscard]] const FamilyActivations& family_activations(const ModelSpec& m);

/// Which Linear layers of a layer group keep their input for the weight gradient.
struct TrainableLinears {
  std::vector<bool> saves_input;  ///< per LayerGroup::linears entry
  u64 lora_rank = 0;              ///< adapters on the targeted linears (0: none)
  /// per entry (empty: none): PEFT adapts the weight by parametrisation (lora.ParamWrapper: fused experts,
  /// Transformers 5 routers) rather than wrapping a Linear: the op keeps the merged weight
  /// W + scaling * B @ A and its input, no adapter activations
  std::vector<bool> parametrized{};
};

struct LayerActivations {
  u64 saved = 0;               ///< kept from forward to backward by one layer (no checkpointing)
  u64 saved_hidden = 0;        ///< the part of `saved` made of [tokens, hidden] tensors (norms, residual,
                               ///< their casts, dropout masks): replicated under tensor parallelism
                               ///< unless sequence parallelism shards it
  u64 forward_transient = 0;   ///< extra live at the worst moment of its forward (beyond `saved`)
  u64 recompute_transient = 0; ///< the same in its recomputation under checkpointing (which stops
                               ///< after the last saved tensor)
  u64 transient_inputs = 0;    ///< the layer input and the model's inputs_embeds, part of
                               ///< `inference_transient` (under checkpointing both are kept tensors)
  u64 backward_transient = 0;  ///< extra live at the worst moment of its backward
  u64 mlp_backward_transient = 0;        ///< extra live at the MLP block's worst backward moment
  u64 mlp_backward_at_down = 0;          ///< extra live at the down projection's node (its input
                                         ///< gradient made, its saved tensors not yet released)
  u64 moe_backward_start = 0;            ///< MoE block: extra live at its first backward nodes (the
                                         ///< weighted slot sum, the gathers), before any weight gradient
  /// A shared expert run before the routed experts (Qwen2-MoE): its backward comes last in the block,
  /// after the routed experts have released what they saved; extra live at its act * up node
  /// beyond what the layer saves (its three [T, i] gradients and the incoming one); 0: no such moment
  u64 shared_expert_backward = 0;
  u64 moe_weight_grad_moment = 0;        ///< trained fused experts: extra live at the worst moment after down's
                                         ///< node (the act * up node, or gate_up's weight gradient with the
                                         ///< new [E, h, 2i] stack gradient); the layer's own .grad not included
  /// A sequential block's second RMSNorm (Python ops over fp32): extra live at its backward, after
  /// the MLP block's, beyond what the layer saves less what the MLP block has released; 0: no such norm
  u64 mlp_norm_backward = 0;
  u64 attention_backward_gross = 0;      ///< attention_backward_transient before attention_released is taken off
  u64 attention_released = 0;            ///< saved tensors of the layer (its MLP, the attention block's tail)
                                         ///< already released at the attention block's worst backward moment
  bool attention_backward_unfused = false;  ///< eager attention or CPU SDPA's math path: the attention's
                                            ///< backward runs op by op after o_proj's node
  u64 attention_backward_transient = 0;  ///< extra live at the attention block's worst backward moment
                                         ///< (part of the max in backward_transient)
  u64 checkpoint_saved = 0;    ///< kept per layer under full activation checkpointing (its input)
  u64 checkpoint_ctx_held = 0; ///< also kept under checkpointing: tensors held by autograd contexts
                               ///< outside save_for_backward (bitsandbytes Linears' inputs, per release)
  u64 recomputed = 0;          ///< re-created by the recomputation of a checkpointed layer (`saved`
                               ///< minus the tensors that alias the checkpointed input)
  u64 inference_transient = 0; ///< live at the worst moment of a no-grad forward of the layer
  u64 recompute_held = 0;      ///< checkpointing: gradients the layer's first backward nodes hold
                               ///< (beyond the incoming one) while its recomputation runs
  u64 mlp_saved = 0;           ///< what the MLP block keeps (part of `saved`): nothing in the first layer
                               ///< of a parallel block whose MLP is frozen when the layer's input needs
                               ///< no gradient
  u64 attn_saved = 0;          ///< what the attention block keeps, its first norm included (part of `saved`)
  u64 mlp_norm = 0;            ///< what a sequential block's second norm keeps (part of `mlp_saved`)
  u64 first_norm_slot = 0;     ///< the first norm's output kept for the Linears reading it (part of `attn_saved`)
  u64 first_norm = 0;          ///< what the layer's first norm keeps, and the LoRA dropout masks on
                               ///< that norm's output (part of `saved`): nothing in the first layer
                               ///< when its input needs no gradient (frozen embeddings without
                               ///< checkpointing) and the norm is frozen
  u64 returned_probs = 0;      ///< eager attention probabilities the block returns and the model's
                               ///< loop keeps through the next block's forward (see
                               ///< loop_keeps_attention_probs); extra only where the layer saved none
  u64 first_qk_unkept = 0;     ///< eager attention in that first layer, q and k projections separate
                               ///< and only one of them adapted: the other's output is not kept by
                               ///< QK^T (part of `attn_saved`)
};

/// `tokens` = micro_batch x sequence (per rank), `seq` = sequence length (attention is s x s).
[[nodiscard]] LayerActivations layer_activations(const ModelSpec& m, const LayerGroup& g, const Request& r,
                                                 const TrainableLinears& t, u64 tokens, u64 seq);

struct HeadActivations {
  u64 saved = 0;              ///< final norm + head input + loss state kept for backward
  u64 held_logits = 0;        ///< logits tensor referenced by the model output
  u64 loss_forward_peak = 0;  ///< extra live while the loss is computed (beyond saved/held)
  u64 loss_backward_peak = 0; ///< live during the loss + head backward (gradient buffers)
  u64 held_until_next_forward = 0;  ///< logits the training loop still references through the
                                    ///< optimizer step and the next forward (LitGPT's fit())
};
[[nodiscard]] HeadActivations head_activations(const ModelSpec& m, const Request& r, bool head_trainable, u64 tokens);

/// Tensors shared by all layers during one forward: token ids, rotary cos/sin, the eager 4-D
/// mask, the embedding's saved state.
[[nodiscard]] u64 shared_forward_bytes(const ModelSpec& m, const Request& r, u64 batch, u64 seq);
/// The 4-D causal mask eager attention adds to its scores (part of shared_forward_bytes). The
/// model's forward builds it and the add keeps nothing, so it dies when the model's forward
/// returns, unless checkpointing keeps it as an input of every checkpointed layer.
[[nodiscard]] u64 eager_mask_bytes(const ModelSpec& m, const Request& r, u64 batch, u64 seq);
/// How many distinct 4-D masks the model's forward builds for its layers (full / sliding).
[[nodiscard]] u64 eager_mask_count(const ModelSpec& m);

}  // namespace memfit::detail
