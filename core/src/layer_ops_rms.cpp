// Autocast and the RMSNorm families' edits of the Llama-like lists. Sources, cited per entry:
//  [A] PyTorch aten/src/ATen/autocast_mode.cpp: on CPU and CUDA, linear / matmul /
//      scaled_dot_product_attention run in the half dtype, their fp32 arguments cast per call;
//      the cast of a leaf that requires grad (a trained weight) is cached for the autocast region
//      (one copy per weight per forward), any other argument is cast again by every consumer
//  [D] PyTorch tools/autograd/derivatives.yaml (mm saves the operand its partner's gradient needs)
//  [L] transformers models/llama/modeling_llama.py (the rotary cos/sin follow the fp32 input's
//      dtype, so q * cos promotes the half projection back to fp32)
//  [Q3] transformers models/qwen3/modeling_qwen3.py: q_norm(q_proj(x).view(..., head_dim)) and
//      k_norm likewise, Qwen3RMSNorm = LlamaRMSNorm over head_dim
//  [G] transformers models/gemma/modeling_gemma.py (GemmaRMSNorm, GemmaTextScaledWordEmbedding;
//      GemmaMLP's gelu_pytorch_tanh keeps its input as silu does)
//  [G2] transformers models/gemma2/modeling_gemma2.py (Gemma2DecoderLayer's four norms,
//      eager_attention_forward's softcap, the final logit softcapping, the two decoder-wide masks)
//  [O2] transformers models/olmo2/modeling_olmo2.py (Olmo2RMSNorm: (weight * x_hat).to(input dtype);
//      Olmo2Attention: q_norm(q_proj(x)), k_norm(k_proj(x)) over the full width; Olmo2DecoderLayer:
//      x + post_attention_layernorm(attn(x)), then x + post_feedforward_layernorm(mlp(x)))
//  [G3] transformers models/gemma3/modeling_gemma3.py (Gemma3Attention's q_norm / k_norm,
//      Gemma3DecoderLayer's four norms, Gemma3TextModel's rotary pair per layer type)
//  [P3] transformers models/phi3/modeling_phi3.py (Phi3Attention: qkv_proj sliced into q, k, v;
//      apply_rotary_pos_emb: cat([rotated, pass-through]); Phi3MLP: gate_up_proj chunked)
#include "layer_ops_rms.hpp"

#include <algorithm>
#include <array>
#include <utility>

