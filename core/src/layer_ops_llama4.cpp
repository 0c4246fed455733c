// Llama 4's text decoder layer (model_type llama4_text) as edits of the Llama-like lists: a grouped
// decoder whose RoPE layers attend in chunks and L2-normalise q and k, whose NoPE layers attend
// globally with temperature-tuned queries, and whose MoE layers run every expert over every token.
// Sources:
//  [L4] transformers models/llama4/modeling_llama4.py (Llama4TextRotaryEmbedding: complex freqs_cis;
//       apply_rotary_emb: x.float() as complex times freqs_cis, cast back; Llama4TextL2Norm;
//       Llama4TextAttention's attn_temperature_tuning; eager_attention_forward: softmax in the
//       model dtype; Llama4Router: topk, full_like(-inf).scatter_, sigmoid of the float scores;
//       Llama4TextMoe: repeat, times the scores, Llama4TextExperts' two bmm, the shared expert, add_)
//  [K]  transformers masking_utils.py (the chunked mask: bool [b, 1, s, s]; eager: float masks)
//  [D]  PyTorch derivatives.yaml (mul keeps the other operand, pow its input, rsqrt its result,
//       sigmoid its result, bmm both operands, repeat nothing, topk / scatter_ their indices)
//  [T]  the recorded tensors of llama4_text/full/{fp32/nogc/sdpa,bf16/gc/eager} (cpu-tensors.jsonl)
#include <algorithm>

#include "layer_ops_rms.hpp"

