// Edits of the Llama-like lists (layer_ops.hpp) for autocast and for the RMSNorm families beyond
// llama / mistral / qwen2. Each function edits a list in place, as data: it adds, drops or
// changes entries; schedule.cpp picks the edits of a family through one table.
#pragma once

#include "layer_ops.hpp"

namespace memfit::sched {

/// torch.autocast over fp32 weights (the decoder layer or the head list, SDPA, full fine-tuning).
void edit_autocast(OpList& l);

/// RMSNorms that multiply the fp32 x_hat by the weight and cast the product (Gemma, OLMo-2, gpt-oss:
/// (weight * x_hat).to(input dtype)) in place of Llama's cast-then-multiply, in half precision.
void edit_fp32_product_norms(OpList& l, const LayerSetup& s);

/// Qwen3 (and Qwen3-MoE's attention): RMSNorm over each head of q and k before the rotary.
extern const FamilyEdits kQwen3Edits;
/// OLMo-2 (full fine-tuning): no pre-norms; q / k norms over the full width; post-attention / post-MLP norms.
extern const FamilyEdits kOlmo2Edits;
/// Phi-3: fused qkv_proj and gate_up_proj, the rotary's extra cat.
extern const FamilyEdits kPhi3Edits;
/// Gemma: (1 + w) RMSNorm in fp32, the scaled embedding.
extern const FamilyEdits kGemmaEdits;
/// Gemma2: Gemma's plus post-attention / post-feedforward norms and the logit softcapping.
extern const FamilyEdits kGemma2Edits;
/// Gemma3: Gemma2's norms with per-head q / k norms, two rotary tables, no softcapping.
extern const FamilyEdits kGemma3Edits;
/// Mixtral: the router and fused experts in place of the MLP (layer_ops_moe.cpp).
extern const FamilyEdits kMixtralEdits;
/// gpt-oss: biased attention with sinks, rotary on halves, a biased MoE with a clamped SwiGLU.
extern const FamilyEdits kGptOssEdits;
/// Qwen2-MoE (shared expert) and Qwen3-MoE (q/k norms) (layer_ops_moe.cpp).
extern const FamilyEdits kQwen2MoeEdits;
extern const FamilyEdits kQwen3MoeEdits;
/// DeepSeek-V3: multi-head latent attention; dense layers, then MoE layers with a sigmoid,
/// group-limited router and a shared MLP (a grouped decoder: LayerSetup::moe picks the MLP).
extern const FamilyEdits kDeepseekV3Edits;
/// Llama 4 (llama4_text): chunked RoPE layers with the qk L2 norm, NoPE layers with temperature
/// tuning, MoE layers running every expert on every token beside a shared expert (layer_ops_llama4.cpp).
extern const FamilyEdits kLlama4Edits;

}  // namespace memfit::sched
