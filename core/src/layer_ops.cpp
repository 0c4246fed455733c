// The tensor lists of a Llama-like layer. Sources, cited per entry:
//  [D] PyTorch tools/autograd/derivatives.yaml (what each op saves: pow saves self, mean nothing,
//      rsqrt its result, mul the other operand of each input that needs a gradient, silu self,
//      _softmax its result, mm/addmm the operands whose partner needs a gradient)
//  [L] transformers models/llama/modeling_llama.py (LlamaRMSNorm, apply_rotary_pos_emb,
//      rotate_half, eager_attention_forward / repeat_kv, LlamaMLP); mistral/qwen2 copy it
//  [S] transformers integrations/sdpa_attention.py (enable_gqa without a mask, repeat_kv with one)
//  [P] peft tuners/lora/layer.py (Linear.forward: lora_B(lora_A(dropout(x))) * scaling, the input
//      cast to the adapter dtype, the result cast back)
//  [F] aten _scaled_dot_product_flash_attention (CPU): saves q, k, v, output and logsumexp
//  [K] transformers masking_utils.py (sdpa_mask: the bool mask of a sliding window)
#include "layer_ops.hpp"

#include "layer_ops_rms.hpp"

#include <algorithm>

namespace memfit::sched {

u64 Dims::of(Sym x) const {
  switch (x) {
    case Sym::One: return 1;
    case Sym::T: return mul(b, s);
    case Sym::B: return b;
    case Sym::S: return s;
    case Sym::H: return h;
    case Sym::Q: return q;
    case Sym::KV: return kv;
    case Sym::I: return i;
    case Sym::A: return a;
    case Sym::V: return v;
    case Sym::R: return r;
    case Sym::HeadDim: return head_dim;
    case Sym::QKV: return qkv ? qkv : add(q, mul(2, kv));
    case Sym::QR: return qr ? qr : q;
    case Sym::KR: return kr ? kr : kv;
    case Sym::QRHalf: return (qr ? qr : q) / 2;
    case Sym::KRHalf: return (kr ? kr : kv) / 2;
    case Sym::Pos: return pos;
    case Sym::KvHeads: return kv_heads;
    case Sym::TwoI: return mul(2, i);
    case Sym::S_: return mul(b, s, topk);
    case Sym::E: return experts;
    case Sym::SharedI: return shared_i;
    case Sym::HeadDimHalf: return head_dim / 2;
    case Sym::S1: return add(s, 1);
    case Sym::QLora: return q_lora;
    case Sym::KvLora: return kv_lora;
    case Sym::KvA: return add(kv_lora, kv_rope);
    case Sym::KvB: return kv_b;
    case Sym::VH: return vh;
    case Sym::RG: return route_groups;
    case Sym::RG2: return mul(2, route_groups);
    case Sym::RK: return topk_groups;
  }
  return 1;
}

u64 Shape::elements(const Dims& d) const {
  if (empty) return 0;
  return mul(d.of(f[0]), d.of(f[1]), d.of(f[2]), d.of(f[3]));
}

Shape shape(Sym a, Sym b, Sym c, Sym e) { return Shape{{a, b, c, e}, false}; }

namespace {

const Shape TH = shape(Sym::T, Sym::H);
const Shape TQ = shape(Sym::T, Sym::Q);
const Shape TKV = shape(Sym::T, Sym::KV);
const Shape TI = shape(Sym::T, Sym::I);
const Shape T1 = shape(Sym::T);

/// LlamaRMSNorm in fp32 [L]: pow(2) [D: saves self, the input], mean, +eps, rsqrt [D: saves
/// result], x * rsqrt (kept by the weight's mul for the weight gradient [D]), weight * x_hat.
/// The backward runs both paths from x to x_hat [D]: mul's gradient of x (grad * rsqrt, [T, h]) waits
/// at x (`input`: the tensor pow and the mul read) while its gradient of rsqrt (grad * x summed to
/// [T, 1]) goes through rsqrt (-0.5 grad result^3), mean (grad expanded / h: [T, h]) and pow
/// (2 x^1 grad: two [T, h] temporaries), whose [T, h] gradient of x is summed with the waiting one.
void rms_norm(OpList& l, std::string_view p, std::string_view input) {
  const Dt f = Dt::F32;
  l.push_back({.name = p == "norm1" ? "norm1.pow" : "norm2.pow", .op = "pow", .shape = TH, .dtype = f,
               .grad_input = TH, .grad_dtype = f, .backward_temps = 2});
  // (`variance`, the mean, is a local of forward: it dies when the norm returns its output)
  l.push_back({.name = p == "norm1" ? "norm1.mean" : "norm2.mean", .op = "mean", .shape = T1, .dtype = f,
               .dies_after = p == "norm1" ? "norm1.out" : "norm2.out", .grad_input = TH, .grad_dtype = f});
  // variance + eps: a new [T, 1] tensor rsqrt reads (add with a Python number saves nothing and
  // passes its gradient on unchanged [D]), dead once rsqrt has made its result (the real trace of
  // llama/full/fp32/nogc/sdpa: three [T] fp32 blocks per norm, [.alloc9-missing]; the lifetimes:
  // memfit validate --tensors, cpu-tensors.jsonl)
  l.push_back({.name = p == "norm1" ? "norm1.var_eps" : "norm2.var_eps", .op = "add", .shape = T1, .dtype = f});
  l.push_back({.name = p == "norm1" ? "norm1.rsqrt" : "norm2.rsqrt", .op = "rsqrt", .shape = T1, .dtype = f,
               .saved = true, .grad_input = T1, .grad_dtype = f, .backward_temps = 2});
  l.push_back({.name = p == "norm1" ? "norm1.x_hat" : "norm2.x_hat", .op = "mul", .shape = TH, .dtype = f,
               .saved = true, .grad_input = T1, .grad_dtype = f, .residual_of = input});
  l.push_back({p == "norm1" ? "norm1.out" : "norm2.out", "mul", TH, Dt::Model, true, {}, TH,
               shape(Sym::H)});
}

/// apply_rotary_pos_emb [L]: x * cos, rotate_half(x) (neg + cat), * sin, add. mul saves cos/sin
/// (shared, not the rotated tensors); the sum is what attention reads. rotate_half's -x2 is a new
/// tensor of half the width, dead once the cat has copied it (neg saves nothing [D]; the real trace
/// of llama/full/fp32/nogc/sdpa: a [T, q/2] and a [T, kv/2] block between q * cos and the cat).
void rotary(OpList& l, bool k) {
  const Shape w = k ? TKV : TQ;
  l.push_back({k ? "k.mul_cos" : "q.mul_cos", "mul", w, Dt::Model, false, k ? "k.rot" : "q.rot", w});
  l.push_back({k ? "k.neg" : "q.neg", "neg", shape(Sym::T, k ? Sym::KRHalf : Sym::QRHalf), Dt::Model, false, {}, kNone});
  l.push_back({k ? "k.rotate_half" : "q.rotate_half", "cat", w, Dt::Model, false, {}, kNone});
  l.push_back({k ? "k.mul_sin" : "q.mul_sin", "mul", w, Dt::Model, false, {}, kNone});
  l.push_back({k ? "k.rot" : "q.rot", "add", w, Dt::Model, true, {}, kNone});
}

}  // namespace

std::string_view part_name(Part p) {
  static constexpr std::string_view kNames[kParts] = {"weights", "gradients", "optimizer_states", "activations",
                                                      "autocast_weight_copies", "logits_loss", "temporary_buffers",
                                                      "cublas_workspace"};
  return kNames[static_cast<std::size_t>(p)];
}

const FamilyLists kLlamaLists{&decoder_layer, &embedding, &head_and_loss, &edit_input_needs_no_grad};

TensorOp* find_mut(OpList& l, std::string_view name) {
  for (TensorOp& t : l)
    if (t.name == name) return &t;
  return nullptr;
}

OpList::iterator position(OpList& l, std::string_view name) {
  return std::find_if(l.begin(), l.end(), [&](const TensorOp& t) { return t.name == name; });
}

const TensorOp* find_op(const OpList& l, std::string_view name) {
  for (const TensorOp& t : l)
    if (t.name == name) return &t;
  return nullptr;
}

OpList decoder_layer(const LayerSetup& s) {
  OpList l;
  l.reserve(48);
  // the layer input (the previous layer's output): in fp32 norm1's pow saves it [D]
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  rms_norm(l, "norm1", "input");
  // q/k/v_proj: linear saves its input for the weight gradient [D: mm saves self] (norm1.out)
  l.push_back({"q_proj.out", "linear", TQ, Dt::Model, false, "k.rot", TH, shape(Sym::H, Sym::Q)});
  l.push_back({"k_proj.out", "linear", TKV, Dt::Model, false, "k.rot", TH, shape(Sym::H, Sym::KV)});
  l.push_back({"v_proj.out", "linear", TKV, Dt::Model, true, {}, TH, shape(Sym::H, Sym::KV)});
  rotary(l, false);
  rotary(l, true);
  // SDPA flash kernel [F][S]: keeps q, k, v (enable_gqa: no copies), its output and lse;
  // its backward creates dq, dk, dv (grad_input: dq; dk and dv on the rotary entries)
  l.push_back({"attn.out", "_scaled_dot_product_flash_attention", TQ, Dt::Model, true, {}, TQ});
  l.push_back({"attn.lse", "_scaled_dot_product_flash_attention", shape(Sym::B, Sym::A, Sym::S), Dt::F32, true,
               {}, shape(Sym::T, Sym::KV, Sym::One)});
  // o_proj reads the output through a transpose view (layout [b, s, heads, d]) [S]
  l.push_back({"o_proj.out", "linear", TH, Dt::Model, false, "attn.residual", TQ, shape(Sym::Q, Sym::H)});
  // residual add: saves nothing [D]; norm2's pow saves it in fp32
  l.push_back({"attn.residual", "add", TH, Dt::Model, true, {}, kNone, kNone, Dt::Model, Dt::Model, "input"});
  rms_norm(l, "norm2", "attn.residual");
  // LlamaMLP [L]: down(silu(gate(x)) * up(x)); silu saves self, mul saves both operands [D]
  l.push_back({"gate_proj.out", "linear", TI, Dt::Model, true, {}, TH, shape(Sym::H, Sym::I)});
  l.push_back({"mlp.act", "silu", TI, Dt::Model, true, {}, TI});
  l.push_back({"up_proj.out", "linear", TI, Dt::Model, true, {}, TH, shape(Sym::H, Sym::I)});
  l.push_back({"mlp.mul", "mul", TI, Dt::Model, true, {}, TI});  // saved by down_proj [D]
  // down_proj's backward releases it before MulBackward0 runs, which makes both operands'
  // gradients while the incoming one lives: the list's chain carries one, the other (act's) is held
  // beside them [D: mul] (peak dump of tuning case gemma/h128-L3-V1024/lora-r8-qv/bf16/gc/sdpa/
  // b4s64/adamw/gas2, a frozen MLP: three [T, i] gradients beside gate, up and act)
  l.back().released_by = "down_proj.out";
  l.back().backward_temps = 1;
  l.push_back({"down_proj.out", "linear", TH, Dt::Model, false, "mlp.residual", TI, shape(Sym::I, Sym::H)});
  l.push_back({"mlp.residual", "add", TH, Dt::Model, false, "layer_out", kNone, kNone, Dt::Model, Dt::Model,
               "attn.residual"});
  if (s.family && s.family->layer) s.family->layer(l, s);
  if (s.eager) edit_eager_attention(l, s.gqa);
  else if (s.window_mask) edit_window_mask(l, s.gqa);
  if (s.half) edit_half_precision(l);
  if (s.family && s.family->layer_after_precision) s.family->layer_after_precision(l, s);
  if (s.autocast) edit_autocast(l);
  if (!s.full) edit_lora(l, s.lora_all, s.half);
  return l;
}

void edit_half_precision(OpList& l) {
  // LlamaRMSNorm upcasts a half input (.to(float32)): pow saves the fp32 copy, not the input;
  // the x_hat cast back to half is what the weight's mul keeps [L][D]
  for (std::string_view n : {"norm1", "norm2"}) {
    const bool first = n == "norm1";
    TensorOp* in = find_mut(l, first ? "input" : "attn.residual");
    in->saved = false;
    in->dies_after = first ? "attn.residual" : "mlp.residual";
    auto at = position(l, first ? "norm1.pow" : "norm2.pow");
    // (its backward casts the fp32 gradient back to the input's dtype)
    at = l.insert(at, {first ? "norm1.upcast" : "norm2.upcast", "_to_copy", TH, Dt::F32, true, {}, TH});
    at->sums_first = true;  // read by pow and by the x_hat mul
    TensorOp* xh = find_mut(l, first ? "norm1.x_hat" : "norm2.x_hat");
    xh->saved = false;
    xh->residual_of = first ? "norm1.upcast" : "norm2.upcast";
    auto out = position(l, first ? "norm1.out" : "norm2.out");
    l.insert(out, {first ? "norm1.x_hat_half" : "norm2.x_hat_half", "_to_copy", TH, Dt::Model, true, {}, TH, kNone,
                   Dt::Model, Dt::F32});
  }
  // eager attention: softmax runs in fp32 and its half copy is what the PV matmul keeps [L]
  // (the fp32 copy of the scores that softmax runs on and its fp32 gradients: step_lists' layer_list
  // applies edit_softmax_of_half_scores to every family's list, this one included)
  if (find_op(l, "attn.softmax"))
    l.insert(position(l, "attn.softmax") + 1,
             {"attn.probs_half", "_to_copy", shape(Sym::B, Sym::A, Sym::S, Sym::S), Dt::Model, true, {}, kNone});
}

void edit_softmax_of_half_scores(OpList& l, bool half_to_float) {
  TensorOp* sm = find_mut(l, "attn.softmax");
  TensorOp* probs = find_mut(l, "attn.probs_half");
  // (only an fp32 softmax of half scores; once: the entry before it is then the fp32 copy)
  if (!sm || !probs || sm->dtype != Dt::F32 || position(l, "attn.softmax") == l.begin() ||
      std::prev(position(l, "attn.softmax"))->dtype == Dt::F32)
    return;
  // the cast back's backward casts the half gradient of the probabilities to fp32
  probs->grad_input = sm->shape;
  probs->grad_dtype = Dt::F32;
  sm->grad_dtype = half_to_float ? Dt::Model : Dt::F32;
  if (half_to_float) return;
  // softmax(x, dtype=float32) of a half x copies x to fp32 first and runs _softmax on the copy
  // (aten/src/ATen/native/SoftMax.cpp softmax; only CUDA fp16 takes _softmax(half_to_float)), so
  // its backward runs in fp32 and the copy's casts the input gradient back to half. The scores stay
  // alive until the .to(dtype) has returned (the modeling code's `attn_weights` holds them).
  const Shape ss = sm->shape;
  const auto scores = position(l, "attn.softmax") - 1;
  if (scores->dies_after.empty()) scores->dies_after = "attn.probs_half";
  l.insert(scores + 1, {"attn.softmax_in", "_to_copy", ss, Dt::F32, false, {}, ss});
}

void edit_eager_attention(OpList& l, bool gqa) {
  const Shape ss = shape(Sym::B, Sym::A, Sym::S, Sym::S);
  auto at = l.erase(position(l, "attn.out"), position(l, "attn.lse") + 1);
  OpList e;
  // repeat_kv copies K and V to every query head under GQA [L]; matmul saves both operands [D]
  if (gqa) {
    find_mut(l, "k.rot")->saved = false;
    find_mut(l, "k.rot")->dies_after = "attn.k_repeat";
    if (TensorOp* v = find_mut(l, "v_proj.out")) v->saved = false, v->dies_after = "attn.v_repeat";
    e.push_back({"attn.k_repeat", "expand+reshape", TQ, Dt::Model, true, {}, TKV});
    e.push_back({"attn.v_repeat", "expand+reshape", TQ, Dt::Model, true, {}, TKV});
  }
  e.push_back({"attn.scores", "matmul", ss, Dt::Model, false, {}, TQ});
  e.push_back({"attn.masked", "add", ss, Dt::Model, false, {}, ss});
  // softmax(dtype=float32) saves its result [D]
  e.push_back({"attn.softmax", "_softmax", ss, Dt::F32, true, {}, ss});
  e.push_back({"attn.pv", "matmul", TQ, Dt::Model, false, {}, ss});
  // transpose(1, 2).contiguous(): a copy, kept by o_proj [L]
  e.push_back({"attn.out", "clone", TQ, Dt::Model, true, {}, TQ});
  l.insert(at, e.begin(), e.end());
}

void edit_window_mask(OpList& l, bool gqa) {
  // a sliding window no longer than the sequence: SDPA builds a [b, 1, s, s] float mask from the
  // model's bool one in every layer (attention.cpp convert_boolean_attn_mask; CPU's flash kernel and
  // CUDA's memory-efficient one save it for the backward), and with a mask Transformers repeats K/V to every query head [S] (repeat_kv
  // returns K/V themselves when every head has its own)
  const auto at = position(l, "attn.out");
  OpList e;
  e.push_back({"attn.mask", "where", shape(Sym::B, Sym::S, Sym::S), Dt::Model, true, {}, kNone});
  if (gqa) {
    e.push_back({"attn.k_repeat", "expand+reshape", TQ, Dt::Model, true, {}, TKV});
    e.push_back({"attn.v_repeat", "expand+reshape", TQ, Dt::Model, true, {}, TKV});
    find_mut(l, "k.rot")->saved = false;
    find_mut(l, "k.rot")->dies_after = "attn.k_repeat";
    if (TensorOp* v = find_mut(l, "v_proj.out")) v->saved = false, v->dies_after = "attn.v_repeat";
  }
  l.insert(at, e.begin(), e.end());
}

namespace {

/// A Linear LoRA can adapt: its output entry, the tensor it reads, and the adapter's entries.
struct LoraTarget {
  std::string_view out, input, base, in, a, b, sum, scaled;
  bool qv;  ///< adapted under LoRA on q_proj and v_proj only
};
constexpr LoraTarget kLoraTargets[] = {
    {"q_proj.out", "norm1.out", "q_proj.base", "q.lora_in", "q.lora_A", "q.lora_B", "q.lora_sum", "q.lora_scaled", true},
    {"k_proj.out", "norm1.out", "k_proj.base", "k.lora_in", "k.lora_A", "k.lora_B", "k.lora_sum", "k.lora_scaled", false},
    {"v_proj.out", "norm1.out", "v_proj.base", "v.lora_in", "v.lora_A", "v.lora_B", "v.lora_sum", "v.lora_scaled", true},
    {"qkv_proj.out", "norm1.out", "qkv_proj.base", "qkv.lora_in", "qkv.lora_A", "qkv.lora_B", "qkv.lora_sum",
     "qkv.lora_scaled", false},
    {"o_proj.out", "attn.out", "o_proj.base", "o.lora_in", "o.lora_A", "o.lora_B", "o.lora_sum", "o.lora_scaled", false},
    {"gate_proj.out", "norm2.out", "gate_proj.base", "gate.lora_in", "gate.lora_A", "gate.lora_B", "gate.lora_sum",
     "gate.lora_scaled", false},
    {"up_proj.out", "norm2.out", "up_proj.base", "up.lora_in", "up.lora_A", "up.lora_B", "up.lora_sum", "up.lora_scaled",
     false},
    {"gate_up_proj.out", "norm2.out", "gate_up_proj.base", "gate_up.lora_in", "gate_up.lora_A", "gate_up.lora_B",
     "gate_up.lora_sum", "gate_up.lora_scaled", false},
    {"down_proj.out", "mlp.mul", "down_proj.base", "down.lora_in", "down.lora_A", "down.lora_B", "down.lora_sum",
     "down.lora_scaled", false},
};

/// PEFT's lora.Linear around one frozen Linear [P].
void add_adapter(OpList& l, const LoraTarget& k, bool half) {
  auto it = position(l, k.out);
  TensorOp result = *it;  // what the consumers read keeps the base output's name and lifetime
  const Shape out = it->shape, in = it->grad_input;
  // the frozen base product: dies once the adapter's output is added
  it->name = k.base;
  it->saved = false;
  it->dies_after = half ? k.sum : k.out;
  it->weight = kNone;
  OpList e;
  // PEFT casts the input to the adapter dtype (fp32) [P]: a copy in half precision, kept by lora_A
  // (its backward casts the fp32 gradient back to the input's dtype); dropout(p=0) is an Identity
  if (half) e.push_back({k.in, "_to_copy", in, Dt::F32, true, {}, in});
  if (half) e.back().released_by = k.a;  // kept by lora_A: released once lora_A's backward has run
  // lora_A saves its input [D]; its [T, r] output is kept by lora_B; the gradients are in the
  // adapter dtype
  e.push_back({k.a, "linear", shape(Sym::T, Sym::R), Dt::Adapter, true, {}, in, shape(in.f[1], Sym::R), Dt::Adapter,
               Dt::Adapter});
  // lora_B's output dies once scaled; `* scaling` (a Python number) saves nothing and its
  // backward scales the gradient into a new tensor [D: mul]
  e.push_back({k.b, "linear", out, Dt::Adapter, false, {}, shape(Sym::T, Sym::R), shape(Sym::R, out.f[1]), Dt::Adapter,
               Dt::Adapter});
  e.push_back({k.scaled, "mul", out, Dt::Adapter, false, half ? k.sum : k.out, out, kNone, Dt::Model, Dt::Adapter});
  // result + adapter [P]: add hands its gradient to both operands [D]; the frozen base Linear's
  // backward runs on it beside the adapter's chain, and the two input gradients are summed.
  // A half base output beside the fp32 adapter: the sum is fp32 (type promotion), cast back [P]
  // (autograd casts the gradient the half operand gets)
  if (half) e.push_back({k.sum, "add", out, Dt::F32, false, {}, kNone, kNone, Dt::Model, Dt::Model, k.base});
  result.op = half ? "_to_copy" : "add";
  result.weight = kNone;
  result.grad_input = half ? out : kNone;
  result.grad_dtype = Dt::F32;
  result.residual_of = half ? std::string_view{} : k.base;
  e.push_back(result);
  l.insert(position(l, k.base) + 1, e.begin(), e.end());
}

/// Who keeps the input of the adapted Linears: a frozen Linear keeps nothing [D]; in fp32 the
/// first adapter reading it keeps it (released by its lora_A's backward, the last to run); in
/// half precision every adapter keeps its own fp32 cast, so the half input is only held by the
/// Python frame that passes it: until the module reading it returns (the attention after o_proj,
/// the MLP after down_proj) [L][P][D]. (The flash kernel keeps its own output, which o_proj reads.)
void adapter_inputs(OpList& l, bool all_linear, bool half) {
  struct Input {
    std::string_view tensor, module_end;
  };
  for (const Input& x : {Input{"norm1.out", "o_proj.out"}, Input{"attn.out", "o_proj.out"},
                         Input{"norm2.out", "down_proj.out"}, Input{"mlp.mul", "down_proj.out"}}) {
    TensorOp* t = find_mut(l, x.tensor);
    if (!t || (x.tensor == "attn.out" && t->op != "clone")) continue;
    std::string_view first_adapter;
    for (const LoraTarget& k : kLoraTargets)
      if (k.input == x.tensor && find_op(l, k.out) && (all_linear || k.qv) && first_adapter.empty()) first_adapter = k.a;
    if (first_adapter.empty() || half) {
      t->saved = false;
      t->dies_after = x.module_end;
    } else {
      t->released_by = first_adapter;
    }
  }
}

}  // namespace

void edit_lora(OpList& l, bool all_linear, bool half) {
  // frozen weights: no weight gradients; norms frozen, so x_hat is not kept [D]
  for (TensorOp& t : l) t.weight = kNone;
  // (an entry's own lifetime, where a list gives one, holds once it is no longer saved)
  for (std::string_view n : {"norm1.x_hat", "norm2.x_hat", "norm1.x_hat_half", "norm2.x_hat_half"})
    if (TensorOp* t = find_mut(l, n)) t->saved = false;
  adapter_inputs(l, all_linear, half);
  for (const LoraTarget& k : kLoraTargets)
    if ((all_linear || k.qv) && find_op(l, k.out)) add_adapter(l, k, half);
}

void edit_input_needs_no_grad(OpList& l) {
  // autograd records no op whose inputs need no gradient: the norm keeps nothing, and the
  // backward computes no gradient for the input side of q/k/v (only the adapters' chain)
  const auto rope = position(l, "q.mul_cos");
  for (auto it = l.begin(); it != rope; ++it) {
    const std::string_view n = it->name;
    // what reads only the norm's output (the frozen bases, lora_A and its cast) passes no gradient on
    const bool reads_input = n.starts_with("norm1.") || n.ends_with("_proj.base") || n.ends_with("lora_A") ||
                             n.ends_with("lora_in") || n == "input";
    if (reads_input) it->grad_input = kNone;
    it->residual_of = {};  // the frozen base Linear gets no gradient to pass on
    if (n.starts_with("norm1.") && n != "norm1.out") it->saved = false;  // (its own lifetime holds)
  }
  // lora_A still saves its input for its weight gradient [D]: with no norm before q/k/v (OLMo-2)
  // and no fp32 cast of it (half precision), that input is the layer's own
  const bool adapter_keeps_input = !find_op(l, "norm1.out") && find_op(l, "q.lora_A") && !find_op(l, "q.lora_in");
  TensorOp* in = find_mut(l, "input");
  in->saved = adapter_keeps_input;
  in->dies_after = adapter_keeps_input ? std::string_view{} : "attn.residual";
  find_mut(l, "attn.residual")->residual_of = {};
}

/// What LlamaModel.forward allocates after the embedding lookup and before its masks, in that
/// order (transformers models/llama/modeling_llama.py LlamaModel.forward; masking_utils.py): the
/// position ids and the packed-sequence check of create_causal_mask. Sizes and lifetimes checked
/// against the real trace of llama/full/fp32/nogc/sdpa ([.alloc9-missing]) and memfit validate --tensors.
void push_position_ids(OpList& l) {
  const Shape S1 = shape(Sym::S);
  // position_ids = torch.arange(s) + past_seen_tokens: the arange dies with the sum, which the
  // model's frame holds until it returns (the decoder stack's end is the list's nearest point);
  // every decoder layer gets it, so under checkpointing each checkpoint keeps it for its
  // recomputation (memfit validate --tensors: kept into the backward of llama/full/bf16/gc/sdpa)
  l.push_back({"position.arange", "arange", S1, Dt::I64, false, {}, kNone});
  l.push_back({"position.ids", "add", S1, Dt::I64, false, "decoder_end", kNone});
  l.back().checkpoint_input = true;
}

void push_packed_sequence_check(OpList& l) {
  const Shape BS = shape(Sym::B, Sym::S);
  // _preprocess_mask_arguments -> find_packed_sequence_indices (no attention_mask, no cache):
  // position_ids[:, :1] - 1, torch.diff(prepend=...) (cat, then sub), != 1, cumsum, [:, -1] == 0,
  // .all(); its locals die when it returns (after .all(), whose result the `if` reads and drops)
  l.push_back({"mask.first_dummy", "sub", shape(Sym::B), Dt::I64, false, "mask.all", kNone});
  l.push_back({"mask.diff_cat", "cat", shape(Sym::B, Sym::S1), Dt::I64, false, {}, kNone});
  l.push_back({"mask.position_diff", "sub", BS, Dt::I64, false, "mask.all", kNone});
  l.push_back({"mask.not_one", "ne", BS, Dt::Bool, false, {}, kNone});
  l.push_back({"mask.sequence_ids", "cumsum", BS, Dt::I64, false, "mask.all", kNone});
  l.push_back({"mask.last_is_zero", "eq", shape(Sym::B), Dt::Bool, false, {}, kNone});
  l.push_back({"mask.all", "all", shape(Sym::One), Dt::Bool, false, "mask.all", kNone});
}

/// masking_utils.eager_mask (no attention_mask): sdpa_mask(allow_is_causal_skip=False) builds the
/// batch, head, q and kv aranges (q and kv: arange + offset, the arange dying with the sum), the
/// bool [1, 1, s, s] of causal_mask_function (kv_idx <= q_idx), its locals dying as it returns; then
/// torch.where(mask, zeros((), dtype), min_dtype) (the 0-d zeros and the wrapped scalar, in the
/// model dtype) makes the float mask, after which the bool one dies. The float mask ("causal_mask")
/// follows. Checked against the real trace of phi/lora/fp32/gc/eager ([.alloc9-missing]).
void push_eager_mask_setup(OpList& l) {
  const std::string_view bool_mask = "mask.causal_bool";
  l.push_back({"mask.batch_arange", "arange", shape(Sym::B), Dt::I64, false, bool_mask, kNone});
  l.push_back({"mask.head_arange", "arange", shape(Sym::One), Dt::I64, false, bool_mask, kNone});
  l.push_back({"mask.q_arange_raw", "arange", shape(Sym::S), Dt::I64, false, {}, kNone});
  l.push_back({"mask.q_arange", "add", shape(Sym::S), Dt::I64, false, bool_mask, kNone});
  l.push_back({"mask.kv_arange_raw", "arange", shape(Sym::S), Dt::I64, false, {}, kNone});
  l.push_back({"mask.kv_arange", "add", shape(Sym::S), Dt::I64, false, bool_mask, kNone});
  l.push_back({bool_mask, "le", shape(Sym::S, Sym::S), Dt::Bool, false, "causal_mask", kNone});
  l.push_back({"mask.zero", "zeros", shape(Sym::One), Dt::Model, false, "causal_mask", kNone});
  l.push_back({"mask.min", "scalar_tensor", shape(Sym::One), Dt::Model, false, "causal_mask", kNone});
}

/// LlamaRotaryEmbedding.forward [L] (GPT-NeoX's, StableLM's and Phi's are copies of it):
/// position_ids[..., None].float() (dies with the product), freqs = that * inv_freq [1, s, d/2],
/// emb = cat((freqs, freqs)) [1, s, d], emb.cos() and emb.sin() each times attention_scaling (a new
/// tensor; the cos() / sin() one dies with it), then .to(x.dtype): a copy in half precision (the
/// fp32 cos / sin die when it returns), the same tensor in fp32. cos and sin are used by every layer
/// (kept by every layer's rotary muls until the backward is over); position_ids is one row shared
/// by the batch, so they are [1, s, head_dim] (head_dim: the rotary dims)
void push_rotary_tables(OpList& l, const LayerSetup& s) {
  const std::string_view end = "rotary.sin";
  const Shape S1 = shape(Sym::S), SD = shape(Sym::S, Sym::HeadDim);
  l.push_back({"rotary.position_float", "_to_copy", S1, Dt::F32, false, {}, kNone});
  l.push_back({"rotary.freqs", "mul", shape(Sym::S, Sym::HeadDimHalf), Dt::F32, false, end, kNone});
  l.push_back({"rotary.emb", "cat", SD, Dt::F32, false, end, kNone});
  l.push_back({"rotary.cos_raw", "cos", SD, Dt::F32, false, {}, kNone});
  if (s.half) {
    l.push_back({"rotary.cos_f32", "mul", SD, Dt::F32, false, end, kNone});
    l.push_back({"rotary.sin_raw", "sin", SD, Dt::F32, false, {}, kNone});
    l.push_back({"rotary.sin_f32", "mul", SD, Dt::F32, false, end, kNone});
  }
  l.push_back({"rotary.cos", s.half ? "_to_copy" : "mul", SD, Dt::Model, true, {}, kNone});
  if (!s.half) l.push_back({"rotary.sin_raw", "sin", SD, Dt::F32, false, {}, kNone});
  l.push_back({"rotary.sin", s.half ? "_to_copy" : "mul", SD, Dt::Model, true, {}, kNone});
}

namespace {

/// LlamaModel.forward after the lookup: position ids, the masks, the rotary tables.
void model_setup(OpList& l, const LayerSetup& s) {
  push_position_ids(l);
  push_packed_sequence_check(l);
  // a sliding window no longer than the sequence: the model builds one bool mask [1, 1, s, s]
  // (sdpa_mask: the mask function broadcast over the q and kv aranges, expanded to the batch as a
  // view) for all layers (before the rotary tables); each layer's SDPA turns it into its own float
  // mask [K] (eager attention: the model's own float masks, the family's edit)
  if (s.window_mask && !s.eager) {
    l.push_back({"window_mask", "bitwise_and", shape(Sym::S, Sym::S), Dt::Bool, false, "decoder_end", kNone});
    l.back().checkpoint_input = true;
  }
  // eager attention: the model builds one 4-D causal mask [b, 1, s, s] for all layers; add saves
  // nothing [D], so it lives until the decoder stack returns [L]
  if (s.eager) {
    push_eager_mask_setup(l);
    l.push_back({"causal_mask", "where", shape(Sym::B, Sym::S, Sym::S), Dt::Model, false, "decoder_end", kNone});
    l.back().checkpoint_input = true;
  }
  push_rotary_tables(l, s);
}

}  // namespace

OpList embedding(const LayerSetup& s) {
  OpList l;
  // a family that edits the embedding list (its own rotary tables, a second mask, a scaled
  // embedding) keeps the older short list: the lookup last, the shared tables before it
  if (s.family && s.family->embedding) {
    if (s.window_mask && !s.eager) {
      l.push_back({"window_mask", "bitwise_and", shape(Sym::S, Sym::S), Dt::Bool, false, "decoder_end", kNone});
      l.back().checkpoint_input = true;
    }
    l.push_back({"rotary.cos", "cos", shape(Sym::S, Sym::HeadDim), Dt::Model, true, {}, kNone});
    l.push_back({"rotary.sin", "sin", shape(Sym::S, Sym::HeadDim), Dt::Model, true, {}, kNone});
    if (s.eager) {
      l.push_back({"causal_mask", "masked_fill", shape(Sym::B, Sym::S, Sym::S), Dt::Model, false, "decoder_end", kNone});
      l.back().checkpoint_input = true;
    }
    l.push_back({"embed.out", "embedding", TH, Dt::Model, false, "layer_out", kNone, shape(Sym::V, Sym::H)});
    s.family->embedding(l, s);
    return l;
  }
  // embedding(weight, ids): saves the indices only [D]; its output is layer 0's input (the entry
  // that dies at "layer_out" is what the list hands on), made first: the model's set-up follows it
  l.push_back({"embed.out", "embedding", TH, Dt::Model, false, "layer_out", kNone, shape(Sym::V, Sym::H)});
  model_setup(l, s);
  return l;
}

void push_loss(OpList& l, const LayerSetup& s) {
  // the labels shifted by one: F.pad appends an ignore_index column ([b, s + 1] int64), alive
  // until the loss function returns; the shifted copy (contiguous) is nll_loss's target, which
  // it saves [D] and its backward releases (transformers loss/loss_utils.py ForCausalLMLoss)
  l.push_back({.name = "loss.labels_padded", .op = "constant_pad_nd", .shape = shape(Sym::B, Sym::S1),
               .dtype = Dt::I64, .dies_after = "loss.total_weight"});
  l.push_back({.name = "loss.labels", .op = "contiguous", .shape = shape(Sym::T), .dtype = Dt::I64, .saved = true,
               .released_by = "loss"});
  l.push_back({"loss.log_softmax", "_log_softmax", shape(Sym::T, Sym::V), Dt::F32, true, {},
               shape(Sym::T, Sym::V), kNone, Dt::Model, s.half ? Dt::F32 : Dt::Model});
  // nll_loss_forward returns two 0-d fp32 tensors: the loss, which the training loop holds until
  // loss.backward() has run, and total_weight, which nll_loss saves for its backward [D]
  l.push_back({.name = "loss.value", .op = "nll_loss", .shape = shape(Sym::One), .dtype = Dt::F32,
               .dies_after = "backward_end"});
  l.push_back({.name = "loss.total_weight", .op = "nll_loss", .shape = shape(Sym::One), .dtype = Dt::F32,
               .saved = true, .released_by = "loss"});
  // nll_loss backward creates the [T, V] fp32 gradient of the log-probabilities [D]
  l.push_back({"loss", "nll_loss", kNone, Dt::F32, true, {}, shape(Sym::T, Sym::V), kNone, Dt::Model, Dt::F32});
}

OpList head_and_loss(const LayerSetup& s) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  rms_norm(l, "norm1", "input");
  if (s.half) {
    find_mut(l, "input")->saved = false;
    l.insert(position(l, "norm1.pow"), {"norm1.upcast", "_to_copy", TH, Dt::F32, true, {}, TH})->sums_first = true;
    find_mut(l, "norm1.x_hat")->saved = false;
    find_mut(l, "norm1.x_hat")->residual_of = "norm1.upcast";
    l.insert(position(l, "norm1.out"), {"norm1.x_hat_half", "_to_copy", TH, Dt::Model, true, {}, TH, kNone, Dt::Model, Dt::F32});
  }
  if (!s.full) {
    // a frozen norm and a frozen lm_head: mul and mm keep only what the weight gradient needs [D],
    // so neither x_hat nor the norm's output is kept
    for (TensorOp& t : l) t.weight = kNone;
    find_mut(l, s.half ? "norm1.x_hat_half" : "norm1.x_hat")->saved = false;
    find_mut(l, "norm1.out")->saved = false;
    find_mut(l, "norm1.out")->dies_after = "logits";
  }
  // lm_head: linear saves its input (the frozen head of a LoRA run needs it for the input gradient
  // only, which needs the weight, not the input [D]) — kept by the model output either way
  // the model output holds the logits until the loop drops it (`del out`, as the Trainer keeps
  // only the loss) once the loss is computed; log_softmax keeps its own output, not its input [D]
  l.push_back({"logits", "linear", shape(Sym::T, Sym::V), Dt::Model, false, "loss.total_weight", TH,
               s.full ? shape(Sym::V, Sym::H) : kNone});
  // ForCausalLMLoss upcasts the logits (.float()), shifts the labels, cross_entropy =
  // log_softmax (saves its result [D]) + nll_loss; its local `logits` holds the fp32 copy until it
  // returns the loss (transformers loss/loss_utils.py; the tracker's traces free it after nll_loss)
  if (s.half)
    l.push_back({"loss.logits_fp32", "_to_copy", shape(Sym::T, Sym::V), Dt::F32, false, "loss.total_weight",
                 shape(Sym::T, Sym::V)});
  push_loss(l, s);
  if (s.family && s.family->head) s.family->head(l, s);
  if (s.autocast) edit_autocast(l);
  return l;
}

}  // namespace memfit::sched
