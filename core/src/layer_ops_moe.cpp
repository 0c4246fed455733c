// The MoE block of Transformers 5 (Mixtral) as an edit of the Llama-like layer list: the router
// and the fused experts run with grouped_mm over the token slots sorted by expert. Sources:
//  [M] transformers models/mixtral/modeling_mixtral.py (MixtralTopKRouter: F.linear, softmax of
//      the fp32 logits, topk, the top-k values renormalised in place)
//  [X] transformers integrations/moe.py grouped_mm_experts_forward (sort by expert, gather the
//      slots' inputs, grouped gate_up / act * up / grouped down, times the routing weight,
//      un-sort, sum over the k slots of a token)
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

/// The Mixtral MoE block in place of LlamaMLP: its output is the residual add's operand.
void mixtral_moe(OpList& l, const LayerSetup& s) {
  const Shape TH = shape(Sym::T, Sym::H), TE = shape(Sym::T, Sym::E), TK = shape(Sym::T, Sym::S_, Sym::One);
  const Shape SH = shape(Sym::S_, Sym::H), SI = shape(Sym::S_, Sym::I), S1 = shape(Sym::S_);
  const Shape S2I = shape(Sym::S_, Sym::TwoI);
  (void)TK;
  const auto first = at(l, "gate_proj.out"), last = at(l, "down_proj.out") + 1;
  const auto pos = l.erase(first, last);
  OpList e;
  // router: linear keeps its input (norm2.out) [D]; softmax on the fp32 logits keeps its result
  e.push_back({"router.logits", "linear", TE, Dt::Model, false, {}, TH, shape(Sym::H, Sym::E)});
  if (s.half) e.push_back({"router.logits_f32", "_to_copy", TE, Dt::F32, false, {}, TE});
  e.push_back({"router.probs", "_softmax", TE, Dt::F32, true, {}, TE, kNone, Dt::Model, Dt::F32});
  // topk keeps its indices; the in-place renormalisation keeps the values and their sum [M][D]
  e.push_back({"router.topk_values", "topk", shape(Sym::S_), Dt::F32, true, {}, TE, kNone, Dt::Model, Dt::F32});
  e.push_back({"router.topk_indices", "topk", shape(Sym::S_), Dt::I64, true, {}, kNone});
  e.push_back({"router.topk_sum", "sum", shape(Sym::T), Dt::F32, true, {}, kNone});
  // sort the slots by expert; the gather keeps its indices (perm // k), the weights' gather perm [X][D]
  e.push_back({"moe.expert_ids", "sort", S1, Dt::I64, false, "moe.offsets", kNone});
  e.push_back({"moe.perm", "sort", S1, Dt::I64, true, {}, kNone});
  e.push_back({"moe.token_of_slot", "floor_divide", S1, Dt::I64, true, {}, kNone});
  e.push_back({"moe.x", "index", SH, Dt::Model, s.full, {}, TH});
  e.push_back({"moe.route_w", "index", S1, Dt::F32, true, {}, S1, kNone, Dt::Model, Dt::F32});
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
  // times the fp32 routing weight: fp32 slots (type promotion), un-sorted by index (keeps inv_perm)
  e.push_back({"moe.weighted", "mul", SH, Dt::F32, false, {}, SH, kNone, Dt::Model, Dt::F32});
  e.push_back({"moe.inv_perm", "empty_like", S1, Dt::I64, true, {}, kNone});
  e.push_back({"moe.arange", "arange", S1, Dt::I64, false, {}, kNone});
  e.push_back({"moe.unsorted", "index", SH, Dt::F32, false, {}, SH, kNone, Dt::Model, Dt::F32});
  // the sum over a token's k slots, then (half precision) the cast back to the model dtype
  e.push_back({s.half ? "moe.sum" : "down_proj.out", "sum", TH, Dt::F32, false, s.half ? std::string_view{} : "mlp.residual",
               SH, kNone, Dt::Model, Dt::F32});
  if (s.half) e.push_back({"down_proj.out", "_to_copy", TH, Dt::Model, false, "mlp.residual", TH, kNone, Dt::Model, Dt::F32});
  l.insert(pos, e.begin(), e.end());
}

}  // namespace

const FamilyEdits kMixtralEdits{mixtral_moe, nullptr, nullptr};

}  // namespace memfit::sched