namespace memfit::sched {

namespace {

const Shape TH = shape(Sym::T, Sym::H), TQ = shape(Sym::T, Sym::Q), TKV = shape(Sym::T, Sym::KV);

/// apply_rotary_emb [L4]: x.float() (copies in half precision), the complex products with
/// freqs_cis (mul keeps the shared table [D]), cast back with type_as; the function's arguments
/// and temporaries live until it returns (after k's cast) [T]. In fp32 the products are what the qk
/// norms read (kept by their pow).
void complex_rotary(OpList& e, bool half) {
  const std::string_view end = half ? "k.rot_half" : "k.rot";
  if (half) {
    e.push_back({"q.f32", "_to_copy", TQ, Dt::F32, false, end, TQ});
    e.push_back({"k.f32", "_to_copy", TKV, Dt::F32, false, end, TKV});
  }
  e.push_back({"q.rot", "mul", TQ, Dt::F32, !half, half ? end : std::string_view{}, TQ, kNone, Dt::Model, Dt::F32});
  e.push_back({"k.rot", "mul", TKV, Dt::F32, !half, half ? end : std::string_view{}, TKV, kNone, Dt::Model, Dt::F32});
  if (half) {
    e.push_back({"q.rot_half", "_to_copy", TQ, Dt::Model, false, "q.normed_half", TQ, kNone, Dt::Model, Dt::F32});
    e.push_back({"k.rot_half", "_to_copy", TKV, Dt::Model, false, "k.normed_half", TKV, kNone, Dt::Model, Dt::F32});
  }
}

/// Llama4TextL2Norm on q or k [L4]: x.float() (half precision: a copy, kept by pow), pow, mean,
/// rsqrt (kept), the product; type_as casts it back in half precision.
void l2_norm(OpList& e, bool k, bool half, std::string_view out_dies) {
  const Shape w = k ? TKV : TQ, rows = shape(Sym::T, k ? Sym::KvHeads : Sym::A);
  static const std::string_view kq[] = {"q.norm_f32", "q.norm_pow", "q.norm_mean", "q.norm_rsqrt", "q.normed", "q.normed_half"};
  static const std::string_view kk[] = {"k.norm_f32", "k.norm_pow", "k.norm_mean", "k.norm_rsqrt", "k.normed", "k.normed_half"};
  const std::string_view* n = k ? kk : kq;
  if (half) e.push_back({n[0], "_to_copy", w, Dt::F32, true, {}, w});
  e.push_back({n[1], "pow", w, Dt::F32, false, {}, kNone});
  e.push_back({n[2], "mean", rows, Dt::F32, false, {}, kNone});
  e.push_back({n[3], "rsqrt", rows, Dt::F32, true, {}, kNone});
  e.push_back({n[4], "mul", w, Dt::F32, !half && out_dies.empty(), half ? std::string_view{} : out_dies, w, kNone,
               Dt::Model, Dt::F32});
  if (half) e.push_back({n[5], "_to_copy", w, Dt::Model, out_dies.empty(), out_dies, w, kNone, Dt::Model, Dt::F32});
}

/// attn_temperature_tuning on a NoPE layer's q [L4]: positions (arange + offset, a local until the
/// attention returns), log1p(floor((p + 1) / floor_scale)) * attn_scale + 1 ([s], kept by the
/// product [D]), q times it (fp32 by promotion; cast back in half precision).
void temperature_tuning(OpList& e, bool half, std::string_view q_dies) {
  const Shape S = shape(Sym::S);
  e.push_back({"q.positions", "arange", S, Dt::I64, false, {}, kNone});
  e.push_back({"q.positions_off", "add", S, Dt::I64, false, "o_proj.out", kNone});
  e.push_back({"q.pos_f32", "_to_copy", S, Dt::F32, false, {}, kNone});
  e.push_back({"q.pos_plus_1", "add", S, Dt::F32, false, {}, kNone});
  e.push_back({"q.pos_div", "div", S, Dt::F32, false, {}, kNone});
  e.push_back({"q.pos_floor", "floor", S, Dt::F32, false, {}, kNone});
  e.push_back({"q.pos_log1p", "log1p", S, Dt::F32, false, {}, kNone});
  e.push_back({"q.pos_mul", "mul", S, Dt::F32, false, {}, kNone});
  e.push_back({"q.attn_scales", "add", S, Dt::F32, true, {}, kNone});
  e.push_back({"q.scaled", "mul", TQ, half ? Dt::F32 : Dt::Model, !half && q_dies.empty(), half ? std::string_view{} : q_dies,
               TQ, kNone, Dt::Model, half ? Dt::F32 : Dt::Model});
  if (half) e.push_back({"q.scaled_half", "_to_copy", TQ, Dt::Model, q_dies.empty(), q_dies, TQ, kNone, Dt::Model, Dt::F32});
}

/// The attention kernel on the prepared q, k, v [L4]. SDPA: with the chunked mask (a chunk no
/// longer than the sequence) each layer turns the bool mask into a float one and K / V are repeated
/// to every head (kept), else the flash kernel with enable_gqa keeps q, k, v [F]; its output and
/// lse. Eager: repeat_kv copies K and V, matmul copies the transposed q (all kept), scores times
/// the scaling, + mask, softmax in the model dtype (kept), the product, the transposed copy.
/// (Grouped-query attention, as every Llama 4 configuration has: the repeats are real copies.)
void llama4_kernel(OpList& e, const LayerSetup& s) {
  const Shape BASS = shape(Sym::B, Sym::A, Sym::S, Sym::S);
  if (!s.eager) {
    if (s.window_mask) {
      e.push_back({"attn.k_repeat", "expand+reshape", TQ, Dt::Model, true, {}, TKV});
      e.push_back({"attn.v_repeat", "expand+reshape", TQ, Dt::Model, true, {}, TKV});
      e.push_back({"attn.mask", "where", shape(Sym::B, Sym::S, Sym::S), Dt::Model, true, {}, kNone});
    }
    e.push_back({"attn.out", "_scaled_dot_product_flash_attention", TQ, Dt::Model, true, {}, TQ});
    e.push_back({"attn.lse", "_scaled_dot_product_flash_attention", shape(Sym::B, Sym::A, Sym::S), Dt::F32, true, {},
                 TKV});
    return;
  }
  e.push_back({"attn.k_repeat", "expand+reshape", TQ, Dt::Model, true, {}, TKV});
  e.push_back({"attn.v_repeat", "expand+reshape", TQ, Dt::Model, true, {}, kNone});
  e.push_back({"attn.q_contig", "clone", TQ, Dt::Model, true, {}, kNone});
  e.push_back({"attn.scores", "matmul", BASS, Dt::Model, false, {}, TQ});
  e.push_back({"attn.scaled", "mul", BASS, Dt::Model, false, {}, BASS});
  e.push_back({"attn.masked", "add", BASS, Dt::Model, false, {}, kNone});
  e.push_back({"attn.softmax", "_softmax", BASS, Dt::Model, true, {}, BASS});
  e.push_back({"attn.pv", "matmul", TQ, Dt::Model, false, {}, BASS});
  e.push_back({"attn.out", "clone", TQ, Dt::Model, true, {}, TQ});
}

/// Llama4TextAttention [L4] between norm1's output and o_proj: q / k / v projections; RoPE layers:
/// the complex rotary and the qk L2 norm; NoPE layers: the temperature-tuned q; the kernel. What the
/// kernel copies (repeated K / V, eager's q copy) it keeps, and the tensors it was handed live until
/// the attention returns [T].
void llama4_attention(OpList& l, const LayerSetup& s) {
  const auto first = position(l, "norm1.out") + 1;
  const auto pos = l.erase(first, position(l, "o_proj.out"));
  const bool half = s.half, copies_kv = s.eager || s.window_mask;
  // what the kernel is handed: kept by the flash kernel, else a local until the attention returns
  const std::string_view handed = copies_kv ? "o_proj.out" : std::string_view{};
  const std::string_view q_handed = s.eager ? "o_proj.out" : std::string_view{};
  OpList e;
  const std::string_view rot_end = half ? "k.rot_half" : "k.rot", q_end = half ? "q.scaled_half" : "q.scaled";
  e.push_back({"q_proj.out", "linear", TQ, Dt::Model, false, s.nope ? q_end : rot_end, TH, shape(Sym::H, Sym::Q)});
  e.push_back({"k_proj.out", "linear", TKV, Dt::Model, s.nope && !copies_kv, s.nope ? handed : rot_end, TH,
               shape(Sym::H, Sym::KV)});
  e.push_back({"v_proj.out", "linear", TKV, Dt::Model, !copies_kv, handed, TH, shape(Sym::H, Sym::KV)});
  if (s.nope) {
    temperature_tuning(e, half, q_handed);
  } else {
    complex_rotary(e, half);
    l2_norm(e, false, half, q_handed);
    l2_norm(e, true, half, handed);
  }
  llama4_kernel(e, s);
  l.insert(pos, e.begin(), e.end());
}

/// Llama4TextMoe [L4] in place of the MLP: the router (F.linear, topk: values and kept indices,
/// full_like(-inf) scattered, sigmoid of its float copy (kept), cast back: router_scores, a local
/// of the block); routed_in = the input repeated for every expert, times the scores' transposed copy
/// (both kept by the mul [D]); the experts' bmm over [E, T, h] (kept by silu / mul: the whole
/// gate_up), act * up (kept by the second bmm); the shared expert (its down_proj's output is the
/// block's `out`, the residual add's operand); the routed sum over experts, added into it in place.
void llama4_moe(OpList& l, const LayerSetup& s) {
  const Shape TE = shape(Sym::T, Sym::E);
  const Shape ETH = shape(Sym::E, Sym::T, Sym::H), ETI = shape(Sym::E, Sym::T, Sym::I), ET2I = shape(Sym::E, Sym::T, Sym::TwoI);
  const Shape TJ = shape(Sym::T, Sym::SharedI);
  const auto first = position(l, "gate_proj.out");
  const auto pos = l.erase(first, position(l, "down_proj.out") + 1);
  const std::string_view scores = s.half ? "router.scores_half" : "router.scores";
  OpList e;
  e.push_back({"router.logits", "linear", TE, Dt::Model, false, "mlp.residual", TH, shape(Sym::H, Sym::E)});
  e.push_back({"router.topk_values", "topk", shape(Sym::S_), Dt::Model, false, scores, kNone});
  e.push_back({"router.topk_indices", "topk", shape(Sym::S_), Dt::I64, true, {}, kNone});
  e.push_back({"router.full", "full_like", TE, Dt::Model, false, scores, TE});
  if (s.half) e.push_back({"router.f32", "_to_copy", TE, Dt::F32, false, {}, TE});
  e.push_back({"router.scores", "sigmoid", TE, Dt::F32, true, {}, TE, kNone, Dt::Model, Dt::F32});
  if (s.half) e.push_back({"router.scores_half", "_to_copy", TE, Dt::Model, false, "moe.sum", TE, kNone, Dt::Model, Dt::F32});
  e.push_back({"moe.routed_in", "repeat", ETH, Dt::Model, true, {}, TH});
  e.push_back({"moe.scores_col", "clone", shape(Sym::E, Sym::T), Dt::Model, true, {}, TE});
  e.push_back({"moe.x", "mul", ETH, Dt::Model, true, {}, ETH});
  e.push_back({"moe.gate_up", "bmm", ET2I, Dt::Model, true, {}, ETH, shape(Sym::E, Sym::H, Sym::TwoI)});
  e.push_back({"moe.act", "silu", ETI, Dt::Model, true, {}, ET2I});
  e.push_back({"moe.act_up", "mul", ETI, Dt::Model, true, {}, ETI});
  e.push_back({"moe.down", "bmm", ETH, Dt::Model, false, "moe.sum", ETI, shape(Sym::E, Sym::I, Sym::H)});
  e.push_back({"shared.gate_proj", "linear", TJ, Dt::Model, true, {}, TH, shape(Sym::H, Sym::SharedI)});
  e.push_back({"shared.act", "silu", TJ, Dt::Model, true, {}, TJ});
  e.push_back({"shared.up_proj", "linear", TJ, Dt::Model, true, {}, TH, shape(Sym::H, Sym::SharedI)});
  e.push_back({"shared.mul", "mul", TJ, Dt::Model, true, {}, TJ});
  e.push_back({"down_proj.out", "linear", TH, Dt::Model, false, "mlp.residual", TJ, shape(Sym::SharedI, Sym::H)});
  // the routed sum over experts of routed_out.reshape(E, -1, h), added into `out` in place; its
  // backward expands the gradient (a view) and the reshape back to routed_out's [E T, h] copies it
  e.push_back({"moe.sum", "sum", TH, Dt::Model, false, {}, ETH});
  l.insert(pos, e.begin(), e.end());
}

void llama4_layer(OpList& l, const LayerSetup& s) {
  if (s.moe) llama4_moe(l, s);
}
/// Llama4TextDecoderLayer keeps the attention's output in its own local (`attention_states`) until
/// it returns [L4].
void llama4_after_precision(OpList& l, const LayerSetup& s) {
  llama4_attention(l, s);
  find_mut(l, "o_proj.out")->dies_after = "mlp.residual";
}

/// The model's tables and masks [L4][K]: freqs_cis, complex [s, head_dim / 2] (the bytes of an
/// fp32 [s, head_dim]) in place of cos / sin; the chunked layers' bool mask [b, 1, s, s] (SDPA:
/// each layer makes its float mask from it); eager: the full causal and the chunked float masks.
void llama4_embedding(OpList& l, const LayerSetup& s) {
  l.erase(position(l, "rotary.sin"));
  TensorOp* t = find_mut(l, "rotary.cos");
  t->name = "rotary.freqs_cis", t->op = "mul", t->dtype = Dt::F32;
  if (TensorOp* w = find_mut(l, "window_mask")) w->shape = shape(Sym::B, Sym::S, Sym::S);
  if (s.eager) {
    TensorOp chunked = *find_mut(l, "causal_mask");
    chunked.name = "chunked_mask";
    chunked.op = "where";
    l.insert(position(l, "causal_mask") + 1, chunked);
    find_mut(l, "causal_mask")->op = "where";
  }
}

}  // namespace

const FamilyEdits kLlama4Edits{llama4_layer, llama4_embedding, nullptr, llama4_after_precision};

}  // namespace memfit::sched
