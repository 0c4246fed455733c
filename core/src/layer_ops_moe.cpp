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
//      mul the other operand, grouped_mm its input for the weight gradient, sigmoid its result,
//      gather its index, an in-place div its original self (a clone) and the divisor)
//  [DS] transformers models/deepseek_v3/modeling_deepseek_v3.py (DeepseekV3TopkRouter: fp32 logits,
//      sigmoid scores, e_score_correction_bias, group-limited top-k, gather, renormalisation,
//      routed_scaling_factor; DeepseekV3MoE: routed experts, then the shared MLP added;
//      DeepseekV3Attention: MLA with apply_rotary_pos_emb_interleave (rope_interleave, the default))
//  [K] PyTorch aten/src/ATen/native/transformers/attention.cpp _scaled_dot_product_attention_math
//      (the CPU fallback when q/k and v head dims differ: q and k scaled by sqrt(scale), a causal
//      mask built per call, _safe_softmax; half inputs upcast to fp32 and the output cast back)
//  [T] the recorded tensors of deepseek_v3/full/{fp32,bf16}/... (cpu-tensors.jsonl): the lifetimes
//      of the modeling code's locals
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
  /// DeepSeek-V3 [DS]: the sigmoid, group-limited router (deepseek_router) in place of the softmax
  /// one, and a plain shared MLP (no gate) added after the routed experts
  bool deepseek = false;
};

void deepseek_router(OpList& e, const LayerSetup& s, bool renorm);
void deepseek_shared_experts(OpList& e);

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
  if (st.deepseek) {
    deepseek_router(e, s, st.renorm);
  } else {
    // router: linear keeps its input (norm2.out) [D]; softmax on the fp32 logits keeps its result
    // the router's logits are a local of GptOssMLP.forward (`_`) until it returns
    e.push_back({"router.logits", "linear", TE, Dt::Model, false, "down_proj.out", TH, shape(Sym::H, Sym::E)});
    if (s.half) e.push_back({"router.logits_f32", "_to_copy", TE, Dt::F32, false, {}, TE});
    e.push_back({"router.probs", "_softmax", TE, Dt::F32, true, {}, TE, kNone, Dt::Model, Dt::F32});
    // topk keeps its indices; the in-place renormalisation keeps the values and their sum [D]
    e.push_back({"router.topk_values", "topk", S1, Dt::F32, st.renorm, {}, TE, kNone, Dt::Model, Dt::F32});
    e.push_back({"router.topk_indices", "topk", S1, Dt::I64, true, {}, kNone});
    if (st.renorm) e.push_back({"router.topk_sum", "sum", shape(Sym::T), Dt::F32, true, {}, kNone});
  }
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
  const bool shared = st.shared || st.deepseek;  // the routed sum is added to a shared expert's output
  // DeepSeek's routed output is a local until the shared MLP's output has been added to it [DS]
  const std::string_view kept = st.deepseek ? "down_proj.out" : std::string_view{};
  const std::string_view sum_name = cast || shared ? "moe.sum" : "down_proj.out";
  e.push_back({sum_name, "sum", TH, route, false, cast ? std::string_view{} : shared ? kept : "mlp.residual", SH, kNone,
               Dt::Model, route});
  if (cast)
    e.push_back({shared ? "moe.sum_cast" : "down_proj.out", "_to_copy", TH, Dt::Model, false, shared ? kept : "mlp.residual",
                 TH, kNone, Dt::Model, Dt::F32});
  if (st.deepseek) deepseek_shared_experts(e);
  if (shared) e.push_back({"down_proj.out", "add", TH, Dt::Model, false, "mlp.residual", kNone});
  l.insert(pos, e.begin(), e.end());
  if (!st.deepseek) return;
  // the experts' forward keeps its sort keys, counts and un-sorted slots until it returns; the
  // weighted slots die with the un-sort that reads them [T]
  for (std::string_view n : {"moe.expert_ids", "moe.histc_input", "moe.tokens_per_expert", "moe.unsorted"})
    find_mut(l, n)->dies_after = cast ? "moe.sum_cast" : "moe.sum";
  find_mut(l, "moe.weighted")->dies_after = "moe.unsorted";
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