namespace memfit::sched {

namespace {

/// A Linear under autocast and the tensor it reads: the input is cast when it is fp32.
struct AutocastLinear {
  std::string_view out, input, input_cast, weight_cast;
};
constexpr std::array<AutocastLinear, 8> kAutocastLinears{{
    {"q_proj.out", "norm1.out", "q_proj.x_half", "q_proj.w_half"},
    {"k_proj.out", "norm1.out", "k_proj.x_half", "k_proj.w_half"},
    {"v_proj.out", "norm1.out", "v_proj.x_half", "v_proj.w_half"},
    {"o_proj.out", "attn.out", "o_proj.x_half", "o_proj.w_half"},
    {"gate_proj.out", "norm2.out", "gate_proj.x_half", "gate_proj.w_half"},
    {"up_proj.out", "norm2.out", "up_proj.x_half", "up_proj.w_half"},
    {"down_proj.out", "mlp.mul", "down_proj.x_half", "down_proj.w_half"},
    {"logits", "norm1.out", "lm_head.x_half", "lm_head.w_half"},
}};

/// One Linear: its output and input gradient in the half dtype, the cached cast of its weight
/// (kept by mm for the input gradient [D]) and, for an fp32 input, this consumer's own cast of it
/// (kept by mm for the weight gradient [D]; its backward casts the gradient back to fp32).
void autocast_linear(OpList& l, const AutocastLinear& a) {
  TensorOp* lin = find_mut(l, a.out);
  TensorOp* in = find_mut(l, a.input);
  if (!lin || !in) return;
  const Shape w = lin->weight, x = lin->grad_input;
  const bool cast_input = in->dtype != Dt::Half;
  lin->dtype = Dt::Half;
  lin->grad_dtype = Dt::Half;
  auto pos = position(l, a.out);
  if (!w.empty) {
    TensorOp cast{a.weight_cast, "_to_copy", w, Dt::Half, true, {}, kNone};
    cast.part = Part::AutocastWeightCopies;
    pos = l.insert(pos, cast) + 1;
  }
  if (!cast_input) return;
  l.insert(pos, {a.input_cast, "_to_copy", x, Dt::Half, !w.empty, a.out, x});
  // the fp32 input is read only by the casts now: it dies after the last one
  in = find_mut(l, a.input);
  in->saved = false;
  in->dies_after = a.input_cast;
}

/// RMSNorm's variance + eps [D: add with a number saves nothing, passes its gradient on]: a new
/// tensor of the variance's rows, dead once rsqrt has read it (layer_ops.cpp rms_norm); its name by
/// the norm's mean entry ("" for a norm not listed here: none added).
std::string_view var_eps_of(std::string_view mean) {
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 4> kNames{{
      {"q_norm.mean", "q_norm.var_eps"}, {"k_norm.mean", "k_norm.var_eps"},
      {"post_attn.mean", "post_attn.var_eps"}, {"post_ff.mean", "post_ff.var_eps"}}};
  for (const auto& [m, v] : kNames)
    if (m == mean) return v;
  return {};
}

/// An RMSNorm over each head of the output of `proj` (a [T, width] tensor of `rows` head rows),
/// built as LlamaRMSNorm is [L][D]: in half precision the upcast is what pow keeps; a trained
/// weight keeps x_hat (its half cast in half precision); the normed heads take the projection's
/// place as the rotary's input.
void head_rms_norm(OpList& l, const LayerSetup& s, std::string_view proj, const std::array<std::string_view, 7>& n,
                   Shape width, Shape rows, Shape weight = shape(Sym::HeadDim)) {
  // under autocast the projection is half (autocast's linear) and the fp32 weight times its
  // half x_hat promotes the output back to fp32 (the model dtype there) [A]
  const bool half_in = s.half || s.autocast;
  const Dt half = s.autocast ? Dt::Half : Dt::Model;
  TensorOp* p = find_mut(l, proj);
  const std::string_view reader_end = p->dies_after;
  p->saved = !half_in;  // fp32: pow keeps its input
  p->dies_after = half_in ? n[0] : std::string_view{};
  OpList e;
  if (half_in) e.push_back({n[0], "_to_copy", width, Dt::F32, true, {}, width, kNone, Dt::Model, half});
  e.push_back({n[1], "pow", width, Dt::F32, false, {}, kNone});
  // (`variance` is a local of LlamaRMSNorm.forward: it dies when the norm returns its output)
  e.push_back({n[2], "mean", rows, Dt::F32, false, n[6], kNone});
  if (!var_eps_of(n[2]).empty()) e.push_back({var_eps_of(n[2]), "add", rows, Dt::F32, false, {}, kNone});
  e.push_back({n[3], "rsqrt", rows, Dt::F32, true, {}, kNone});
  e.push_back({n[4], "mul", width, Dt::F32, s.full && !half_in, {}, width, kNone, Dt::Model, Dt::F32});
  if (half_in) e.push_back({n[5], "_to_copy", width, half, s.full, {}, width, kNone, Dt::Model, half});
  e.push_back({n[6], "mul", width, Dt::Model, false, reader_end, width, weight});
  l.insert(position(l, proj) + 1, e.begin(), e.end());
}

void qwen3_layer(OpList& l, const LayerSetup& s) {
  head_rms_norm(l, s, "q_proj.out",
                {"q_norm.upcast", "q_norm.pow", "q_norm.mean", "q_norm.rsqrt", "q_norm.x_hat", "q_norm.x_hat_half", "q_norm.out"},
                shape(Sym::T, Sym::Q), shape(Sym::T, Sym::A));
  head_rms_norm(l, s, "k_proj.out",
                {"k_norm.upcast", "k_norm.pow", "k_norm.mean", "k_norm.rsqrt", "k_norm.x_hat", "k_norm.x_hat_half", "k_norm.out"},
                shape(Sym::T, Sym::KV), shape(Sym::T, Sym::KvHeads));
}

/// Phi-3 [P3]: one qkv_proj whose output q, k, v are views of (v, kept by attention, keeps all of
/// it); the rotary's sum is copied once more by the cat with the (empty) pass-through part; one
/// gate_up_proj whose halves are chunked views (silu keeps the gate view, mul the up view).
void phi3_layer(OpList& l, const LayerSetup& s) {
  (void)s;
  const Shape TH = shape(Sym::T, Sym::H);
  *find_mut(l, "q_proj.out") = {"qkv_proj.out", "linear", shape(Sym::T, Sym::QKV), Dt::Model, true, {}, TH,
                             shape(Sym::H, Sym::QKV)};
  l.erase(position(l, "k_proj.out"));
  l.erase(position(l, "v_proj.out"));
  for (bool k : {false, true}) {
    const std::string_view rot = k ? "k.rot" : "q.rot", sum = k ? "k.rot_sum" : "q.rot_sum";
    TensorOp r = *find_mut(l, rot);
    find_mut(l, k ? "k.mul_cos" : "q.mul_cos")->dies_after = sum;
    TensorOp* t = find_mut(l, rot);
    t->name = sum, t->saved = false, t->dies_after = rot;
    r.op = "cat";
    l.insert(position(l, sum) + 1, r);
  }
  l.erase(position(l, "gate_proj.out"));
  *find_mut(l, "up_proj.out") = {"gate_up_proj.out", "linear", shape(Sym::T, Sym::TwoI), Dt::Model, true, {}, TH,
                              shape(Sym::H, Sym::TwoI)};
  // order of the forward: gate_up, then silu of its gate half, then the product
  std::rotate(position(l, "mlp.act"), position(l, "gate_up_proj.out"), position(l, "gate_up_proj.out") + 1);
}

/// GemmaRMSNorm [G]: (x_hat * (1 + weight)) in fp32, then cast to the input's dtype. A trained
/// weight keeps the fp32 x_hat [D: mul]; in half precision the product is fp32 and its cast is the
/// norm's output (Llama casts x_hat first and multiplies in half).
void gemma_norms(OpList& l, const LayerSetup& s) {
  if (!s.half) return;  // fp32: the same tensors as LlamaRMSNorm
  for (std::string_view n : {"norm1", "norm2"}) {
    const bool first = n == "norm1";
    TensorOp* x_hat = find_mut(l, first ? "norm1.x_hat" : "norm2.x_hat");
    TensorOp* prod = find_mut(l, first ? "norm1.x_hat_half" : "norm2.x_hat_half");
    TensorOp* out = find_mut(l, first ? "norm1.out" : "norm2.out");
    if (!x_hat || !prod || !out) continue;
    x_hat->saved = s.full;
    *prod = {first ? "norm1.scaled" : "norm2.scaled", "mul", prod->shape, Dt::F32, false, {}, prod->shape, kNone,
             Dt::Model, Dt::F32};
    out->op = "_to_copy";
  }
}

/// GemmaRMSNorm's (1.0 + self.weight.float()) [G]: an [h] fp32 tensor (after weight.float(), a copy
/// of a half weight that dies with the sum) that the product with x_hat saves for x_hat's gradient
/// [D: mul saves the other operand], released by that product's backward (where x_hat needs no
/// gradient, edit_input_needs_no_grad lets it die with the product). Checked with memfit validate
/// --tensors (gemma, gemma2, gemma3: the `add [h] float32` per norm, dying in the backward).
void gemma_one_plus_weight(OpList& l, const LayerSetup& s) {
  for (std::string_view n : {"norm1", "norm2"}) {
    const bool first = n == "norm1";
    const std::string_view product = s.half ? (first ? "norm1.scaled" : "norm2.scaled") : (first ? "norm1.out" : "norm2.out");
    if (!find_op(l, product)) continue;
    // x_hat, _norm's result, is read by the product: alive until then where nothing saves it; the
    // mean is a temporary of _norm (no `variance` local as in LlamaRMSNorm): dead at + eps
    find_mut(l, first ? "norm1.x_hat" : "norm2.x_hat")->dies_after = product;
    if (TensorOp* mean = find_mut(l, first ? "norm1.mean" : "norm2.mean")) mean->dies_after = {};
    OpList e;
    if (s.half) e.push_back({first ? "norm1.w_f32" : "norm2.w_f32", "_to_copy", shape(Sym::H), Dt::F32, false, {}, kNone});
    e.push_back({first ? "norm1.w_plus_one" : "norm2.w_plus_one", "add", shape(Sym::H), Dt::F32, true, {}, kNone});
    e.back().released_by = product;
    l.insert(position(l, product), e.begin(), e.end());
  }
}

/// Gemma / Gemma3's norms after the precision edits, and their final norm.
void gemma_family_norms(OpList& l, const LayerSetup& s) {
  gemma_norms(l, s);
  gemma_one_plus_weight(l, s);
}

}  // namespace

void edit_fp32_product_norms(OpList& l, const LayerSetup& s) { gemma_norms(l, s); }

namespace {

/// GemmaTextScaledWordEmbedding [G]: the lookup times sqrt(hidden) is a second [T, h] tensor; the
/// lookup dies with the product (mul by a constant keeps nothing that needs a gradient [D]).
void gemma_embedding(OpList& l, const LayerSetup&) {
  TensorOp* out = find_mut(l, "embed.out");
  TensorOp lookup = *out;
  lookup.name = "embed.lookup";
  lookup.dies_after = {};
  lookup.weight = kNone;
  out->op = "mul";
  out->grad_input = lookup.shape;
  l.insert(position(l, "embed.out"), lookup);
}

void gemma_head(OpList& l, const LayerSetup& s) { gemma_norms(l, s); }

/// Phi-3's attention inputs are views of qkv_proj's output or the cat's fresh [b, a, s, d] tensors:
/// SDPA's output then comes in that layout and transpose(1, 2).contiguous() copies it (o_proj keeps
/// the copy) [S]; eager's matmul copies the strided v view for bmm (and keeps the copy), after
/// which nothing keeps qkv_proj's output. Measured layouts: peak_dump.py on phi3-tiny.
void phi3_attention_layout(OpList& l, const LayerSetup& s) {
  const Shape TQ = shape(Sym::T, Sym::Q), TKV = shape(Sym::T, Sym::KV);
  if (s.eager) {
    TensorOp* qkv = find_mut(l, "qkv_proj.out");
    qkv->saved = false;
    qkv->dies_after = "attn.v_contig";
    l.insert(position(l, "attn.scores"), {"attn.v_contig", "clone", TKV, Dt::Model, true, {}, TKV});
    return;
  }
  TensorOp* flash = find_mut(l, "attn.out");
  TensorOp copy = *flash;
  flash->name = "attn.flash";
  copy.op = "clone";
  l.insert(position(l, "attn.lse") + 1, copy);
  (void)TQ;
}

/// The entries of a q / k norm written as a Gemma RMSNorm (OLMo-2's, Gemma3's).
constexpr std::array<std::string_view, 7> kQNorm{"q_norm.upcast", "q_norm.pow",   "q_norm.mean", "q_norm.rsqrt",
                                                 "q_norm.x_hat",  "q_norm.scaled", "q_norm.out"};
constexpr std::array<std::string_view, 7> kKNorm{"k_norm.upcast", "k_norm.pow",   "k_norm.mean", "k_norm.rsqrt",
                                                 "k_norm.x_hat",  "k_norm.scaled", "k_norm.out"};

/// The shapes of one RMSNorm: the normed tensor, its variance rows and its weight, and the entry
/// its tensors follow (empty: the normed tensor itself).
struct NormDims {
  Shape width = shape(Sym::T, Sym::H), rows = shape(Sym::T), weight = shape(Sym::H);
  std::string_view after = {};
};

/// A Gemma RMSNorm [G] on `x` (not on the residual stream: Gemma2's post-attention and
/// post-feedforward norms, q / k norms), written as gemma_norms leaves norm1/norm2; its output
/// dies after `reader`.
void gemma_rms_norm(OpList& l, const LayerSetup& s, std::string_view x, std::string_view reader,
                    const std::array<std::string_view, 7>& n, const NormDims& d = {}) {
  const Shape w = d.width;
  TensorOp* in = find_mut(l, x);
  in->saved = !s.half;  // fp32: pow keeps its input; half: the upcast is what it keeps
  in->dies_after = s.half ? n[0] : std::string_view{};
  OpList e;
  if (s.half) e.push_back({n[0], "_to_copy", w, Dt::F32, true, {}, w});
  e.push_back({n[1], "pow", w, Dt::F32, false, {}, kNone});
  e.push_back({n[2], "mean", d.rows, Dt::F32, false, {}, kNone});
  if (!var_eps_of(n[2]).empty()) e.push_back({var_eps_of(n[2]), "add", d.rows, Dt::F32, false, {}, kNone});
  e.push_back({n[3], "rsqrt", d.rows, Dt::F32, true, {}, kNone});
  e.push_back({n[4], "mul", w, Dt::F32, s.full, {}, w, kNone, Dt::Model, Dt::F32});
  if (s.half) e.push_back({n[5], "mul", w, Dt::F32, false, {}, w, kNone, Dt::Model, Dt::F32});
  e.push_back({n[6], s.half ? "_to_copy" : "mul", w, Dt::Model, false, reader, w, d.weight});
  l.insert(position(l, d.after.empty() ? x : d.after) + 1, e.begin(), e.end());
}

/// Gemma2 [G2]: norms after attention and after the MLP, before their residual adds.
void gemma2_layer(OpList& l, const LayerSetup& s) {
  gemma_rms_norm(l, s, "o_proj.out", "attn.residual",
                 {"post_attn.upcast", "post_attn.pow", "post_attn.mean", "post_attn.rsqrt", "post_attn.x_hat",
                  "post_attn.scaled", "post_attn.out"});
  gemma_rms_norm(l, s, "down_proj.out", "mlp.residual",
                 {"post_ff.upcast", "post_ff.pow", "post_ff.mean", "post_ff.rsqrt", "post_ff.x_hat", "post_ff.scaled",
                  "post_ff.out"});
}

/// OLMo-2's rotary in half precision [O2]: cos / sin stay fp32 (Olmo2RotaryEmbedding casts them to
/// nothing), so q * cos, rotate_half(q) * sin and their sum are fp32; the sum is cast back to the
/// input's dtype (q_embed.to(q_type)), and the cast is what the attention reads.
void olmo2_half_rotary(OpList& l) {
  for (bool k : {false, true}) {
    const std::string_view rot = k ? "k.rot" : "q.rot", sum = k ? "k.rot_f32" : "q.rot_f32";
    for (std::string_view n : {k ? "k.mul_cos" : "q.mul_cos", k ? "k.mul_sin" : "q.mul_sin"})
      find_mut(l, n)->dtype = Dt::F32;
    find_mut(l, k ? "k.mul_cos" : "q.mul_cos")->dies_after = sum;
    TensorOp cast = *find_mut(l, rot);
    TensorOp* t = find_mut(l, rot);
    t->name = sum, t->dtype = Dt::F32, t->saved = false, t->dies_after = rot;
    cast.op = "_to_copy";
    l.insert(position(l, sum) + 1, cast);
  }
  // both sums are cast after both are computed (apply_rotary_pos_emb returns the two casts; the
  // fp32 sums are its locals until it returns)
  std::rotate(position(l, "q.rot"), position(l, "q.rot") + 1, position(l, "k.rot"));
  find_mut(l, "q.rot_f32")->dies_after = "k.rot";
}

void olmo2_embedding(OpList& l, const LayerSetup& s) {
  if (!s.half) return;
  for (std::string_view n : {"rotary.cos", "rotary.sin"}) find_mut(l, n)->dtype = Dt::F32;
}

/// OLMo-2 [O2], edited after the precision edits (before LoRA's): no norm before the attention or
/// the MLP, so q/k/v_proj and gate/up_proj (and their adapters) read the residual stream itself;
/// q_norm / k_norm over the whole q / k width (one variance per token, weights [q] / [kv]) before
/// the rotary; post-attention and post-feedforward norms before the residual adds. Olmo2RMSNorm is
/// (weight * x_hat).to(input dtype): in half precision the product is fp32, as Gemma's norm.
void olmo2_layer(OpList& l, const LayerSetup& s) {
  for (std::string_view n : {"norm1", "norm2"}) {
    const std::string first = std::string(n) + (s.half ? ".upcast" : ".pow"), last = std::string(n) + ".out";
    l.erase(position(l, first), position(l, last) + 1);
  }
  // who keeps the residual stream: the trained q/k/v (gate/up) mm, or in fp32 the first adapter
  // reading it (lora_A saves its input; in half precision each adapter keeps its own fp32 cast [P])
  const bool fp32_adapters = !s.full && !s.half;
  for (std::string_view n : {"input", "attn.residual"}) {
    TensorOp* t = find_mut(l, n);
    t->saved = s.full || (fp32_adapters && (n == "input" || s.lora_all));
    t->dies_after = t->saved ? std::string_view{} : n == "input" ? "attn.residual" : "mlp.residual";
  }
  const std::string_view q_end = find_op(l, "q_proj.out")->dies_after, k_end = find_op(l, "k_proj.out")->dies_after;
  gemma_rms_norm(l, s, "q_proj.out", q_end, kQNorm,
                 {shape(Sym::T, Sym::Q), shape(Sym::T), shape(Sym::Q)});
  gemma_rms_norm(l, s, "k_proj.out", k_end, kKNorm,
                 {shape(Sym::T, Sym::KV), shape(Sym::T), shape(Sym::KV)});
  gemma2_layer(l, s);
  if (s.half) olmo2_half_rotary(l);
}

/// Gemma2's eager attention caps the scores [G2]: / cap, tanh (keeps its result [D]), * cap.
void gemma2_softcap_scores(OpList& l, const LayerSetup& s) {
  gemma_family_norms(l, s);
  if (!find_mut(l, "attn.scores")) return;
  const Shape ss = shape(Sym::B, Sym::A, Sym::S, Sym::S);
  const TensorOp e[] = {{"attn.cap_div", "div", ss, Dt::Model, false, {}, ss},
                        {"attn.cap_tanh", "tanh", ss, Dt::Model, true, {}, ss},
                        {"attn.capped", "mul", ss, Dt::Model, false, {}, ss}};
  l.insert(position(l, "attn.scores") + 1, std::begin(e), std::end(e));
}

/// Gemma2's embedding: the scaled lookup, and in eager attention a second decoder-wide mask (the
/// sliding-window one beside the causal one) [G2].
void gemma2_embedding(OpList& l, const LayerSetup& s) {
  gemma_embedding(l, s);
  if (s.eager)
    l.insert(position(l, "embed.lookup"),
             {"sliding_mask", "masked_fill", shape(Sym::B, Sym::S, Sym::S), Dt::Model, false, "decoder_end", kNone})
        ->checkpoint_input = true;
}

/// Gemma3 [G3]: Gemma2's four norms and, after the q / k / v projections, q_norm and k_norm (Gemma
/// RMSNorms over each head, weights [head_dim]) before the rotary; no score or logit softcapping
/// (Gemma3TextConfig: attn_logit_softcapping and final_logit_softcapping None).
void gemma3_layer(OpList& l, const LayerSetup& s) {
  gemma2_layer(l, s);
  const std::string_view q_end = find_op(l, "q_proj.out")->dies_after, k_end = find_op(l, "k_proj.out")->dies_after;
  gemma_rms_norm(l, s, "q_proj.out", q_end, kQNorm,
                 {shape(Sym::T, Sym::Q), shape(Sym::T, Sym::A), shape(Sym::HeadDim), "v_proj.out"});
  gemma_rms_norm(l, s, "k_proj.out", k_end, kKNorm,
                 {shape(Sym::T, Sym::KV), shape(Sym::T, Sym::KvHeads), shape(Sym::HeadDim), "q_norm.out"});
}

/// Gemma3's embedding [G3]: Gemma2's, and a second cos / sin pair (the sliding layers' rotary base),
/// each kept by the layers of its kind.
void gemma3_embedding(OpList& l, const LayerSetup& s) {
  gemma2_embedding(l, s);
  for (std::string_view n : {"rotary.sin", "rotary.cos"}) {
    TensorOp local = *find_op(l, n);
    local.name = n == "rotary.cos" ? "rotary.cos_local" : "rotary.sin_local";
    l.insert(position(l, "rotary.sin") + 1, local);
  }
}

/// Gemma2's head: the final norm, then the logits capped as the scores are [G2]; the capped
/// logits are what the model output holds until the loss is computed.
void gemma2_head(OpList& l, const LayerSetup& s) {
  gemma_family_norms(l, s);
  TensorOp* logits = find_mut(l, "logits");
  const Shape tv = logits->shape;
  const std::string_view held = logits->dies_after;
  logits->dies_after = {};
  const TensorOp e[] = {{"logits.cap_div", "div", tv, Dt::Model, false, {}, tv},
                        {"logits.cap_tanh", "tanh", tv, Dt::Model, true, {}, tv},
                        {"logits.capped", "mul", tv, Dt::Model, false, held, tv}};
  l.insert(position(l, "logits") + 1, std::begin(e), std::end(e));
}

}  // namespace

const FamilyEdits kQwen3Edits{qwen3_layer, nullptr, nullptr};
const FamilyEdits kGemma3Edits{gemma3_layer, gemma3_embedding, gemma_family_norms, gemma_family_norms};
const FamilyEdits kOlmo2Edits{nullptr, olmo2_embedding, gemma_head, olmo2_layer};
const FamilyEdits kGemma2Edits{gemma2_layer, gemma2_embedding, gemma2_head, gemma2_softcap_scores};
const FamilyEdits kPhi3Edits{phi3_layer, nullptr, nullptr, phi3_attention_layout};
const FamilyEdits kGemmaEdits{nullptr, gemma_embedding, gemma_family_norms, gemma_family_norms};

void edit_autocast(OpList& l) {
  for (const AutocastLinear& a : kAutocastLinears) autocast_linear(l, a);
  // rotary: the half projection times the fp32 cos/sin is fp32 again [L]; SDPA casts q and k to
  // the half dtype and keeps the casts, v is half already [A]
  for (std::string_view n : {"q.mul_cos", "q.mul_sin", "q.rot", "k.mul_cos", "k.mul_sin", "k.rot"})
    if (TensorOp* t = find_mut(l, n)) t->dtype = Dt::Model;
  for (std::string_view n : {"q.neg", "q.rotate_half", "k.neg", "k.rotate_half"})
    if (TensorOp* t = find_mut(l, n)) t->dtype = Dt::Half;
  if (TensorOp* o = find_mut(l, "attn.out"); o && o->op != "clone") {
    o->dtype = Dt::Half;
    o->grad_dtype = Dt::Half;
    auto pos = position(l, "attn.out");
    pos = l.insert(pos, {"attn.q_half", "_to_copy", find_mut(l, "q.rot")->shape, Dt::Half, true, {}, find_mut(l, "q.rot")->shape});
    l.insert(pos + 1, {"attn.k_half", "_to_copy", find_mut(l, "k.rot")->shape, Dt::Half, true, {}, find_mut(l, "k.rot")->shape});
    for (std::string_view n : {"q.rot", "k.rot"}) {
      TensorOp* t = find_mut(l, n);
      t->saved = false;
      t->dies_after = n == "q.rot" ? "attn.q_half" : "attn.k_half";
    }
  }
  for (std::string_view n : {"mlp.act", "mlp.mul"})
    if (TensorOp* t = find_mut(l, n)) t->dtype = Dt::Half, t->grad_dtype = Dt::Half;
  // the logits: ForCausalLMLoss's .float() is a real copy of the half logits, its local until it
  // returns the loss, as in half precision (head_and_loss; measured, peak dump of holdout 16's
  // qwen3/h384-L3-V2048/full/amp_bf16/gc/sdpa/b2s384/adamw/gas2 at nll_loss: the fp32
  // [2, 384, 2048] copy beside _log_softmax's output)
  if (TensorOp* lg = find_mut(l, "logits"); lg && !find_mut(l, "loss.logits_fp32"))
    l.insert(position(l, "loss.labels_padded"),
             {"loss.logits_fp32", "_to_copy", lg->shape, Dt::F32, false, "loss.total_weight", lg->shape});
}

}  // namespace memfit::sched
