// The MoE block of Transformers 5 (Mixtral) as an edit of the Llama-like layer list: the router
// and the fused experts run with grouped_mm over the token slots sorted by expert. Sources:
//  [M] transformers models/mixtral/modeling_mixtral.py (MixtralTopKRouter: F.linear, softmax of
//      the fp32 logits, topk, the top-k values renormalised in place)
//  [X] transformers integrations/moe.py grouped_mm_experts_forward (sort by expert, gather the
//      slots' inputs, grouped gate_up / act * up / grouped down, times the routing weight,
//      un-sort, sum over the k slots of a token)
//  [Q2M] transformers models/qwen2_moe/modeling_qwen2_moe.py (Qwen2MoeTopKRouter: the top-k
//      values cast to the model dtype, renormalised only with norm_topk_prob; the shared expert
//      and its sigmoid gate); [Q3M] models/qwen3_moe (the same router, qwen3's q/k norms)
//  [O] transformers models/gpt_oss/modeling_gpt_oss.py (GptOssTopKRouter, GptOssExperts._apply_gate,
//      _apply_rotary_emb, eager_attention_forward's sinks, GptOssRotaryEmbedding)
//  [M] the recorded tensors of gpt_oss/full/fp32/nogc/eager (cpu-tensors.jsonl): the locals' lifetimes
//  [D] PyTorch derivatives.yaml (softmax keeps its result, topk its indices, index its indices,
//      mul the other operand, grouped_mm its input for the weight gradient)
// Routing: every token goes to exactly k experts, so the slots number T x k whatever the router
// picks; grouped_mm runs all of them in one tensor, so no per-expert count enters the list. (The
// per-expert sizes of grouped_mm's own work space are not modelled.)
#include <algorithm>

#include "layer_ops_rms.hpp"