/// DeepseekV3TopkRouter [DS]: F.linear of the fp32 input and weight (copies in half precision,
/// kept by the mm [D]), sigmoid (kept), + e_score_correction_bias, each group's top two summed,
/// the top groups' mask (zeros_like, scatter_, expand + reshape: a copy, .bool(), ~), masked_fill,
/// top-k indices (kept by gather), the scores gathered, divided in place by their sum + 1e-20 (the
/// div keeps a clone of the gathered scores and the divisor [D]), times routed_scaling_factor.
/// The router's locals live until it returns; its weights until the MoE block returns [T].
void deepseek_router(OpList& e, const LayerSetup& s, bool renorm) {
  const Shape TH = shape(Sym::T, Sym::H), TE = shape(Sym::T, Sym::E), S1 = shape(Sym::S_), T1 = shape(Sym::T);
  const Shape G2 = shape(Sym::T, Sym::RG2), G = shape(Sym::T, Sym::RG), K = shape(Sym::T, Sym::RK);
  const std::string_view end = "router.weights";
  if (s.half) {
    e.push_back({"router.x_f32", "_to_copy", TH, Dt::F32, true, {}, TH});
    e.push_back({"router.w_f32", "_to_copy", shape(Sym::E, Sym::H), Dt::F32, true, {}, kNone});
  }
  e.push_back({"router.logits", "linear", TE, Dt::F32, false, "down_proj.out", TH, shape(Sym::H, Sym::E), Dt::Model, Dt::F32});
  e.push_back({"router.scores", "sigmoid", TE, Dt::F32, true, {}, TE, kNone, Dt::Model, Dt::F32});
  e.push_back({"router.choice", "add", TE, Dt::F32, false, "router.masked", kNone});
  e.push_back({"router.group_top2", "topk", G2, Dt::F32, false, "router.group_scores", kNone});
  e.push_back({"router.group_top2_idx", "topk", G2, Dt::I64, false, end, kNone});
  e.push_back({"router.group_scores", "sum", G, Dt::F32, false, end, kNone});
  e.push_back({"router.group_top", "topk", K, Dt::F32, false, {}, kNone});
  e.push_back({"router.group_idx", "topk", K, Dt::I64, false, end, kNone});
  e.push_back({"router.group_mask", "zeros_like", G, Dt::F32, false, end, kNone});
  e.push_back({"router.score_mask", "clone", TE, Dt::F32, false, end, kNone});
  e.push_back({"router.score_mask_bool", "_to_copy", TE, Dt::Bool, false, {}, kNone});
  e.push_back({"router.score_mask_not", "bitwise_not", TE, Dt::Bool, false, end, kNone});
  e.push_back({"router.masked", "masked_fill", TE, Dt::F32, false, end, kNone});
  e.push_back({"router.topk_values", "topk", S1, Dt::F32, false, {}, kNone});
  e.push_back({"router.topk_indices", "topk", S1, Dt::I64, true, {}, kNone});
  e.push_back({"router.gathered", "gather", S1, Dt::F32, false, end, TE, kNone, Dt::Model, Dt::F32});
  if (renorm) {
    e.push_back({"router.topk_sum", "sum", T1, Dt::F32, false, {}, kNone});
    e.push_back({"router.denominator", "add", T1, Dt::F32, true, {}, kNone});
    e.push_back({"router.gathered_saved", "clone", S1, Dt::F32, true, {}, S1, kNone, Dt::Model, Dt::F32});
  }
  e.push_back({"router.weights", "mul", S1, Dt::F32, false, "down_proj.out", S1, kNone, Dt::Model, Dt::F32});
}

/// DeepseekV3MoE's shared experts [DS]: a DeepseekV3MLP of width moe_intermediate_size x
/// n_shared_experts on the block's input (silu keeps its input, mul both operands [D]).
void deepseek_shared_experts(OpList& e) {
  const Shape TH = shape(Sym::T, Sym::H), TJ = shape(Sym::T, Sym::SharedI);
  e.push_back({"shared.gate_proj", "linear", TJ, Dt::Model, true, {}, TH, shape(Sym::H, Sym::SharedI)});
  e.push_back({"shared.act", "silu", TJ, Dt::Model, true, {}, TJ});
  e.push_back({"shared.up_proj", "linear", TJ, Dt::Model, true, {}, TH, shape(Sym::H, Sym::SharedI)});
  e.push_back({"shared.mul", "mul", TJ, Dt::Model, true, {}, TJ});
  e.push_back({"shared.down_proj", "linear", TH, Dt::Model, false, "down_proj.out", TJ, shape(Sym::SharedI, Sym::H)});
}

/// DeepseekV3RMSNorm over a latent of width w [DS], as the Llama list's norms: in half precision
/// an fp32 copy (kept by pow) and the cast-back x_hat (kept by the weight's mul); `x_hat` is a
/// local until the norm returns [T].
void latent_norm(OpList& e, std::string_view n, Sym w, bool half) {
  const Shape TW = shape(Sym::T, w), T1 = shape(Sym::T);
  static const std::string_view kq[] = {"q_a_norm.upcast", "q_a_norm.pow", "q_a_norm.mean", "q_a_norm.rsqrt",
                                        "q_a_norm.x_hat", "q_a_norm.x_hat_half", "q_a_norm.out"};
  static const std::string_view kkv[] = {"kv_a_norm.upcast", "kv_a_norm.pow", "kv_a_norm.mean", "kv_a_norm.rsqrt",
                                         "kv_a_norm.x_hat", "kv_a_norm.x_hat_half", "kv_a_norm.out"};
  const std::string_view* k = n == "q_a_norm" ? kq : kkv;
  if (half) e.push_back({k[0], "_to_copy", TW, Dt::F32, true, {}, TW});
  e.push_back({k[1], "pow", TW, Dt::F32, false, {}, kNone});
  e.push_back({k[2], "mean", T1, Dt::F32, false, k[6], kNone});  // `variance`: a local
  e.push_back({k[3], "rsqrt", T1, Dt::F32, true, {}, kNone});
  e.push_back({k[4], "mul", TW, Dt::F32, !half, half ? k[6] : std::string_view{}, TW, kNone, Dt::Model, Dt::F32});
  if (half) e.push_back({k[5], "_to_copy", TW, Dt::Model, true, {}, TW});
  e.push_back({k[6], "mul", TW, Dt::Model, true, {}, TW, shape(w)});
}

/// apply_rotary_pos_emb_interleave on q or k [DS]: the even / odd halves times cos and sin (mul
/// keeps the shared cos / sin [D]), x1 cos - x2 sin, x2 cos + x1 sin, cat; the rotated tensor is a
/// local of the attention until it returns.
void interleaved_rotary(OpList& e, bool k) {
  const Shape w = shape(Sym::T, k ? Sym::KRHalf : Sym::QRHalf);
  static const std::string_view kq[] = {"q.x1_cos", "q.x2_sin", "q.first", "q.x2_cos", "q.x1_sin", "q.second", "q.rot"};
  static const std::string_view kk[] = {"k.x1_cos", "k.x2_sin", "k.first", "k.x2_cos", "k.x1_sin", "k.second", "k.rot"};
  const std::string_view* n = k ? kk : kq;
  e.push_back({n[0], "mul", w, Dt::Model, false, n[2], w});
  e.push_back({n[1], "mul", w, Dt::Model, false, n[2], w});
  e.push_back({n[2], "sub", w, Dt::Model, false, n[6], kNone});
  e.push_back({n[3], "mul", w, Dt::Model, false, n[5], w});
  e.push_back({n[4], "mul", w, Dt::Model, false, n[5], w});
  e.push_back({n[5], "add", w, Dt::Model, false, n[6], kNone});
  e.push_back({n[6], "cat", shape(Sym::T, k ? Sym::KR : Sym::QR), Dt::Model, false, "o_proj.out", kNone});
}