namespace memfit::sched {

namespace {

OpList::iterator at(OpList& l, std::string_view name) {
  return std::find_if(l.begin(), l.end(), [&](const TensorOp& t) { return t.name == name; });
}

/// How the MoE families differ: Mixtral keeps the fp32 top-k values as routing weights (the
/// weighted slots are fp32 by type promotion) [M]; Qwen-MoE casts them to the model dtype and
/// renormalises only with norm_topk_prob [Q2M][Q3M]; Qwen2-MoE adds a shared expert gated by a
/// sigmoid [Q2M].
struct MoeStyle {
  bool fp32_route = false, renorm = true, shared = false;
};

/// Qwen2-MoE's shared expert on the block's input, a LlamaMLP of width shared_i, times
/// sigmoid(shared_expert_gate(x)) (mul keeps both [D]) [Q2M].
void shared_expert(OpList& e) {
  const Shape TH = shape(Sym::T, Sym::H), TJ = shape(Sym::T, Sym::SharedI), T1 = shape(Sym::T);
  e.push_back({"shared.gate_proj", "linear", TJ, Dt::Model, true, {}, TH, shape(Sym::H, Sym::SharedI)});
  e.push_back({"shared.act", "silu", TJ, Dt::Model, true, {}, TJ});
  e.push_back({"shared.up_proj", "linear", TJ, Dt::Model, true, {}, TH, shape(Sym::H, Sym::SharedI)});
  e.push_back({"shared.mul", "mul", TJ, Dt::Model, true, {}, TJ});
  e.push_back({"shared.down_proj", "linear", TH, Dt::Model, true, {}, TJ, shape(Sym::SharedI, Sym::H)});
  e.push_back({"shared.gate_logit", "linear", T1, Dt::Model, false, {}, TH, shape(Sym::H)});
  e.push_back({"shared.gate", "sigmoid", T1, Dt::Model, true, {}, T1});
  e.push_back({"shared.out", "mul", TH, Dt::Model, false, "down_proj.out", TH});
}

/// The MoE block in place of LlamaMLP: its output is the residual add's operand.
void moe_block(OpList& l, const LayerSetup& s, const MoeStyle& st) {
  const Shape TH = shape(Sym::T, Sym::H), TE = shape(Sym::T, Sym::E);
  const Shape SH = shape(Sym::S_, Sym::H), SI = shape(Sym::S_, Sym::I), S1 = shape(Sym::S_);
  const Shape S2I = shape(Sym::S_, Sym::TwoI);
  const Dt route = st.fp32_route ? Dt::F32 : Dt::Model;
  const auto first = std::find_if(l.begin(), l.end(), [](const TensorOp& t) { return t.name == "gate_proj.out"; });
  const auto pos = l.erase(first, at(l, "down_proj.out") + 1);
  OpList e;
  if (st.shared) shared_expert(e);
  // router: linear keeps its input (norm2.out) [D]; softmax on the fp32 logits keeps its result
  // the router's logits are a local of GptOssMLP.forward (`_`) until it returns
  e.push_back({"router.logits", "linear", TE, Dt::Model, false, "down_proj.out", TH, shape(Sym::H, Sym::E)});
  if (s.half) e.push_back({"router.logits_f32", "_to_copy", TE, Dt::F32, false, {}, TE});
  e.push_back({"router.probs", "_softmax", TE, Dt::F32, true, {}, TE, kNone, Dt::Model, Dt::F32});
  // topk keeps its indices; the in-place renormalisation keeps the values and their sum [D]
  e.push_back({"router.topk_values", "topk", S1, Dt::F32, st.renorm, {}, TE, kNone, Dt::Model, Dt::F32});
  e.push_back({"router.topk_indices", "topk", S1, Dt::I64, true, {}, kNone});
  if (st.renorm) e.push_back({"router.topk_sum", "sum", shape(Sym::T), Dt::F32, true, {}, kNone});
  if (!st.fp32_route && s.half) e.push_back({"router.weights", "_to_copy", S1, Dt::Model, false, "moe.route_w", S1});
  // sort the slots by expert; the gather keeps its indices (perm // k), the weights' gather perm [X][D]
  e.push_back({"moe.expert_ids", "sort", S1, Dt::I64, false, "moe.offsets", kNone});
  e.push_back({"moe.perm", "sort", S1, Dt::I64, true, {}, kNone});
  e.push_back({"moe.token_of_slot", "floor_divide", S1, Dt::I64, true, {}, kNone});
  e.push_back({"moe.x", "index", SH, Dt::Model, s.full, {}, TH});
  e.push_back({"moe.route_w", "index", S1, route, true, {}, S1, kNone, Dt::Model, route});
  e.push_back({"moe.histc_input", "_to_copy", S1, Dt::F32, false, {}, kNone});
  e.push_back({"moe.tokens_per_expert", "histc", shape(Sym::E), Dt::F32, false, {}, kNone});
  e.push_back({"moe.offsets", "cumsum", shape(Sym::E), Dt::F32, true, {}, kNone});
  // experts: grouped gate_up (silu keeps the gate view, mul the up view: the whole output stays),
  // act * up (kept by the grouped down for its weight gradient), the grouped down (kept by the
  // weighting mul) [X][D]
  e.push_back({"moe.gate_up", "_grouped_mm", S2I, Dt::Model, true, {}, SH, shape(Sym::E, Sym::H, Sym::TwoI)});
  e.push_back({"moe.act", "silu", SI, Dt::Model, true, {}, S2I});
  e.push_back({"moe.act_up", "mul", SI, Dt::Model, s.full, {}, SI});
  e.push_back({"moe.down", "_grouped_mm", SH, Dt::Model, true, {}, SI, shape(Sym::E, Sym::I, Sym::H)});
  // times the routing weight, un-sorted by index (keeps inv_perm), summed over a token's k slots
  e.push_back({"moe.weighted", "mul", SH, route, false, {}, SH, kNone, Dt::Model, route});
  e.push_back({"moe.inv_perm", "empty_like", S1, Dt::I64, true, {}, kNone});
  e.push_back({"moe.arange", "arange", S1, Dt::I64, false, {}, kNone});
  e.push_back({"moe.unsorted", "index", SH, route, false, {}, SH, kNone, Dt::Model, route});
  const bool cast = st.fp32_route && s.half;  // the fp32 sum cast back to the model dtype
  const std::string_view sum_name = cast || st.shared ? "moe.sum" : "down_proj.out";
  e.push_back({sum_name, "sum", TH, route, false, cast || st.shared ? std::string_view{} : "mlp.residual", SH, kNone,
               Dt::Model, route});
  if (cast) e.push_back({"down_proj.out", "_to_copy", TH, Dt::Model, false, "mlp.residual", TH, kNone, Dt::Model, Dt::F32});
  if (st.shared) e.push_back({"down_proj.out", "add", TH, Dt::Model, false, "mlp.residual", kNone});
  l.insert(pos, e.begin(), e.end());
}

/// gpt-oss's MoE block [O]: the router's biased logits, topk on them, softmax over the k values
/// (kept: the routing weights, in the model dtype); the slots sorted and gathered as Mixtral's
/// [X]; each expert adds its bias (gathered per slot, a local) to the grouped gate_up, whose
/// interleaved halves go through the clamped SwiGLU: clamp(gate) (kept by the product),
/// clamp(up), gate * alpha, sigmoid (kept), glu = gate * sigmoid (kept), up + 1 (kept),
/// (up + 1) * glu (kept by the grouped down); the down's bias likewise; then Mixtral's weighting,
/// un-sort and sum [D].
void gpt_oss_moe(OpList& l, const LayerSetup& s) {
  const Shape TH = shape(Sym::T, Sym::H), TE = shape(Sym::T, Sym::E);
  const Shape SH = shape(Sym::S_, Sym::H), SI = shape(Sym::S_, Sym::I), S1 = shape(Sym::S_);
  const Shape S2I = shape(Sym::S_, Sym::TwoI);
  const auto first = std::find_if(l.begin(), l.end(), [](const TensorOp& t) { return t.name == "gate_proj.out"; });
  const auto pos = l.erase(first, at(l, "down_proj.out") + 1);
  OpList e;
  // the router's logits are a local of GptOssMLP.forward (`_`) until it returns
  e.push_back({"router.logits", "linear", TE, Dt::Model, false, "down_proj.out", TH, shape(Sym::H, Sym::E), Dt::Model, Dt::Model,
               {}, shape(Sym::E)});
  e.push_back({"router.topk_values", "topk", S1, Dt::Model, false, "router.weights", TE});
  e.push_back({"router.topk_indices", "topk", S1, Dt::I64, true, {}, kNone});
  e.push_back({"router.weights", "_softmax", S1, Dt::Model, true, {}, S1});
  e.push_back({"moe.expert_ids", "sort", S1, Dt::I64, true, {}, kNone});
  e.push_back({"moe.perm", "sort", S1, Dt::I64, true, {}, kNone});
  e.push_back({"moe.token_of_slot", "floor_divide", S1, Dt::I64, true, {}, kNone});
  e.push_back({"moe.x", "index", SH, Dt::Model, s.full, {}, TH});
  e.push_back({"moe.route_w", "index", S1, Dt::Model, true, {}, S1});
  // the experts' forward keeps its locals (the counts, the gathered biases) until it returns [M]
  e.push_back({"moe.histc_input", "_to_copy", S1, Dt::F32, false, "down_proj.out", kNone});
  e.push_back({"moe.tokens_per_expert", "histc", shape(Sym::E), Dt::F32, false, "down_proj.out", kNone});
  e.push_back({"moe.offsets", "cumsum", shape(Sym::E), Dt::F32, true, {}, kNone});
  e.push_back({"moe.gate_up_bias", "index", S2I, Dt::Model, false, "moe.down_bias", kNone});
  e.push_back({"moe.gate_up", "_grouped_mm", S2I, Dt::Model, true, {}, SH, shape(Sym::E, Sym::H, Sym::TwoI),
               Dt::Model, Dt::Model, {}, shape(Sym::E, Sym::TwoI)});
  e.push_back({"moe.gate", "clamp", SI, Dt::Model, true, {}, S2I});
  e.push_back({"moe.up", "clamp", SI, Dt::Model, false, "moe.act_up", S2I});
  e.push_back({"moe.gate_alpha", "mul", SI, Dt::Model, false, "moe.sigmoid", SI});
  e.push_back({"moe.sigmoid", "sigmoid", SI, Dt::Model, true, {}, SI});
  e.push_back({"moe.glu", "mul", SI, Dt::Model, true, {}, SI});
  e.push_back({"moe.up_plus_1", "add", SI, Dt::Model, true, {}, SI});
  e.push_back({"moe.act_up", "mul", SI, Dt::Model, s.full, {}, SI});
  e.push_back({"moe.down_bias", "index", SH, Dt::Model, false, "down_proj.out", kNone});
  e.push_back({"moe.down", "_grouped_mm", SH, Dt::Model, true, {}, SI, shape(Sym::E, Sym::I, Sym::H), Dt::Model,
               Dt::Model, {}, shape(Sym::E, Sym::H)});
  e.push_back({"moe.weighted", "mul", SH, Dt::Model, false, "moe.unsorted", SH});
  e.push_back({"moe.inv_perm", "empty_like", S1, Dt::I64, true, {}, kNone});
  e.push_back({"moe.arange", "arange", S1, Dt::I64, false, {}, kNone});
  e.push_back({"moe.unsorted", "index", SH, Dt::Model, false, {}, SH});
  e.push_back({"down_proj.out", "sum", TH, Dt::Model, false, "mlp.residual", SH});
  l.insert(pos, e.begin(), e.end());
}

/// gpt-oss's _apply_rotary_emb [O] on q or k: the two halves x1, x2; x1 * cos - x2 * sin and
/// x2 * cos + x1 * sin (cos / sin hold half a head; mul keeps them, shared [D]), then cat: the
/// rotated tensor keeps the Llama list's name and lifetime.
void gpt_oss_rotary(OpList& l, bool k) {
  const Shape w = shape(Sym::T, k ? Sym::KRHalf : Sym::QRHalf);
  static const std::string_view kq[] = {"q.x1_cos", "q.x2_sin", "q.first", "q.x2_cos", "q.x1_sin", "q.second"};
  static const std::string_view kk[] = {"k.x1_cos", "k.x2_sin", "k.first", "k.x2_cos", "k.x1_sin", "k.second"};
  const std::string_view* n = k ? kk : kq;
  auto it = l.erase(at(l, k ? "k.mul_cos" : "q.mul_cos"), at(l, k ? "k.rot" : "q.rot"));
  const TensorOp e[] = {{n[0], "mul", w, Dt::Model, false, n[2], w},
                        {n[1], "mul", w, Dt::Model, false, n[2], w},
                        {n[2], "sub", w, Dt::Model, false, k ? "k.rot" : "q.rot", kNone},
                        {n[3], "mul", w, Dt::Model, false, n[5], w},
                        {n[4], "mul", w, Dt::Model, false, n[5], w},
                        {n[5], "add", w, Dt::Model, false, k ? "k.rot" : "q.rot", kNone}};
  l.insert(it, std::begin(e), std::end(e));
  find_mut(l, k ? "k.rot" : "q.rot")->op = "cat";
}

/// GptOssDecoderLayer [O]: the Llama layer with biased q/k/v/o projections, the rotary on halves,
/// the MoE block above, and (after the precision edits) the attention sinks.
void gpt_oss_layer(OpList& l, const LayerSetup& s) {
  for (std::string_view n : {"q_proj.out", "k_proj.out", "v_proj.out", "o_proj.out"})
    find_mut(l, n)->bias = shape(find_op(l, n)->shape.f[1]);
  gpt_oss_rotary(l, false);
  gpt_oss_rotary(l, true);
  gpt_oss_moe(l, s);
}

/// eager_attention_forward with sinks [O]: the scores (+ mask) and the per-head sink column
/// concatenated [b, heads, s, s + 1], minus their row max (values and indices [b, heads, s]),
/// softmax in that dtype (kept), its first s columns a view the PV matmul reads (no fp32 copy,
/// no cast back).
void gpt_oss_sinks(OpList& l) {
  if (!find_op(l, "attn.softmax")) return;
  const Shape ss1 = shape(Sym::B, Sym::A, Sym::S, Sym::S1), rows = shape(Sym::B, Sym::A, Sym::S);
  for (std::string_view n : {"attn.probs_half", "attn.softmax_in"})  // (edit_softmax_of_half_scores')
    if (find_op(l, n)) l.erase(at(l, n));
  const TensorOp e[] = {{"attn.with_sinks", "cat", ss1, Dt::Model, false, "attn.centered", kNone},
                        {"attn.row_max", "max", rows, Dt::Model, false, "attn.centered", kNone},
                        {"attn.row_argmax", "max", rows, Dt::I64, true, {}, kNone},  // max's backward [D]
                        // combined_logits is a local of the attention function until it returns
                        {"attn.centered", "sub", ss1, Dt::Model, false, "attn.out", kNone}};
  l.insert(at(l, "attn.softmax"), std::begin(e), std::end(e));
  TensorOp* sm = find_mut(l, "attn.softmax");
  sm->shape = ss1, sm->dtype = Dt::Model, sm->grad_input = ss1, sm->grad_dtype = Dt::Model;
  find_mut(l, "attn.masked")->dies_after = "attn.softmax";  // attn_weights, reassigned after it
}

/// The decoder layer after the precision edits: GptOssRMSNorm multiplies in fp32 and casts, as
/// Gemma's [O]; the sinks.
void gpt_oss_after_precision(OpList& l, const LayerSetup& s) {
  edit_fp32_product_norms(l, s);
  gpt_oss_sinks(l);
}

void gpt_oss_embedding(OpList& l, const LayerSetup& s) {
  // the rotary tables hold half a head (emb = freqs, not cat(freqs, freqs)) [O]
  for (std::string_view n : {"rotary.cos", "rotary.sin"}) find_mut(l, n)->shape = shape(Sym::S, Sym::HeadDimHalf);
  // eager: the sliding layers' mask beside the causal one, both built once for the decoder [O]
  if (s.eager)
    l.insert(at(l, "embed.out"),
             {"sliding_mask", "masked_fill", shape(Sym::B, Sym::S, Sym::S), Dt::Model, false, "decoder_end", kNone})
        ->checkpoint_input = true;
}

void mixtral_layer(OpList& l, const LayerSetup& s) { moe_block(l, s, {true, true, false}); }
void qwen2_moe_layer(OpList& l, const LayerSetup& s) { moe_block(l, s, {false, false, true}); }
void qwen3_moe_layer(OpList& l, const LayerSetup& s) {
  kQwen3Edits.layer(l, s);
  moe_block(l, s, {false, true, false});
}

}  // namespace

const FamilyEdits kMixtralEdits{mixtral_layer, nullptr, nullptr};
const FamilyEdits kGptOssEdits{gpt_oss_layer, gpt_oss_embedding, edit_fp32_product_norms, gpt_oss_after_precision};
const FamilyEdits kQwen2MoeEdits{qwen2_moe_layer, nullptr, nullptr};
const FamilyEdits kQwen3MoeEdits{qwen3_moe_layer, nullptr, nullptr};

}  // namespace memfit::sched