/// _scaled_dot_product_attention_math on CPU [K]: (half inputs upcast to fp32 first) q and k
/// scaled (kept by the bmm), the causal mask built per call, scores + mask, _safe_softmax (kept),
/// v made contiguous (kept), the product; in half precision the probabilities and the output are
/// cast back; sdpa_attention_forward's transpose(1, 2).contiguous() is what o_proj keeps.
void sdpa_math(OpList& e, bool half) {
  const Shape TQ = shape(Sym::T, Sym::Q), TV = shape(Sym::T, Sym::VH), SS = shape(Sym::S, Sym::S);
  const Shape BASS = shape(Sym::B, Sym::A, Sym::S, Sym::S), one = shape(Sym::One);
  const std::string_view end = half ? "attn.out_half" : "attn.pv";
  if (half) {
    e.push_back({"attn.q_f32", "_to_copy", TQ, Dt::F32, false, end, TQ});
    e.push_back({"attn.k_f32", "_to_copy", TQ, Dt::F32, false, end, TQ});
    e.push_back({"attn.v_f32", "_to_copy", TV, Dt::F32, false, end, TV});
  }
  e.push_back({"attn.q_scaled", "mul", TQ, Dt::F32, true, {}, TQ, kNone, Dt::Model, Dt::F32});
  e.push_back({"attn.causal_ones", "ones", SS, Dt::Bool, false, {}, kNone});
  e.push_back({"attn.causal_tril", "tril", SS, Dt::Bool, false, "attn.causal_mask", kNone});
  e.push_back({"attn.neg_inf", "scalar_tensor", one, Dt::F32, false, "attn.causal_mask", kNone});
  e.push_back({"attn.zero", "scalar_tensor", one, Dt::F32, false, "attn.causal_mask", kNone});
  e.push_back({"attn.causal_mask", "where", SS, Dt::F32, false, end, kNone});
  e.push_back({"attn.k_scaled", "mul", TQ, Dt::F32, true, {}, TQ, kNone, Dt::Model, Dt::F32});
  e.push_back({"attn.scores", "bmm", BASS, Dt::F32, false, {}, TQ, kNone, Dt::Model, Dt::F32});
  e.push_back({"attn.masked", "add", BASS, Dt::F32, false, {}, kNone});  // add hands its gradient on [D]
  e.push_back({"attn.softmax", "_safe_softmax", BASS, Dt::F32, true, {}, BASS, kNone, Dt::Model, Dt::F32});
  if (half) e.push_back({"attn.probs_cast", "_to_copy", BASS, Dt::Model, false, end, kNone});
  // (clone's backward hands its gradient on: the probabilities' gradient from the product reaches
  // the softmax; the product's v gradient, a [T, vh] branch, is left out)
  e.push_back({"attn.v_contig", "clone", TV, Dt::F32, true, {}, kNone});
  e.push_back({"attn.pv", "bmm", TV, Dt::F32, false, {}, BASS, kNone, Dt::Model, Dt::F32});
  if (half) e.push_back({"attn.out_half", "_to_copy", TV, Dt::Model, false, {}, TV, kNone, Dt::Model, Dt::F32});
  e.push_back({"attn.out", "clone", TV, Dt::Model, true, {}, TV});
}

/// eager_attention_forward on MLA's q / k / v [DS]: matmul keeps q and the key [D]; the scores
/// times the scaling, + the causal mask, softmax in fp32 (kept; in half precision on an fp32 copy,
/// cast back: step_lists' edit_softmax_of_half_scores around "attn.probs_half"); matmul copies
/// the strided v view (kept), the product, transpose(1, 2).contiguous() (kept by o_proj).
void eager_mla(OpList& e, bool half) {
  const Shape TQ = shape(Sym::T, Sym::Q), TV = shape(Sym::T, Sym::VH), BASS = shape(Sym::B, Sym::A, Sym::S, Sym::S);
  e.push_back({"attn.scores", "matmul", BASS, Dt::Model, false, {}, TQ});
  e.push_back({"attn.scaled", "mul", BASS, Dt::Model, false, {}, BASS});
  e.push_back({"attn.masked", "add", BASS, Dt::Model, false, {}, kNone});
  e.push_back({"attn.softmax", "_softmax", BASS, Dt::F32, true, {}, BASS, kNone, Dt::Model, Dt::F32});
  if (half) e.push_back({"attn.probs_half", "_to_copy", BASS, Dt::Model, true, {}, kNone});
  e.push_back({"attn.v_contig", "clone", TV, Dt::Model, true, {}, kNone});  // (as sdpa_math's)
  e.push_back({"attn.pv", "matmul", TV, Dt::Model, false, {}, BASS});
  e.push_back({"attn.out", "clone", TV, Dt::Model, true, {}, TV});
}

/// DeepseekV3Attention (MLA) [DS] in place of the Llama attention, between norm1's output and
/// o_proj: q through q_a_proj, q_a_layernorm and q_b_proj; the compressed K/V and the shared rope
/// key from kv_a_proj_with_mqa, the latent through kv_a_layernorm; both rotary halves; q = cat(q_pass,
/// q_rot); kv_b_proj's expansion; k = new_empty filled with k_nope and the broadcast k_rot; the
/// attention. In fp32 the latent norms' pow keeps q_a_proj's and kv_a_proj's outputs [D]; the
/// attention's other locals (q_states, the rotated parts, the cat, kv_b's output whose view is v,
/// the key) live until it returns [T].
void mla_attention(OpList& l, const LayerSetup& s) {
  const Shape TH = shape(Sym::T, Sym::H), TQ = shape(Sym::T, Sym::Q), TV = shape(Sym::T, Sym::VH);
  const Shape TQL = shape(Sym::T, Sym::QLora), TKL = shape(Sym::T, Sym::KvLora);
  const auto first = position(l, "norm1.out") + 1;
  const auto pos = l.erase(first, position(l, "o_proj.out"));
  OpList e;
  e.push_back({"q_a.out", "linear", TQL, Dt::Model, !s.half, s.half ? "q_a_norm.out" : std::string_view{}, TH,
               shape(Sym::H, Sym::QLora)});
  latent_norm(e, "q_a_norm", Sym::QLora, s.half);
  e.push_back({"q_b.out", "linear", TQ, Dt::Model, false, "o_proj.out", TQL, shape(Sym::QLora, Sym::Q)});
  e.push_back({"kv_a.out", "linear", shape(Sym::T, Sym::KvA), Dt::Model, !s.half, s.half ? "o_proj.out" : std::string_view{},
               TH, shape(Sym::H, Sym::KvA)});
  latent_norm(e, "kv_a_norm", Sym::KvLora, s.half);
  interleaved_rotary(e, false);
  interleaved_rotary(e, true);
  // eager: matmul keeps the query and the key [D]
  e.push_back({"attn.query", "cat", TQ, Dt::Model, s.eager, s.eager ? std::string_view{} : "o_proj.out", TQ});
  e.push_back({"kv_b.out", "linear", shape(Sym::T, Sym::KvB), Dt::Model, false, "o_proj.out", TKL,
               shape(Sym::KvLora, Sym::KvB)});
  e.push_back({"attn.key", "new_empty", TQ, Dt::Model, s.eager, s.eager ? std::string_view{} : "o_proj.out", TQ});
  if (s.eager) eager_mla(e, s.half);
  else sdpa_math(e, s.half);
  l.insert(pos, e.begin(), e.end());
  TensorOp* o = find_mut(l, "o_proj.out");
  o->grad_input = TV, o->weight = shape(Sym::VH, Sym::H);
}

/// DeepseekV3DecoderLayer [DS]: MLA attention; the dense layers (first_k_dense_replace) keep the
/// Llama MLP, the others the MoE block with the sigmoid router and a shared MLP. The attention is
/// written after the precision edits (its own fp32 / half, eager / SDPA entries).
void deepseek_layer(OpList& l, const LayerSetup& s) {
  if (s.moe) moe_block(l, s, {.fp32_route = true, .renorm = s.route_renorm, .shared = false, .deepseek = true});
}
void deepseek_after_precision(OpList& l, const LayerSetup& s) { mla_attention(l, s); }
/// The rotary tables hold the rope part of a head only (qk_rope_head_dim) [DS]
void deepseek_embedding(OpList& l, const LayerSetup&) {
  for (std::string_view n : {"rotary.cos", "rotary.sin"}) find_mut(l, n)->shape = shape(Sym::S, Sym::KR);
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
const FamilyEdits kDeepseekV3Edits{deepseek_layer, deepseek_embedding, nullptr, deepseek_after_precision};

}  // namespace memfit::sched
