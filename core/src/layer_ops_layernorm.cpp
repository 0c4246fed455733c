// The tensor lists of the LayerNorm families. Sources, cited per entry:
//  [D] PyTorch tools/autograd/derivatives.yaml: native_layer_norm saves input, mean and rstd
//      (result1, result2); addmm/linear its input when the weight needs a gradient; gelu saves
//      self, relu its result; mul saves the other operand; cat and add save nothing; _softmax its
//      result; bmm/matmul both operands.
//  [N] transformers models/gpt_neox/modeling_gpt_neox.py (GPTNeoXLayer, GPTNeoXAttention,
//      apply_rotary_pos_emb over the first rotary_ndims of each head, eager_attention_forward)
//  [S] transformers integrations/sdpa_attention.py: the output is transposed back with
//      .contiguous(), a copy when the kernel's output is [b, heads, s, d]-contiguous (q built by cat)
//  [F] transformers models/falcon/modeling_falcon.py (FalconDecoderLayer, FalconAttention,
//      _split_heads for new_decoder_architecture)
//  [H] transformers models/phi/modeling_phi.py (PhiDecoderLayer, PhiAttention, PhiMLP)
//  [A] transformers activations.py (NewGELUActivation)
//  [C] transformers models/starcoder2/modeling_starcoder2.py (Starcoder2DecoderLayer, Starcoder2MLP)
//  [L] transformers models/llama/modeling_llama.py, the base of the Llama-like layers (layer_ops.cpp)
//  [T] transformers models/stablelm/modeling_stablelm.py (StableLmAttention, StableLmDecoderLayer)
//  [O] transformers models/opt/modeling_opt.py (OPTDecoderLayer, OPTAttention, OPTDecoder)
//  [G] transformers models/gpt2/modeling_gpt2.py (GPT2Block, GPT2Attention, eager_attention_forward)
//  [B] transformers models/gpt_bigcode/modeling_gpt_bigcode.py (GPTBigCodeBlock, GPTBigCodeAttention)
//  [W] transformers models/bloom/modeling_bloom.py (BloomBlock, BloomAttention, BloomGelu)
//  [I] transformers models/biogpt/modeling_biogpt.py (BioGptDecoderLayer, BioGptAttention)
//  [E] transformers models/gpt_neo/modeling_gpt_neo.py (GPTNeoBlock, GPTNeoSelfAttention._attn)
//  [J] transformers models/gptj/modeling_gptj.py (GPTJBlock, GPTJAttention, apply_rotary_pos_emb)
//  [X] transformers models/codegen/modeling_codegen.py (CodeGenBlock, CodeGenAttention._split_heads,
//      _attn, CodeGenModel)
//  [K] PyTorch aten/src/ATen/native/transformers/attention.cpp (_scaled_dot_product_attention_math)
//  [P] peft tuners/lora/layer.py Linear.forward: result + lora_B(lora_A(x)) * scaling, x cast
//      to the adapter dtype, the result cast back
//  [M] the measured CPU allocation traces, data/measurements/cpu-traces.jsonl (order and sizes of
//      the forward's allocations)
#include "layer_ops_layernorm.hpp"

#include <algorithm>

#include "memfit/model.hpp"

namespace memfit::sched {

namespace {

/// The eager [b, 1, s, s] mask the model builds once for all layers: alive until the decoder stack
/// returns, and under checkpointing until its backward is over, since every checkpoint keeps it
/// (GradientCheckpointingLayer hands the layer's arguments to torch.utils.checkpoint, which keeps
/// them for the recomputation; peak dumps of tuning cases gpt_neo/h128-L2-V1024/full/fp32/gc/eager/
/// b2s640/adamw and gpt_neox/h128-L3-V2048/full/bf16/gc/eager/b1s768/adamw: the mask alive at the
/// last layer's backward).
TensorOp shared_mask(std::string_view op = "masked_fill") {
  TensorOp m{"causal_mask", op, shape(Sym::B, Sym::S, Sym::S), Dt::Model, false, "decoder_end", kNone};
  m.checkpoint_input = true;
  return m;
}

const Shape TH = shape(Sym::T, Sym::H);
const Shape TQ = shape(Sym::T, Sym::Q);
const Shape TKV = shape(Sym::T, Sym::KV);
const Shape TI = shape(Sym::T, Sym::I);
const Shape SS = shape(Sym::B, Sym::A, Sym::S, Sym::S);

/// The names of one LayerNorm's entries.
struct NormNames {
  std::string_view out, mean, rstd;
};
constexpr NormNames kLn1{"ln1.out", "ln1.mean", "ln1.rstd"};
constexpr NormNames kLn2{"ln2.out", "ln2.mean", "ln2.rstd"};
constexpr NormNames kLnF{"ln_f.out", "ln_f.mean", "ln_f.rstd"};

/// nn.LayerNorm: native_layer_norm returns the output, mean and rstd [b, s, 1]; it saves its input,
/// mean and rstd [D] (the output is kept by the Linear reading it). Its backward creates the input
/// gradient and, when trained, the weight and bias gradients.
void layer_norm(OpList& l, const NormNames& n) {
  l.push_back({n.out, "native_layer_norm", TH, Dt::Model, true, {}, TH, shape(Sym::H), Dt::Model, Dt::Model, {},
               shape(Sym::H)});
  l.push_back({n.mean, "native_layer_norm", shape(Sym::T), Dt::NormStats, true, {}, kNone});
  l.push_back({n.rstd, "native_layer_norm", shape(Sym::T), Dt::NormStats, true, {}, kNone});
}

/// An nn.Linear with bias (addmm): saves its input for the weight gradient [D], which the entry
/// of the input records (`saved`); the output's lifetime is the caller's.
TensorOp linear(std::string_view name, Shape out, Shape in, Sym in_w, Sym out_w, bool saved,
                std::string_view dies_after, bool bias = true) {
  return {name, "linear", out, Dt::Model, saved, dies_after, in, shape(in_w, out_w), Dt::Model, Dt::Model, {},
          bias ? shape(out_w) : kNone};
}

/// apply_rotary_pos_emb on the first rotary dims of each head [N]: x_rot * cos, rotate_half
/// (neg of one half, cat), * sin, add; mul saves cos / sin (shared), nothing per layer [D]; the
/// rotated part is concatenated back with the pass-through part (cat) [M].
void partial_rotary(OpList& l, bool k, bool whole_head = false) {
  const Shape w = shape(Sym::T, k ? Sym::KR : Sym::QR);
  l.push_back({k ? "k.mul_cos" : "q.mul_cos", "mul", w, Dt::Model, false, k ? "k.rot" : "q.rot", kNone});
  l.push_back({k ? "k.neg" : "q.neg", "neg", shape(Sym::T, k ? Sym::KRHalf : Sym::QRHalf), Dt::Model, false, {}, kNone});
  l.push_back({k ? "k.rotate_half" : "q.rotate_half", "cat", w, Dt::Model, false, k ? "k.mul_sin" : "q.mul_sin", kNone});
  l.push_back({k ? "k.mul_sin" : "q.mul_sin", "mul", w, Dt::Model, false, k ? "k.rot" : "q.rot", kNone});
  l.push_back({k ? "k.rot" : "q.rot", "add", w, Dt::Model, whole_head, whole_head ? "" : (k ? "k.embed" : "q.embed"),
               kNone});
}

/// SDPA on CPU (flash kernel): keeps q, k, v, its output and the fp32 logsumexp [D]; its output
/// is [b, heads, s, d]-contiguous when q was built by cat, so the transpose back is a copy [S][M].
void sdpa_with_copy(OpList& l) {
  l.push_back({"attn.out", "_scaled_dot_product_flash_attention", TQ, Dt::Model, true, {}, shape(Sym::T, Sym::QKV)});
  l.push_back({"attn.lse", "_scaled_dot_product_flash_attention", shape(Sym::B, Sym::A, Sym::S), Dt::F32, true, {},
               kNone});
  l.push_back({"attn.copy", "clone", TQ, Dt::Model, true, {}, kNone});
}

/// eager_attention_forward [N]: q k^T (both kept by matmul [D]), * scaling, + mask, softmax in
/// fp32 (kept), the PV matmul on a contiguous copy of the strided v view (kept), the transpose
/// back (a copy, kept by the output projection). The fused projection output is then no longer
/// kept by anything: it dies with the attention module's locals [M].
void eager_attention(OpList& l, std::string_view fused_out, std::string_view last_local) {
  if (find_op(l, "attn.copy")) l.erase(position(l, "attn.copy"));
  auto at = l.erase(position(l, "attn.out"), position(l, "attn.lse") + 1);
  OpList e;
  e.push_back({"attn.scores", "matmul", SS, Dt::Model, false, {}, TQ});
  e.push_back({"attn.scaled", "mul", SS, Dt::Model, false, {}, kNone});
  e.push_back({"attn.masked", "add", SS, Dt::Model, false, {}, kNone});
  e.push_back({"attn.softmax", "_softmax", SS, Dt::F32, true, {}, SS});
  e.push_back({"attn.v_copy", "contiguous", TQ, Dt::Model, true, {}, TQ});
  e.push_back({"attn.pv", "matmul", TQ, Dt::Model, false, {}, SS});
  e.push_back({"attn.copy", "clone", TQ, Dt::Model, true, {}, kNone});
  l.insert(at, e.begin(), e.end());
  TensorOp* f = find_mut(l, fused_out);
  f->saved = false;
  f->dies_after = last_local;
}

/// The MLP: fc1 -> activation -> fc2. gelu saves its input (fc1's output), relu its output [D];
/// fc2 keeps its input (the activation's output) [D]. fc2's output dies with the block's locals.
void plain_mlp(OpList& l, const LayerSetup& s, std::string_view last_local, bool bias = true) {
  l.push_back(linear("fc1.out", TI, TH, Sym::H, Sym::I, s.act != Activation::Relu, {}, bias));
  l.push_back({"mlp.act", s.act == Activation::Relu ? "relu" : "gelu", TI, Dt::Model, true, {}, TI});
  l.push_back(linear("fc2.out", TH, TI, Sym::I, Sym::H, false, last_local, bias));
  // gelu's output is kept by fc2 alone (trained): fc2's backward releases it before gelu's runs
  if (s.act != Activation::Relu && s.full) find_mut(l, "mlp.act")->released_by = "fc2.out";
}

/// Dropout with p > 0 on CPU (ATen _dropout_impl): a bernoulli noise tensor in the input's dtype,
/// scaled in place, and input * noise; mul saves the noise (the input needs the gradient) [D].
void dropout(OpList& l, std::string_view noise, std::string_view out, std::string_view out_dies_after) {
  l.push_back({noise, "bernoulli_", TH, Dt::Model, true, {}, kNone});
  l.push_back({out, "mul", TH, Dt::Model, false, out_dies_after, TH});
}

/// NewGELUActivation (gelu_new) [A]: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))), one
/// op at a time: pow saves x (fc1's output), tanh its result, the last mul both operands [D].
void gelu_expression(OpList& l) {
  find_mut(l, "fc1.out")->saved = true;
  l.push_back({"act.half_x", "mul", TI, Dt::Model, true, {}, TI});
  l.push_back({"act.cube", "pow", TI, Dt::Model, false, {}, TI});
  l.push_back({"act.cube_scaled", "mul", TI, Dt::Model, false, {}, kNone});
  l.push_back({"act.inner", "add", TI, Dt::Model, false, {}, kNone});
  l.push_back({"act.inner_scaled", "mul", TI, Dt::Model, false, {}, kNone});
  l.push_back({"act.tanh", "tanh", TI, Dt::Model, true, {}, TI});
  l.push_back({"act.one_plus", "add", TI, Dt::Model, true, {}, kNone});
  l.push_back({"mlp.act", "mul", TI, Dt::Model, true, {}, TI});
}

/// The MLP with gelu_new written as an expression (Phi, GPT-2, ...).
void expression_mlp(OpList& l, std::string_view last_local) {
  l.push_back(linear("fc1.out", TI, TH, Sym::H, Sym::I, true, {}));
  gelu_expression(l);
  l.push_back(linear("fc2.out", TH, TI, Sym::I, Sym::H, false, last_local));
}

/// Eager attention whose q and k reach the first matmul as strided views: matmul keeps contiguous
/// copies of both (in the model dtype) [O][M]. `k_name` / `k` / `k_grad`: the key copy's entry,
/// shape and gradient shape (a GQA key repeated to every head is [T, Q] with a [T, KV] gradient).
void insert_qk_copies(OpList& l, std::string_view k_name = "attn.k_copy", Shape k = TKV, Shape k_grad = TKV) {
  OpList c;
  c.push_back({"attn.q_copy", "contiguous", TQ, Dt::Model, true, {}, TQ});
  c.push_back({k_name, "contiguous", k, Dt::Model, true, {}, k_grad});
  l.insert(position(l, "attn.scores"), c.begin(), c.end());
}

/// softmax(dtype=float32).to(query.dtype) over half scores [H]: F.softmax with a dtype converts its
/// input first (an fp32 copy nothing keeps) and _softmax saves its fp32 result [D]; the half scores
/// stay a local until the cast back returns. The half probabilities are what the PV matmul keeps,
/// released by its backward. Backward: the cast's gradient is fp32, softmax's backward runs in fp32,
/// and the input conversion's backward casts the result back to the half dtype [D: _to_copy]
/// (peak dump of tuning case phi/h256-L2-V1024/full/bf16/gc/eager/b1s512/adamw: three fp32
/// [b, heads, s, s] at _softmax_backward_data, the softmax output, the cast's gradient and its own).
void fp32_softmax_of_half(OpList& l, bool half_to_float) {
  find_mut(l, "attn.masked")->dies_after = "attn.probs_half";
  TensorOp probs{"attn.probs_half", "_to_copy", SS, Dt::Model, true, {}, SS, kNone, Dt::Model, Dt::F32};
  probs.released_by = "attn.pv";
  l.insert(position(l, "attn.softmax") + 1, probs);
  edit_softmax_of_half_scores(l, half_to_float);
}

}  // namespace

/// PhiDecoderLayer [H]: one input_layernorm read by attention and MLP; out = resid_dropout(attn) +
/// resid_dropout(mlp) + x. The attention keeps q_proj / k_proj outputs and the rotated parts as
/// locals until it returns; the dropped attention output is a local until the layer returns [M].
OpList phi_layer(const LayerSetup& s) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  layer_norm(l, kLn1);
  l.push_back(linear("q_proj.out", TQ, TH, Sym::H, Sym::Q, false, "dense.out"));
  l.push_back(linear("k_proj.out", TKV, TH, Sym::H, Sym::KV, false, "dense.out"));
  l.push_back(linear("v_proj.out", TKV, TH, Sym::H, Sym::KV, true, {}));  // the v view SDPA keeps
  partial_rotary(l, false);
  partial_rotary(l, true);
  find_mut(l, "q.rot")->dies_after = "dense.out";
  find_mut(l, "k.rot")->dies_after = "dense.out";
  l.push_back({"q.embed", "cat", TQ, Dt::Model, true, {}, TQ});
  l.push_back({"k.embed", "cat", TKV, Dt::Model, true, {}, TKV});
  sdpa_with_copy(l);
  l.push_back(linear("dense.out", TH, TQ, Sym::Q, Sym::H, false, s.resid_dropout ? "" : "layer.out"));
  std::string_view attn_end = "dense.out";
  if (s.resid_dropout) dropout(l, "attn.noise", "attn.dropped", "layer.out"), attn_end = "attn.dropped";
  // the MLP branch runs first in backward; the attention branch then reads the layer's gradient
  find_mut(l, attn_end)->branch_of = "block.sum";
  find_mut(l, attn_end)->residual_of = "ln1.out";
  if (s.act == Activation::GeluExpr) expression_mlp(l, s.resid_dropout ? "" : "layer.out");
  else plain_mlp(l, s, s.resid_dropout ? "" : "layer.out");
  if (s.resid_dropout) dropout(l, "mlp.noise", "mlp.dropped", "layer.out");
  l.push_back({"block.sum", "add", TH, Dt::Model, false, {}, kNone});
  l.push_back({"layer.out", "add", TH, Dt::Model, false, "layer_out", kNone, kNone, Dt::Model, Dt::Model, "input"});
  if (s.eager) eager_attention(l, "v_proj.out", "dense.out");
  // v's copy is the PV matmul's second operand: the chain hands the probabilities' gradient on
  // to softmax's backward through it (as Falcon's; tuning case phi/h128-L2-V1024/full/fp32/gc/
  // eager/b2s640/adamw: that gradient and softmax's own beside the saved output)
  if (s.eager) find_mut(l, "attn.v_copy")->grad_input = kNone;
  if (s.half && s.eager) fp32_softmax_of_half(l, s.softmax_half_to_float);
  if (!s.full) edit_layernorm_lora(l, s.half);
  return l;
}

namespace {

/// A Llama layer's RMSNorm entries replaced by a LayerNorm's (its output keeps the consumers).
void replace_norm(OpList& l, std::string_view rms, const NormNames& ln) {
  const std::string_view first = rms == "norm1" ? "norm1.pow" : "norm2.pow";
  const std::string_view last = rms == "norm1" ? "norm1.out" : "norm2.out";
  auto at = l.erase(position(l, first), position(l, last) + 1);
  OpList n;
  layer_norm(n, ln);
  l.insert(at, n.begin(), n.end());
}

/// A Llama layer's gated MLP replaced by fc1 -> activation -> fc2 (biases as the family has them).
void replace_gated_mlp(OpList& l, const LayerSetup& s, bool bias) {
  auto at = l.erase(position(l, "gate_proj.out"), position(l, "down_proj.out") + 1);
  OpList m;
  plain_mlp(m, s, "mlp.residual", bias);
  l.insert(at, m.begin(), m.end());
}

/// Llama's eager softmax runs in fp32; its half copy is what the PV matmul keeps [L].
void eager_probs_half(OpList& l) {
  if (find_op(l, "attn.softmax"))
    l.insert(position(l, "attn.softmax") + 1, {"attn.probs_half", "_to_copy", SS, Dt::Model, true, {}, kNone});
}

/// The Llama layer (layer_ops.cpp) in fp32 with trained weights, its attention as the setup asks.
OpList llama_base(const LayerSetup& s) {
  LayerSetup base = s;
  base.half = false;
  base.full = true;
  return decoder_layer(base);
}

}  // namespace

/// Starcoder2DecoderLayer [C]: the Llama layer (rotary over every head, GQA, sliding-window mask)
/// with LayerNorms, biases on q/k/v/o and an ungated MLP (c_fc -> gelu -> c_proj).
OpList starcoder2_layer(const LayerSetup& s) {
  OpList l = llama_base(s);
  replace_norm(l, "norm1", kLn1);
  replace_norm(l, "norm2", kLn2);
  replace_gated_mlp(l, s, true);
  for (std::string_view n : {"q_proj.out", "k_proj.out", "v_proj.out", "o_proj.out"})
    find_mut(l, n)->bias = shape(find_op(l, n)->shape.f[1]);
  if (s.half) eager_probs_half(l);
  // softmax(dtype=float32) of the half scores: the fp32 copy, the backward in fp32 [C] (tuning
  // case starcoder2/h128-L2-V1024/full/bf16/gc/eager/b2s512/adamw)
  if (s.half) edit_softmax_of_half_scores(l, s.softmax_half_to_float);
  if (!s.full) edit_layernorm_lora(l, s.half);
  return l;
}

/// StableLmDecoderLayer [T] (use_parallel_residual false): the Llama layer with LayerNorms and
/// partial rotary: the rotated parts are concatenated back (cat, kept by the attention), the
/// projections and rotated parts stay alive as the attention's locals until it returns [M], and the
/// output of SDPA is [b, heads, s, d]-contiguous, so the transpose back is a copy [S].
OpList stablelm_layer(const LayerSetup& s) {
  OpList l = llama_base(s);
  replace_norm(l, "norm1", kLn1);
  replace_norm(l, "norm2", kLn2);
  auto at = l.erase(position(l, "q.mul_cos"), position(l, "k.rot") + 1);
  OpList r;
  partial_rotary(r, false);
  partial_rotary(r, true);
  r.push_back({"q.embed", "cat", TQ, Dt::Model, true, {}, TQ});
  r.push_back({"k.embed", "cat", TKV, Dt::Model, true, {}, TKV});
  l.insert(at, r.begin(), r.end());
  for (std::string_view n : {"q_proj.out", "k_proj.out", "q.rot", "k.rot"}) {
    TensorOp* t = find_mut(l, n);
    t->saved = false;
    t->dies_after = "o_proj.out";
  }
  if (!s.eager) l.insert(position(l, "attn.lse") + 1, {"attn.copy", "clone", TQ, Dt::Model, true, {}, kNone});
  if (s.half) eager_probs_half(l);
  // (as Starcoder2's [T]; tuning case stablelm/h128-L2-V1024/full/bf16/gc/eager/b1s768/adamw)
  if (s.half) edit_softmax_of_half_scores(l, s.softmax_half_to_float);
  if (!s.full) edit_layernorm_lora(l, s.half);
  // StableLmDecoderLayer.forward keeps `hidden_states = self.input_layernorm(...)` and
  // `self_attn_output` as locals until it returns: the sequential branch rebinds neither [T]
  // (peak dump of tuning case stablelm/h384-L2-V1024/lora-r16-all/bf16/gc/eager/b4s128/adamw/gas2
  // at the recomputed up_proj's adapter: both LayerNorm outputs and o_proj's bf16 output alive)
  for (std::string_view n : {"ln1.out", "o_proj.out"})
    if (TensorOp* t = find_mut(l, n); t && !t->saved) t->dies_after = "mlp.residual";
  return l;
}

/// OPTDecoderLayer with do_layer_norm_before [O]: q_proj(x) * scaling, SDPA on the q / k / v
/// views (the output's transpose back is a view), out_proj, dropout, + residual; final_layer_norm,
/// fc1 -> relu -> fc2, dropout, + residual. Every Linear has a bias.
OpList opt_layer(const LayerSetup& s) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  layer_norm(l, kLn1);
  l.push_back(linear("q_proj.out", TQ, TH, Sym::H, Sym::Q, false, {}));
  l.push_back({"q.scaled", "mul", TQ, Dt::Model, true, {}, TQ});  // mul by a number saves nothing [D]
  l.push_back(linear("k_proj.out", TKV, TH, Sym::H, Sym::KV, true, {}));
  l.push_back(linear("v_proj.out", TKV, TH, Sym::H, Sym::KV, true, {}));
  l.push_back({"attn.out", "_scaled_dot_product_flash_attention", TQ, Dt::Model, true, {}, shape(Sym::T, Sym::QKV)});
  l.push_back({"attn.lse", "_scaled_dot_product_flash_attention", shape(Sym::B, Sym::A, Sym::S), Dt::F32, true, {},
               kNone});
  l.push_back(linear("out_proj.out", TH, TQ, Sym::Q, Sym::H, false, s.resid_dropout ? "" : "attn.residual"));
  if (s.resid_dropout) dropout(l, "attn.noise", "attn.dropped", "attn.residual");
  // the residual sum is kept by final_layer_norm (it saves its input) [D]
  l.push_back({"attn.residual", "add", TH, Dt::Model, true, {}, kNone, kNone, Dt::Model, Dt::Model, "input"});
  layer_norm(l, kLn2);
  plain_mlp(l, s, s.resid_dropout ? "" : "layer.out");
  if (s.resid_dropout) dropout(l, "mlp.noise", "mlp.dropped", "layer.out");
  l.push_back({"layer.out", "add", TH, Dt::Model, false, "layer_out", kNone, kNone, Dt::Model, Dt::Model,
               "attn.residual"});
  if (s.eager) {
    // eager_attention_forward: q and k are strided views, so the first matmul keeps contiguous
    // copies of both; the projections then die with the attention's locals [O][M]
    eager_attention(l, "v_proj.out", "out_proj.out");
    // the PV matmul's second operand, as Phi's (tuning case opt/h128-L2-V1024/full/fp32/gc/eager/b2s640/adamw)
    find_mut(l, "attn.v_copy")->grad_input = kNone;
    insert_qk_copies(l);
    for (std::string_view n : {"q.scaled", "k_proj.out"}) {
      TensorOp* t = find_mut(l, n);
      t->saved = false;
      t->dies_after = "out_proj.out";
    }
  }
  if (s.half) eager_probs_half(l);
  // eager_attention_forward's softmax(dtype=float32) of the half scores copies them to fp32 first,
  // and its backward runs in fp32 [O] (tuning case opt/h128-L2-V1024/full/bf16/gc/eager/b3s512/adamw)
  if (s.half) edit_softmax_of_half_scores(l, s.softmax_half_to_float);
  if (!s.full) edit_layernorm_lora(l, s.half);
  return l;
}

namespace {

/// CPU SDPA with dropout_p > 0: the flash kernel refuses dropout, so _scaled_dot_product_attention_math
/// runs [K]: half inputs upcast to fp32 copies, q * sqrt(scale) and k^T * sqrt(scale) (locals), the
/// causal mask as an fp32 [s, s] (a local), contiguous copies of both for the first matmul (kept),
/// scores, + mask, softmax (kept), dropout (noise and output kept), a contiguous copy of v (kept),
/// the output (cast back in half precision), all in fp32 [M].
void sdpa_math_with_dropout(OpList& l, bool half) {
  const Shape tq = TQ;
  const std::string_view end = half ? "attn.out_half" : "attn.pv";  // the math function returns
  auto at = l.erase(position(l, "attn.out"), position(l, "attn.lse") + 1);
  OpList e;
  if (half)
    for (std::string_view n : {"attn.q_f32", "attn.k_f32", "attn.v_f32"})
      e.push_back({n, "_to_copy", tq, Dt::F32, false, end, tq});
  e.push_back({"attn.q_scaled", "mul", tq, Dt::F32, false, end, kNone});
  // is_causal: ones({s, s}, bool).tril(), then convert_boolean_attn_mask's where(mask,
  // scalar_tensor(0), scalar_tensor(-inf)) (aten/src/ATen/native/transformers/attention.cpp); the
  // bool mask and the two 0-d tensors die once the float mask is made (the real trace of
  // gpt2/full/fp32/nogc/sdpa: 4096 B, 4096 B, 4 B, 4 B before the [s, s] fp32 mask in every layer)
  e.push_back({"attn.mask_ones", "ones", shape(Sym::S, Sym::S), Dt::Bool, false, {}, kNone});
  e.push_back({"attn.mask_bool", "tril", shape(Sym::S, Sym::S), Dt::Bool, false, "attn.mask", kNone});
  e.push_back({"attn.mask_zero", "scalar_tensor", shape(Sym::One), Dt::F32, false, "attn.mask", kNone});
  e.push_back({"attn.mask_min", "scalar_tensor", shape(Sym::One), Dt::F32, false, "attn.mask", kNone});
  e.push_back({"attn.mask", "where", shape(Sym::S, Sym::S), Dt::F32, false, end, kNone});
  e.push_back({"attn.k_scaled", "mul", tq, Dt::F32, false, "attn.scores", kNone});
  e.push_back({"attn.q_copy", "contiguous", tq, Dt::F32, true, {}, tq, kNone, Dt::Model, Dt::F32});
  e.push_back({"attn.k_copy", "contiguous", tq, Dt::F32, true, {}, tq, kNone, Dt::Model, Dt::F32});
  e.push_back({"attn.scores", "matmul", SS, Dt::F32, false, {}, kNone});
  e.push_back({"attn.masked", "add", SS, Dt::F32, false, {}, kNone});
  e.push_back({"attn.softmax", "_safe_softmax", SS, Dt::F32, true, {}, SS, kNone, Dt::Model, Dt::F32});
  e.push_back({"attn.probs_noise", "bernoulli_", SS, Dt::F32, true, {}, kNone});
  e.push_back({"attn.probs_dropped", "mul", SS, Dt::F32, true, {}, SS, kNone, Dt::Model, Dt::F32});
  e.push_back({"attn.v_copy", "contiguous", tq, Dt::F32, true, {}, kNone});
  e.push_back({"attn.pv", "matmul", tq, Dt::F32, false, half ? "attn.out_half" : "attn.copy", SS, kNone, Dt::Model,
               Dt::F32});
  // in half precision the fp32 output is cast back; the transpose copy o_proj keeps reads it
  if (half) e.push_back({"attn.out_half", "_to_copy", tq, Dt::Model, false, "attn.copy", tq});
  // the PV matmul's node releases the dropped probabilities and the v copy it kept, dropout's mul
  // the noise, before the next node's gradient exists [D: bmm, mul]
  for (TensorOp& t : e) {
    if (t.name == "attn.probs_dropped" || t.name == "attn.v_copy") t.released_by = "attn.pv";
    if (t.name == "attn.probs_noise") t.released_by = "attn.probs_dropped";
  }
  l.insert(at, e.begin(), e.end());
}

/// GPT-NeoX's v is a chunk of query_key_value's output viewed [b, heads, s, 3d] (GPT-2's a split of
/// c_attn's): at micro-batch 1 matmul folds [1, heads] into bmm's batch dim as a view (the dims
/// merge), so no contiguous copy is made and the PV matmul keeps the fused output itself until its
/// backward [N][G][K][D] (tensor log of tuning case gpt_neox/h64-L4-V1024/full/fp32/nogc/eager/b1s896:
/// no v copy, qkv kept; peak dump of tuning case gpt2/h384-L2-V1024/full/fp32/nogc/sdpa/b1s448/adamw
/// in the math path: both layers' c_attn addmm [448, 1152] alive in the last layer's MLP backward).
/// The entry stays, empty, for the gradient of v the PV matmul's backward makes.
void v_view_of_fused(OpList& l) {
  TensorOp* v = find_mut(l, "attn.v_copy");
  v->shape = kNone;
  v->op = "view";
  v->saved = false;
  TensorOp* f = find_mut(l, "qkv.out");
  f->saved = true;
  f->dies_after = {};
  f->released_by = "attn.pv";
}

/// Eager attention with dropout on the probabilities [G]: softmax (kept), dropout noise and output
/// (kept by the PV matmul) in the model dtype.
void eager_probs_dropout(OpList& l) {
  auto at = position(l, "attn.softmax") + 1;
  if (TensorOp* half = find_mut(l, "attn.probs_half")) {
    // the half copy of an fp32 softmax is dropout's input, which mul does not keep [D]
    half->saved = false;
    half->dies_after = "attn.probs_dropped";
    at = position(l, "attn.probs_half") + 1;
  }
  OpList e;
  e.push_back({"attn.probs_noise", "bernoulli_", SS, Dt::Model, true, {}, kNone});
  e.push_back({"attn.probs_dropped", "mul", SS, Dt::Model, true, {}, SS});
  l.insert(at, e.begin(), e.end());
}

}  // namespace

OpList gpt2_like_layer(const LayerSetup& s, bool bigcode);

/// GPT2Block [G]: ln_1, attention (c_attn split into views; c_proj; resid_dropout), + residual,
/// ln_2, MLP (c_fc, gelu_new as its expression, c_proj, dropout), + residual. Conv1D is addmm like a
/// Linear. The attention's fused output lives until the attention returns, its dropped output
/// until the block returns [M].
OpList gpt2_layer(const LayerSetup& s) { return gpt2_like_layer(s, false); }

/// GPTBigCodeBlock [B]: the GPT-2 block with multi-query attention (c_attn gives q and one K/V
/// head, repeated to every query head: copies the attention keeps), the softmax in fp32
/// (attention_softmax_in_fp32) and gelu_pytorch_tanh (F.gelu: saves its input).
OpList gpt_bigcode_layer(const LayerSetup& s) { return gpt2_like_layer(s, true); }

/// GPT-2's block, or GPTBigCode's (multi-query attention, fp32 softmax, F.gelu).
OpList gpt2_like_layer(const LayerSetup& s, bool bigcode) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  layer_norm(l, kLn1);
  l.push_back(linear("qkv.out", shape(Sym::T, Sym::QKV), TH, Sym::H, Sym::QKV, false, "attn.dropped"));
  l.push_back({"attn.out", "_scaled_dot_product_flash_attention", TQ, Dt::Model, true, {}, shape(Sym::T, Sym::QKV)});
  l.push_back({"attn.lse", "_scaled_dot_product_flash_attention", shape(Sym::B, Sym::A, Sym::S), Dt::F32, true, {},
               kNone});
  l.push_back({"attn.copy", "clone", TQ, Dt::Model, true, {}, kNone});
  l.push_back(linear("dense.out", TH, TQ, Sym::Q, Sym::H, false, {}));
  dropout(l, "attn.noise", "attn.dropped", "layer.out");
  l.push_back({"attn.residual", "add", TH, Dt::Model, true, {}, kNone, kNone, Dt::Model, Dt::Model, "input"});
  layer_norm(l, kLn2);
  if (bigcode) plain_mlp(l, s, {});
  else expression_mlp(l, {});
  dropout(l, "mlp.noise", "mlp.dropped", "layer.out");
  l.push_back({"layer.out", "add", TH, Dt::Model, false, "layer_out", kNone, kNone, Dt::Model, Dt::Model,
               "attn.residual"});
  if (s.eager) {
    // eager_attention_forward [G]: q and k^T are strided views, copied for the matmul (kept); the
    // softmax stays in the model dtype
    // (GPTBigCode: k and v are repeat_kv copies [b, heads, s, d]; k^T of the copy needs none)
    eager_attention(l, "qkv.out", "attn.dropped");
    if (!bigcode) find_mut(l, "attn.softmax")->dtype = Dt::Model;
    if (bigcode && s.half) {
      // upcast_masked_softmax's .to(input_dtype): its backward casts the gradient to fp32 [B][D]
      // (tuning case gpt_bigcode/h128-L2-V1024/full/bf16/gc/eager/b2s512/adamw: three fp32
      // [b, heads, s, s] at _softmax_backward_data)
      eager_probs_half(l);
      find_mut(l, "attn.probs_half")->grad_input = SS;
      find_mut(l, "attn.probs_half")->grad_dtype = Dt::F32;
      find_mut(l, "attn.softmax")->grad_dtype = Dt::F32;  // softmax of the fp32 upcast scores
    }
    insert_qk_copies(l, bigcode ? "attn.k_repeat" : "attn.k_copy", TQ, TKV);
    if (s.attn_dropout) eager_probs_dropout(l);
  } else if (s.attn_dropout && !s.cuda) {
    if (bigcode) {
      // sdpa_attention_forward repeats K / V to every query head before the math path [S]
      OpList c;
      c.push_back({"attn.k_repeat", "expand+reshape", TQ, Dt::Model, false, "attn.copy", TKV});
      c.push_back({"attn.v_repeat", "expand+reshape", TQ, Dt::Model, false, "attn.copy", TKV});
      l.insert(position(l, "attn.out"), c.begin(), c.end());
    }
    sdpa_math_with_dropout(l, s.half);
    // GPT-2's v is a split of c_attn's output: fp32 at micro-batch 1, no copy (v_view_of_fused)
    if (!bigcode && !s.half && s.one_sequence && !s.checkpointing) v_view_of_fused(l);
  }
  if (!s.full) edit_layernorm_lora(l, s.half);
  return l;
}

/// BloomBlock [W] (eager only): input_layernorm, query_key_value reshaped into per-head copies of
/// q, k and v (kept by baddbmm / bmm), alibi.baddbmm scores and + mask (the attention's locals), softmax
/// in fp32 (kept, and returned by the block), the merged heads (a copy, kept by dense), dropout_add;
/// post_attention_layernorm, dense_h_to_4h, bloom_gelu (an autograd.Function saving its input,
/// computed through [T, i] temporaries), dense_4h_to_h, dropout_add [M].
OpList bloom_layer(const LayerSetup& s) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  layer_norm(l, kLn1);
  l.push_back(linear("qkv.out", shape(Sym::T, Sym::QKV), TH, Sym::H, Sym::QKV, false, "attn.residual"));
  l.push_back({"attn.q_copy", "reshape", TQ, Dt::Model, true, {}, TQ});
  l.push_back({"attn.k_copy", "reshape", TQ, Dt::Model, true, {}, TQ});
  l.push_back({"attn.v_copy", "reshape", TQ, Dt::Model, true, {}, TQ});
  l.push_back({"attn.scores", "baddbmm", SS, Dt::Model, false, "attn.residual", TQ});
  l.push_back({"attn.masked", "add", SS, Dt::Model, false, "attn.residual", kNone});
  l.push_back({"attn.softmax", "_softmax", SS, Dt::F32, true, "next_layer", SS});
  if (s.half) l.push_back({"attn.probs_half", "_to_copy", SS, Dt::Model, true, {}, kNone});
  l.push_back({"attn.pv", "bmm", TQ, Dt::Model, false, {}, SS});
  l.push_back({"attn.copy", "_merge_heads", TQ, Dt::Model, true, {}, kNone});
  l.push_back(linear("dense.out", TH, TQ, Sym::Q, Sym::H, false, {}));
  // dropout_add (p = 0): residual + out; kept by post_attention_layernorm [D]
  l.push_back({"attn.residual", "add", TH, Dt::Model, true, {}, kNone, kNone, Dt::Model, Dt::Model, "input"});
  layer_norm(l, kLn2);
  l.push_back(linear("fc1.out", TI, TH, Sym::H, Sym::I, true, {}));
  for (std::string_view t : {"act.t1", "act.t2", "act.t3"})
    l.push_back({t, "bloom_gelu", TI, Dt::Model, false, "mlp.act", kNone});
  l.push_back({"mlp.act", "bloom_gelu", TI, Dt::Model, true, {}, TI});
  // GeLUFunction.backward recomputes tanh and its derivative in Python ops: three [T, i]
  // temporaries next to its output [W][M]
  find_mut(l, "mlp.act")->backward_temps = 3;
  l.push_back(linear("fc2.out", TH, TI, Sym::I, Sym::H, false, {}));
  l.push_back({"layer.out", "add", TH, Dt::Model, false, "layer_out", kNone, kNone, Dt::Model, Dt::Model,
               "attn.residual"});
  if (s.half) find_mut(l, "attn.probs_half")->dies_after = {}, find_mut(l, "attn.softmax")->dies_after = {};
  // (softmax(dtype=float32) of the half scores makes an fp32 copy of them: step_lists' edit;
  // data/measurements/cpu-tensors.jsonl: bloom/full/bf16/gc/eager's _to_copy [2, 4, 64, 64] float32) [M]
  if (!s.full) edit_layernorm_lora(l, s.half);
  return l;
}

/// BioGptDecoderLayer [I]: pre-norm attention (q / k / v / out_proj with biases, the projections the
/// attention's locals until it returns), dropout, + residual; final_layer_norm, fc1 -> gelu -> fc2,
/// dropout, + residual. Attention dropout: the eager path keeps the noise and the dropped
/// probabilities in the model dtype; SDPA runs the CPU math path [M].
OpList biogpt_layer(const LayerSetup& s) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  layer_norm(l, kLn1);
  l.push_back(linear("q_proj.out", TQ, TH, Sym::H, Sym::Q, true, {}));
  l.push_back(linear("k_proj.out", TKV, TH, Sym::H, Sym::KV, true, {}));
  l.push_back(linear("v_proj.out", TKV, TH, Sym::H, Sym::KV, true, {}));
  l.push_back({"attn.out", "_scaled_dot_product_flash_attention", TQ, Dt::Model, true, {}, shape(Sym::T, Sym::QKV)});
  l.push_back({"attn.lse", "_scaled_dot_product_flash_attention", shape(Sym::B, Sym::A, Sym::S), Dt::F32, true, {},
               kNone});
  l.push_back(linear("out_proj.out", TH, TQ, Sym::Q, Sym::H, false, s.resid_dropout ? "" : "attn.residual"));
  if (s.resid_dropout) dropout(l, "attn.noise", "attn.dropped", "attn.residual");
  l.push_back({"attn.residual", "add", TH, Dt::Model, true, {}, kNone, kNone, Dt::Model, Dt::Model, "input"});
  layer_norm(l, kLn2);
  plain_mlp(l, s, s.resid_dropout ? "" : "layer.out");
  if (s.resid_dropout) dropout(l, "mlp.noise", "mlp.dropped", "layer.out");
  l.push_back({"layer.out", "add", TH, Dt::Model, false, "layer_out", kNone, kNone, Dt::Model, Dt::Model,
               "attn.residual"});
  const bool math = !s.eager && s.attn_dropout && !s.cuda;
  if (s.eager || math) {
    // the projections are strided views the attention copies: they die with its locals
    for (std::string_view n : {"q_proj.out", "k_proj.out", "v_proj.out"}) {
      TensorOp* t = find_mut(l, n);
      t->saved = false;
      t->dies_after = "out_proj.out";
    }
  }
  if (s.eager) {
    eager_attention(l, "v_proj.out", "out_proj.out");
    find_mut(l, "attn.softmax")->dtype = Dt::Model;  // softmax in the model dtype [I]
    insert_qk_copies(l);
    if (s.attn_dropout) eager_probs_dropout(l);
  } else if (math) {
    l.insert(position(l, "attn.lse") + 1, {"attn.copy", "clone", TQ, Dt::Model, true, {}, kNone});
    sdpa_math_with_dropout(l, s.half);
  }
  if (!s.full) edit_layernorm_lora(l, s.half);
  return l;
}

/// GPTNeoBlock [E] (eager only): ln_1, q / k / v projections (no bias; the attention's locals), _attn
/// in fp32 (q and k upcast, then copied contiguous for the matmul: kept), where(causal bias), + mask,
/// softmax (kept; its cast back to the model dtype kept by the PV matmul), the merged heads (a copy,
/// kept by out_proj), + residual (the attention output a local until the block returns); ln_2,
/// c_fc, gelu_new as its expression, c_proj, + residual. Local and global layers differ only in the
/// causal bias they read [M].
OpList gpt_neo_layer(const LayerSetup& s) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  layer_norm(l, kLn1);
  l.push_back(linear("q_proj.out", TQ, TH, Sym::H, Sym::Q, false, "out_proj.out", false));
  l.push_back(linear("k_proj.out", TKV, TH, Sym::H, Sym::KV, false, "out_proj.out", false));
  l.push_back(linear("v_proj.out", TKV, TH, Sym::H, Sym::KV, false, "out_proj.out", false));
  if (s.half) {
    l.push_back({"attn.q_f32", "_to_copy", TQ, Dt::F32, false, "out_proj.out", TQ});
    l.push_back({"attn.k_f32", "_to_copy", TKV, Dt::F32, false, "out_proj.out", TKV});
  }
  l.push_back({"attn.q_copy", "contiguous", TQ, Dt::F32, true, {}, TQ, kNone, Dt::Model, Dt::F32});
  l.push_back({"attn.k_copy", "contiguous", TKV, Dt::F32, true, {}, TKV, kNone, Dt::Model, Dt::F32});
  l.push_back({"attn.scores", "matmul", SS, Dt::F32, false, {}, kNone});
  l.push_back({"attn.masked", "where", SS, Dt::F32, false, {}, kNone});
  l.push_back({"attn.masked2", "add", SS, Dt::F32, false, {}, kNone});
  l.push_back({"attn.softmax", "_softmax", SS, Dt::F32, true, {}, SS, kNone, Dt::Model, Dt::F32});
  // .to(value.dtype) of the fp32 probabilities: its backward casts their gradient to fp32 [D: _to_copy]
  if (s.half) l.push_back({"attn.probs_half", "_to_copy", SS, Dt::Model, true, {}, SS, kNone, Dt::Model, Dt::F32});
  l.push_back({"attn.v_copy", "contiguous", TQ, Dt::Model, true, {}, kNone});
  l.push_back({"attn.pv", "matmul", TQ, Dt::Model, false, {}, SS});
  l.push_back({"attn.copy", "_merge_heads", TQ, Dt::Model, true, {}, kNone});
  l.push_back(linear("out_proj.out", TH, TQ, Sym::Q, Sym::H, false, "layer.out"));
  l.push_back({"attn.residual", "add", TH, Dt::Model, true, {}, kNone, kNone, Dt::Model, Dt::Model, "input"});
  layer_norm(l, kLn2);
  expression_mlp(l, {});
  l.push_back({"layer.out", "add", TH, Dt::Model, false, "layer_out", kNone, kNone, Dt::Model, Dt::Model,
               "attn.residual"});
  if (!s.full) edit_layernorm_lora(l, s.half);
  return l;
}

namespace {

/// GPT-J's apply_rotary_pos_emb on the rotated part of q or k [J]: sin and cos repeat_interleave'd
/// (kept by the muls), x * cos, rotate_every_two (neg of the odd half, stack), * sin, add; the
/// rotated part stays a local until the attention returns [M].
/// `table`: the dtype of sin / cos, and so of the products (CodeGen's stay fp32, promoting them).
void interleaved_rotary(OpList& l, bool k, Dt table = Dt::Model) {
  const Shape w = shape(Sym::T, k ? Sym::KR : Sym::QR);
  const Shape sc = shape(Sym::S, Sym::HeadDim);
  l.push_back({k ? "k.sin" : "q.sin", "repeat_interleave", sc, table, true, {}, kNone});
  l.push_back({k ? "k.cos" : "q.cos", "repeat_interleave", sc, table, true, {}, kNone});
  l.push_back({k ? "k.mul_cos" : "q.mul_cos", "mul", w, table, false, k ? "k.rot" : "q.rot", kNone});
  l.push_back({k ? "k.neg" : "q.neg", "neg", shape(Sym::T, k ? Sym::KRHalf : Sym::QRHalf), Dt::Model, false, {}, kNone});
  l.push_back({k ? "k.rotate" : "q.rotate", "stack", w, Dt::Model, false, k ? "k.mul_sin" : "q.mul_sin", kNone});
  l.push_back({k ? "k.mul_sin" : "q.mul_sin", "mul", w, table, false, k ? "k.rot" : "q.rot", kNone});
  l.push_back({k ? "k.rot" : "q.rot", "add", w, table, false, "out_proj.out", kNone});
}

}  // namespace

namespace {

/// The rest of GPT-J's block from the fp32 q / k copies on [J]: QK^T in fp32, the mask and the scale
/// (CodeGen adds the mask first), softmax, the PV matmul over a contiguous v, the heads merged by
/// `merge_op`, out_proj beside the gelu_new MLP on the same normed input, their sum + the residual.
void gptj_attention_and_mlp(OpList& l, const LayerSetup& s, bool mask_before_scale, std::string_view merge_op) {
  l.push_back({"attn.q_copy", "contiguous", TQ, Dt::F32, true, {}, TQ, kNone, Dt::Model, Dt::F32});
  l.push_back({"attn.k_copy", "contiguous", TQ, Dt::F32, true, {}, TQ, kNone, Dt::Model, Dt::F32});
  l.push_back({"attn.scores", "matmul", SS, Dt::F32, false, {}, kNone});
  const TensorOp scaled{"attn.scaled", "div", SS, Dt::F32, false, {}, kNone};
  const TensorOp masked{"attn.masked", "add", SS, Dt::F32, false, {}, kNone};
  l.push_back(mask_before_scale ? masked : scaled);
  l.push_back(mask_before_scale ? scaled : masked);
  l.push_back({"attn.softmax", "_softmax", SS, Dt::F32, true, {}, SS, kNone, Dt::Model, Dt::F32});
  // .to(value.dtype) of the fp32 probabilities: its backward casts their gradient to fp32 [D: _to_copy]
  if (s.half) l.push_back({"attn.probs_half", "_to_copy", SS, Dt::Model, true, {}, SS, kNone, Dt::Model, Dt::F32});
  l.push_back({"attn.v_copy", "contiguous", TQ, Dt::Model, true, {}, kNone});
  l.push_back({"attn.pv", "matmul", TQ, Dt::Model, false, {}, SS});
  l.push_back({"attn.copy", merge_op, TQ, Dt::Model, true, {}, kNone});
  l.push_back(linear("out_proj.out", TH, TQ, Sym::Q, Sym::H, false, "layer.out", false));
  find_mut(l, "out_proj.out")->branch_of = "block.sum";
  find_mut(l, "out_proj.out")->residual_of = "ln1.out";
  expression_mlp(l, "layer.out");
  l.push_back({"block.sum", "add", TH, Dt::Model, false, {}, kNone});
  l.push_back({"layer.out", "add", TH, Dt::Model, false, "layer_out", kNone, kNone, Dt::Model, Dt::Model, "input"});
  if (!s.full) edit_layernorm_lora(l, s.half);
}

}  // namespace

/// GPTJBlock [J] (eager only): ln_1 read by the attention and the MLP in parallel; out = attn + mlp
/// + x. The attention: q / k / v projections (locals), the sin / cos table gathered for the
/// positions (locals), interleaved rotary on the first rotary_dim of each head, cat with the rest,
/// _attn in fp32 on contiguous copies of q and k (kept), / scale, + mask, softmax (kept; its cast
/// back kept by the PV matmul in half precision), a contiguous copy of v (kept), the merged heads (a
/// copy, kept by out_proj) [M].
OpList gptj_layer(const LayerSetup& s) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  layer_norm(l, kLn1);
  for (std::string_view n : {"q_proj.out", "k_proj.out", "v_proj.out"})
    l.push_back(linear(n, TQ, TH, Sym::H, Sym::Q, false, "out_proj.out", false));
  // position_ids is [1, s] (GPTJModel.forward: arange(s).unsqueeze(0)), so the table repeats once
  l.push_back({"rotary.table", "repeat", shape(Sym::Pos, Sym::HeadDim), Dt::F32, false, "out_proj.out", kNone});
  l.push_back({"rotary.ids", "repeat", shape(Sym::S, Sym::HeadDim), Dt::I64, false, "out_proj.out", kNone});
  if (s.half) {  // gather(...).to(key.dtype): the fp32 gather dies once cast; sin / cos view the copy
    l.push_back({"rotary.gather", "gather", shape(Sym::S, Sym::HeadDim), Dt::F32, false, {}, kNone});
    l.push_back({"rotary.sincos", "_to_copy", shape(Sym::S, Sym::HeadDim), Dt::Model, false, "out_proj.out", kNone});
  } else {
    l.push_back({"rotary.sincos", "gather", shape(Sym::S, Sym::HeadDim), Dt::F32, false, "out_proj.out", kNone});
  }
  interleaved_rotary(l, true);
  interleaved_rotary(l, false);
  l.push_back({"k.embed", "cat", TQ, Dt::Model, false, "out_proj.out", TQ});
  l.push_back({"q.embed", "cat", TQ, Dt::Model, false, "out_proj.out", TQ});
  if (s.half) {
    l.push_back({"attn.q_f32", "_to_copy", TQ, Dt::F32, false, "out_proj.out", TQ});
    l.push_back({"attn.k_f32", "_to_copy", TQ, Dt::F32, false, "out_proj.out", TQ});
  }
  gptj_attention_and_mlp(l, s, false, "_merge_heads");
  return l;
}

/// CodeGenBlock [X]: GPT-J's block with one fused qkv_proj (no bias) whose output is split into
/// mp_num = 4 groups; _split_heads' reshape merges the groups with the heads of each, a view only
/// when a group holds one head (4 heads), else a copy of q, k and v each (the attention's locals).
/// The sin / cos rows are indexed from the fp32 buffer and never cast, so in half precision the
/// rotary products, the rotated q / k and their cat with the pass-through part are fp32 by type
/// promotion, and _attn's .to(float32) copies nothing; the mask is added before the division by
/// the scale [M] (tensor log of codegen/full/bf16/gc/eager).
OpList codegen_layer(const LayerSetup& s) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  layer_norm(l, kLn1);
  l.push_back(linear("qkv.out", shape(Sym::T, Sym::QKV), TH, Sym::H, Sym::QKV, false, "out_proj.out", false));
  if (s.heads_split_copied)
    for (std::string_view n : {"q.split", "k.split", "v.split"})
      l.push_back({n, "reshape", TQ, Dt::Model, false, "out_proj.out", kNone});
  l.push_back({"rotary.sincos", "index", shape(Sym::S, Sym::HeadDim), Dt::F32, false, "out_proj.out", kNone});
  interleaved_rotary(l, true, Dt::F32);
  interleaved_rotary(l, false, Dt::F32);
  l.push_back({"k.embed", "cat", TQ, Dt::F32, false, "out_proj.out", TQ});
  l.push_back({"q.embed", "cat", TQ, Dt::F32, false, "out_proj.out", TQ});
  gptj_attention_and_mlp(l, s, true, "contiguous");
  return l;
}

/// CodeGenModel [X]: wte (saves the indices only [D]) and the eager causal mask [b, 1, s, s] in the
/// model dtype, read by every layer; no rotary table outside the layers. (PyTorch embeds first; the
/// list ends with the embedding, the tensor it hands to layer 0.)
OpList codegen_embedding(const LayerSetup& s) {
  OpList l;
  if (s.eager)
    l.push_back(shared_mask());
  l.push_back({"embed.out", "embedding", TH, Dt::Model, false, "layer_out", kNone, shape(Sym::V, Sym::H)});
  return l;
}


/// GPTNeoXLayer with use_parallel_residual [N]: attention(ln1(x)) and mlp(ln2(x)) both read the
/// layer input; out = mlp + attn + x. The attention output stays alive as a local until the
/// layer returns [M].
OpList gpt_neox_layer(const LayerSetup& s) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});  // both norms save it [D]
  layer_norm(l, kLn1);
  // query_key_value, viewed [b, s, heads, 3d] and chunked: v is a view of it, kept by SDPA [N]
  l.push_back(linear("qkv.out", shape(Sym::T, Sym::QKV), TH, Sym::H, Sym::QKV, true, {}));
  partial_rotary(l, false);
  partial_rotary(l, true);
  l.push_back({"q.embed", "cat", TQ, Dt::Model, true, {}, shape(Sym::T, Sym::Q)});
  l.push_back({"k.embed", "cat", TKV, Dt::Model, true, {}, shape(Sym::T, Sym::KV)});
  sdpa_with_copy(l);
  l.push_back(linear("dense.out", TH, TQ, Sym::Q, Sym::H, false, "layer.out"));
  // the attention branch runs second in backward: it reads the layer's incoming gradient, and the
  // MLP branch's input gradient waits at the input
  find_mut(l, "dense.out")->branch_of = "mlp.sum";
  find_mut(l, "dense.out")->residual_of = "input";
  layer_norm(l, kLn2);
  plain_mlp(l, s, "layer.out");
  l.push_back({"mlp.sum", "add", TH, Dt::Model, false, {}, kNone});
  l.push_back({"layer.out", "add", TH, Dt::Model, false, "layer_out", kNone, kNone, Dt::Model, Dt::Model, "input"});
  if (s.eager) eager_attention(l, "qkv.out", "dense.out");
  // the PV matmul's second operand, as Phi's (tuning case gpt_neox/h128-L2-V1024/full/fp32/gc/eager/b2s512/adamw)
  if (s.eager) find_mut(l, "attn.v_copy")->grad_input = kNone;
  if (s.eager && s.one_sequence && !s.checkpointing) v_view_of_fused(l);
  if (s.half) {
    // softmax(dtype=float32).to(query.dtype): the half copy is what the PV matmul keeps [N][D]
    if (find_op(l, "attn.softmax")) {
      l.insert(position(l, "attn.softmax") + 1,
               {"attn.probs_half", "_to_copy", SS, Dt::Model, true, {}, kNone});
      // F.softmax(dtype=float32) of the half scores: an fp32 copy first, the backward in fp32
      // (tuning case gpt_neox/h128-L3-V2048/full/bf16/gc/eager/b1s768/adamw)
      edit_softmax_of_half_scores(l, s.softmax_half_to_float);
    }
  }
  if (!s.full) edit_layernorm_lora(l, s.half);
  return l;
}

/// FalconModel [F]: word_embeddings, rotary cos / sin [1, s, head_dim]; eager attention reads one
/// [b, 1, s, s] mask built for all layers, alive until the decoder stack returns [M].
OpList falcon_embedding(const LayerSetup& s) {
  OpList l;
  l.push_back({"rotary.cos", "cos", shape(Sym::S, Sym::HeadDim), Dt::Model, true, {}, kNone});
  l.push_back({"rotary.sin", "sin", shape(Sym::S, Sym::HeadDim), Dt::Model, true, {}, kNone});
  if (s.eager)
    l.push_back(shared_mask());
  l.push_back({"embed.out", "embedding", TH, Dt::Model, false, "layer_out", kNone, shape(Sym::V, Sym::H)});
  return l;
}

/// GPTNeoXModel [N]: embed_in (saves the indices only [D]); the rotary cos / sin [1, s, rotary
/// dims] in the model dtype, kept by every layer's muls (head_dim holds the rotary dims); eager
/// attention reads one [b, 1, s, s] mask (create_causal_mask), as Phi's and StableLM's.
/// In the model's order: the lookup (handed on: the entry dying at layer_out), the position ids and
/// mask checks, the mask, the rotary tables (GPTNeoXModel.forward, as LlamaModel's [N]).
OpList gpt_neox_embedding(const LayerSetup& s) {
  OpList l;
  l.push_back({"embed.out", "embedding", TH, Dt::Model, false, "layer_out", kNone, shape(Sym::V, Sym::H)});
  push_position_ids(l);
  push_packed_sequence_check(l);
  if (s.eager) push_eager_mask_setup(l), l.push_back(shared_mask("where"));  // create_causal_mask's eager mask [N]
  push_rotary_tables(l, s);
  return l;
}

/// final_layer_norm, the untied head (embed_out) and ForCausalLMLoss, as the Llama head:
/// logits (upcast in half precision), shifted labels, log_softmax (kept), nll_loss [D].
OpList layernorm_head(const LayerSetup& s) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  layer_norm(l, kLnF);
  if (!s.full) {
    // a frozen lm_head keeps nothing of its input (its input gradient needs the weight only) [D],
    // so the final norm's output is only the model output's last_hidden_state, dropped once the
    // loss is computed [M]
    for (TensorOp& t : l) t.weight = kNone, t.bias = kNone;
    find_mut(l, "ln_f.out")->saved = false;
    find_mut(l, "ln_f.out")->dies_after = "loss.total_weight";
  }
  l.push_back({"logits", "linear", shape(Sym::T, Sym::V), Dt::Model, false, "loss.total_weight", TH,
               s.full ? shape(Sym::V, Sym::H) : kNone});
  if (s.full && s.head_bias) find_mut(l, "logits")->bias = shape(Sym::V);
  // CodeGen / GPT-Neo cast the logits to fp32 inside the model: the model output holds the fp32
  // copy, the half logits die at the cast
  if (s.half && s.logits_fp32_in_model) find_mut(l, "logits")->dies_after = "loss.logits_fp32";
  if (s.half)
    l.push_back({"loss.logits_fp32", "_to_copy", shape(Sym::T, Sym::V), Dt::F32, false,
                 "loss.total_weight", shape(Sym::T, Sym::V)});
  push_loss(l, s);
  return l;
}

void falcon_eager_attention(OpList& l);

/// FalconDecoderLayer, new_decoder_architecture with two norms [F]: ln_attn and ln_mlp both read
/// the input; out = (mlp += attn) + x (the in-place add allocates nothing). ln_mlp is computed
/// first in the forward; the list places it where autograd's backward meets it (after the
/// attention branch's output), as the sums of the two branches happen at the input.
OpList falcon_layer(const LayerSetup& s) {
  OpList l;
  l.push_back({"input", "carried", TH, Dt::Model, true, {}, kNone});
  layer_norm(l, kLn1);
  l.push_back(linear("qkv.out", shape(Sym::T, Sym::QKV), TH, Sym::H, Sym::QKV, false, "dense.out", false));
  // _split_heads [F]: key / value picked with an index list (a copy [b, s, kv, 1, d]), broadcast
  // to every query head and flattened (copies [b, s, heads, d]); q's flatten of a strided view
  // is a copy too [M]
  const Shape tkv = shape(Sym::T, Sym::KV);
  l.push_back({"attn.k_index", "tensor", shape(Sym::One), Dt::I64, false, "attn.k_gather", kNone});
  l.push_back({"attn.k_gather", "index", tkv, Dt::Model, false, "attn.v_flat", tkv});
  l.push_back({"attn.v_index", "tensor", shape(Sym::One), Dt::I64, false, "attn.v_gather", kNone});
  l.push_back({"attn.v_gather", "index", tkv, Dt::Model, false, "attn.v_flat", tkv});
  l.push_back({"attn.q_flat", "reshape", TQ, Dt::Model, false, "k.rot", TQ});
  l.push_back({"attn.k_flat", "reshape", TQ, Dt::Model, false, "k.rot", TQ});
  l.push_back({"attn.v_flat", "reshape", TQ, Dt::Model, true, {}, TQ});
  partial_rotary(l, false, true);
  partial_rotary(l, true, true);
  // SDPA: the attention mask is built inside every layer, and the kernel keeps it with q, k, v,
  // its output and logsumexp [M]; the output's layout makes the reshape for dense a view
  l.push_back({"attn.mask", "masked_fill", shape(Sym::B, Sym::S, Sym::S), Dt::Model, true, {}, kNone});
  l.push_back({"attn.out", "_scaled_dot_product_flash_attention", TQ, Dt::Model, true, {}, TQ});
  l.push_back({"attn.lse", "_scaled_dot_product_flash_attention", shape(Sym::B, Sym::A, Sym::S), Dt::F32, true, {},
               kNone});
  l.push_back(linear("dense.out", TH, TQ, Sym::Q, Sym::H, false, "layer.out", false));
  find_mut(l, "dense.out")->branch_of = "layer.out";
  find_mut(l, "dense.out")->residual_of = "input";
  layer_norm(l, kLn2);
  plain_mlp(l, s, "layer.out", false);
  l.push_back({"layer.out", "add", TH, Dt::Model, false, "layer_out", kNone, kNone, Dt::Model, Dt::Model, "input"});
  if (s.eager) falcon_eager_attention(l);
  if (!s.full) edit_layernorm_lora(l, s.half);
  return l;
}

/// FalconAttention's eager path (no alibi) [F]: q @ k^T on contiguous copies of the rotated q and
/// k (kept by the matmul), /= sqrt(d) in place, + the model's mask, softmax in the model dtype
/// (kept), @ a contiguous copy of v (kept), the merge of heads (a copy, kept by dense); the rotated
/// q, k and v then die with the attention's locals [M].
void falcon_eager_attention(OpList& l) {
  auto at = l.erase(position(l, "attn.mask"), position(l, "attn.lse") + 1);
  OpList e;
  e.push_back({"attn.q_copy", "contiguous", TQ, Dt::Model, true, {}, TQ});
  e.push_back({"attn.k_copy", "contiguous", TQ, Dt::Model, true, {}, TQ});
  e.push_back({"attn.scores", "matmul", SS, Dt::Model, false, "attn.softmax", TQ});
  e.push_back({"attn.masked", "add", SS, Dt::Model, false, {}, kNone});
  // the layer returns the softmax output (attention weights): under checkpointing, where nothing
  // saves it, the model's loop holds it until the next layer has returned [F][M]
  e.push_back({"attn.softmax", "_softmax", SS, Dt::Model, true, "next_layer", SS});
  // v's copy is the PV matmul's second operand: its backward makes v's gradient beside the
  // probabilities', which softmax's backward reads, so the chain hands the probabilities' gradient
  // on through this entry (v's [T, q] gradient is not counted) [D: bmm] (peak dump of tuning case
  // falcon/h512-L4-V1024/full/fp32/nogc/eager/b3s128/adamw: at _softmax_backward_data the
  // probabilities' gradient and softmax's own, both [b, heads, s, s], beside the saved output)
  e.push_back({"attn.v_copy", "contiguous", TQ, Dt::Model, true, {}, kNone});
  e.push_back({"attn.pv", "matmul", TQ, Dt::Model, false, {}, SS});
  e.push_back({"attn.copy", "reshape", TQ, Dt::Model, true, {}, kNone});
  l.insert(at, e.begin(), e.end());
  for (std::string_view n : {"q.rot", "k.rot", "attn.v_flat"}) {
    TensorOp* t = find_mut(l, n);
    t->saved = false;
    t->dies_after = "dense.out";
  }
}

/// The embedding dropout [H]: its noise and output, the first layer's input. LoRA without
/// checkpointing: the frozen embedding's output needs no gradient, so autograd records nothing
/// and the noise dies with the mul (PEFT's enable_input_require_grads comes with checkpointing).
void add_embedding_dropout(OpList& l, const LayerSetup& s) {
  const bool records = s.full || s.checkpointing;
  l.push_back({"embed.noise", "bernoulli_", TH, Dt::Model, records, records ? std::string_view{} : "embed.dropped", kNone});
  l.push_back({"embed.dropped", "mul", TH, Dt::Model, false, "layer_out", records ? TH : kNone});
}

const FamilyLists kGptNeoxLists{&gpt_neox_layer, &gpt_neox_embedding, &layernorm_head,
                                &edit_layernorm_input_needs_no_grad};
/// LoRA under checkpointing: Transformers' enable_input_require_grads (a forward hook calling
/// requires_grad_() on the frozen embedding's output) makes that output a leaf needing a gradient;
/// its AccumulateGrad node holds it until the backward has run through it, after every layer [D].
/// Where the first layer reads something else (positions added, dropout) it is a tensor of its own
/// alive through the step (peak dumps of tuning cases gpt_bigcode/h192-L3-V4096/lora-r16-all/bf16/
/// gc/sdpa/b2s256/adamw at the loss backward and gpt_neo/h256-L4-V2048/lora-r16-mlp/bf16/gc/eager/
/// b3s192/adamw in the recomputation: a bf16 `embedding` [b, s, h] beside the dropout's output).
namespace {
void embedding_leaf_until_backward_end(OpList& l, const LayerSetup& s) {
  if (!s.full && s.checkpointing) find_mut(l, "embed.out")->dies_after = "backward_end";
}
}  // namespace

/// PhiModel [H]: embed_tokens, embed_dropout (p > 0: noise and output), rotary cos / sin over the
/// rotary dims; eager attention reads one [b, 1, s, s] mask in the model dtype built for all layers
/// (create_causal_mask), alive until the decoder stack returns and kept by every checkpoint (peak
/// dump of tuning case phi/h128-L2-V1024/lora-r16-all/bf16/gc/eager/b2s512/adamw: a bf16
/// (2, 1, 512, 512) where alive at the recomputed layer's backward).
OpList phi_embedding(const LayerSetup& s) {
  OpList l = gpt_neox_embedding(s);  // (with the eager mask)
  if (s.embd_dropout) {
    // PhiModel.forward drops out the embeddings after the mask, before the rotary tables
    find_mut(l, "embed.out")->dies_after = "embed.dropped";
    OpList dropout;
    add_embedding_dropout(dropout, s);
    l.insert(position(l, "rotary.position_float"), dropout.begin(), dropout.end());
    embedding_leaf_until_backward_end(l, s);
  }
  return l;
}

const FamilyLists kStarcoder2Lists{&starcoder2_layer, &embedding, &layernorm_head,
                                  &edit_layernorm_input_needs_no_grad};
const FamilyLists kStableLmLists{&stablelm_layer, &gpt_neox_embedding, &layernorm_head,
                                &edit_layernorm_input_needs_no_grad};
/// OPTDecoder [O]: embed_tokens and the learned positions (OPTLearnedPositionalEmbedding) stay
/// alive as the decoder's locals until it returns; their sum is the first layer's input; eager
/// attention reads one [b, 1, s, s] mask built for all layers (under checkpointing each checkpoint
/// keeps it until its backward: the tracker's trace of opt/h128-L2-V1024/full/bf16/gc/eager/b4s512
/// holds it at the peak in the backward, as the Llama lists have it).
/// In OPTModel.forward's order: the lookup; with no attention_mask, position_attention_mask = ones
/// [b, s] fp32 (a local until it returns), cumsum, (x * mask - 1).long() (position_ids, a local; the
/// fp32 steps die at the next one); create_causal_mask (the eager mask; memfit validate --tensors
/// finds no packed-sequence check here); OPTLearnedPositionalEmbedding: position_ids + 2, saved by a trained table's
/// embedding [D] (released by its backward), else dead once looked up. Checked against the real
/// trace of opt/full/fp32/nogc/sdpa ([.alloc9-missing]) and memfit validate --tensors.
OpList opt_embedding(const LayerSetup& s) {
  OpList l;
  const Shape BS = shape(Sym::B, Sym::S);
  l.push_back({"embed.out", "embedding", TH, Dt::Model, false, "decoder_end", kNone, shape(Sym::V, Sym::H)});
  l.push_back({"position.mask_ones", "ones", BS, Dt::F32, false, "decoder_end", kNone});
  l.push_back({"position.cumsum", "cumsum", BS, Dt::F32, false, "position.ids", kNone});
  l.push_back({"position.mul", "mul", BS, Dt::F32, false, {}, kNone});
  l.push_back({"position.sub", "sub", BS, Dt::F32, false, {}, kNone});
  l.push_back({"position.ids", "_to_copy", BS, Dt::I64, false, "decoder_end", kNone});
  l.back().checkpoint_input = true;  // an argument of every layer: each checkpoint keeps it
  if (s.eager) push_eager_mask_setup(l), l.push_back(shared_mask("where"));
  l.push_back({"position.offset", "add", BS, Dt::I64, s.full, {}, kNone});
  if (s.full) l.back().released_by = "positions.out";
  l.push_back({"positions.out", "embedding", TH, Dt::Model, false, "decoder_end", kNone, shape(Sym::Pos, Sym::H)});
  l.push_back({"embed.sum", "add", TH, Dt::Model, false, "layer_out", kNone});
  embedding_leaf_until_backward_end(l, s);
  return l;
}

/// GPT2Model [G]: wte and wpe outputs stay alive as the model's locals until it returns; their sum,
/// through the embedding dropout, is the first layer's input; eager attention reads one
/// [b, 1, s, s] mask built for all layers.
OpList gpt2_embedding(const LayerSetup& s) {
  OpList l;
  l.push_back({"embed.out", "embedding", TH, Dt::Model, false, "decoder_end", kNone, shape(Sym::V, Sym::H)});
  l.push_back({"positions.out", "embedding", shape(Sym::S, Sym::H), Dt::Model, false, "decoder_end", kNone,
               shape(Sym::Pos, Sym::H)});
  if (s.eager)
    l.push_back(shared_mask());
  l.push_back({"embed.sum", "add", TH, Dt::Model, false, s.embd_dropout ? "embed.dropped" : "layer_out", kNone});
  if (s.embd_dropout) add_embedding_dropout(l, s);
  embedding_leaf_until_backward_end(l, s);
  return l;
}

/// BloomModel [W]: word_embeddings, word_embeddings_layernorm (saves its input), the alibi
/// [b * heads, 1, s] and the [b, 1, s, s] mask, both alive until the decoder stack returns.
OpList bloom_embedding(const LayerSetup& s) {
  OpList l;
  l.push_back({"embed.out", "embedding", TH, Dt::Model, true, {}, kNone, shape(Sym::V, Sym::H)});
  layer_norm(l, {"embed_ln.out", "embed_ln.mean", "embed_ln.rstd"});
  find_mut(l, "embed_ln.out")->saved = false;
  find_mut(l, "embed_ln.out")->dies_after = "layer_out";
  if (!s.full) find_mut(l, "embed_ln.out")->weight = kNone, find_mut(l, "embed_ln.out")->bias = kNone;
  if (!s.full && !s.checkpointing) {
    // LoRA without checkpointing: nothing before the first adapter needs a gradient, so the
    // frozen layer norm records nothing [D] (PEFT's enable_input_require_grads comes with checkpointing)
    find_mut(l, "embed.out")->saved = false;
    find_mut(l, "embed.out")->dies_after = "embed_ln.out";
    for (std::string_view n : {"embed_ln.mean", "embed_ln.rstd"}) find_mut(l, n)->saved = false;
  }
  // the last entry is what the list hands on: the layer norm's output, moved to the end
  TensorOp out = *find_op(l, "embed_ln.out");
  l.erase(position(l, "embed_ln.out"));
  l.push_back({"alibi", "build_alibi_tensor", shape(Sym::B, Sym::A, Sym::S), Dt::Model, false, "decoder_end", kNone});
  l.push_back(shared_mask());
  l.push_back(out);
  return l;
}

/// BioGptModel [I]: embed_tokens scaled by sqrt(d) (the scaled embeddings and the learned positions
/// are the model's locals until it returns), their sum through dropout is the first layer's input.
OpList biogpt_embedding(const LayerSetup& s) {
  OpList l;
  l.push_back({"embed.out", "embedding", TH, Dt::Model, false, {}, kNone, shape(Sym::V, Sym::H)});
  l.push_back({"embed.scaled", "mul", TH, Dt::Model, false, "decoder_end", kNone});
  l.push_back({"positions.out", "embedding", shape(Sym::S, Sym::H), Dt::Model, false, "decoder_end", kNone,
               shape(Sym::Pos, Sym::H)});
  if (s.eager)
    l.push_back(shared_mask());
  l.push_back({"embed.sum", "add", TH, Dt::Model, false, s.embd_dropout ? "embed.dropped" : "layer_out", kNone});
  if (s.embd_dropout) add_embedding_dropout(l, s);
  embedding_leaf_until_backward_end(l, s);
  return l;
}

/// GPT2Model.forward / GPTBigCodeModel.forward [G]: wte, position_ids (arange + past length), then
/// wpe and the sum (GPT-BigCode: create_causal_mask first), create_causal_mask's packed-sequence
/// check and eager mask (GPT-2: after the sum), the dropout. position_ids is what wpe's embedding
/// saves when wpe is trained [D: embedding saves its indices] (released by its backward), else the
/// model's local until it returns. Checked against the real trace of gpt2/full/fp32/nogc/sdpa
/// ([.alloc9-missing]) and memfit validate --tensors.
OpList gpt2_model_embedding(const LayerSetup& s, bool mask_first) {
  OpList l;
  l.push_back({"embed.out", "embedding", TH, Dt::Model, false, "decoder_end", kNone, shape(Sym::V, Sym::H)});
  push_position_ids(l);
  TensorOp* ids = find_mut(l, "position.ids");
  ids->checkpoint_input = false;
  if (s.full) ids->saved = true, ids->released_by = "positions.out";
  auto masks = [&] {
    push_packed_sequence_check(l);
    if (s.eager) push_eager_mask_setup(l), l.push_back(shared_mask("where"));
  };
  if (mask_first) masks();
  l.push_back({"positions.out", "embedding", shape(Sym::S, Sym::H), Dt::Model, false, "decoder_end", kNone,
               shape(Sym::Pos, Sym::H)});
  l.push_back({"embed.sum", "add", TH, Dt::Model, false, s.embd_dropout ? "embed.dropped" : "layer_out", kNone});
  if (!mask_first) masks();
  if (s.embd_dropout) add_embedding_dropout(l, s);
  embedding_leaf_until_backward_end(l, s);
  return l;
}
OpList gpt2_model_embedding_gpt2(const LayerSetup& s) { return gpt2_model_embedding(s, false); }
OpList gpt2_model_embedding_bigcode(const LayerSetup& s) { return gpt2_model_embedding(s, true); }

/// GPTNeoModel [E]: wte and wpe outputs (the model's locals until it returns), their sum the first
/// layer's input; one [b, 1, s, s] mask for all layers.
OpList gpt_neo_embedding(const LayerSetup& s) {
  OpList l = gpt2_embedding(s);
  return l;
}

const FamilyLists kGptjLists{&gptj_layer, &falcon_embedding, &layernorm_head, &edit_layernorm_input_needs_no_grad};
const FamilyLists kCodeGenLists{&codegen_layer, &codegen_embedding, &layernorm_head,
                                 &edit_layernorm_input_needs_no_grad};
const FamilyLists kGptNeoLists{&gpt_neo_layer, &gpt_neo_embedding, &layernorm_head, &edit_layernorm_input_needs_no_grad};
const FamilyLists kBioGptLists{&biogpt_layer, &biogpt_embedding, &layernorm_head, &edit_layernorm_input_needs_no_grad};
const FamilyLists kBloomLists{&bloom_layer, &bloom_embedding, &layernorm_head, &edit_layernorm_input_needs_no_grad};
const FamilyLists kGpt2Lists{&gpt2_layer, &gpt2_model_embedding_gpt2, &layernorm_head,
                             &edit_layernorm_input_needs_no_grad};
const FamilyLists kGptBigCodeLists{&gpt_bigcode_layer, &gpt2_model_embedding_bigcode, &layernorm_head,
                                   &edit_layernorm_input_needs_no_grad};
const FamilyLists kOptLists{&opt_layer, &opt_embedding, &layernorm_head, &edit_layernorm_input_needs_no_grad};
const FamilyLists kPhiLists{&phi_layer, &phi_embedding, &layernorm_head, &edit_layernorm_input_needs_no_grad};
const FamilyLists kFalconLists{&falcon_layer, &falcon_embedding, &layernorm_head, &edit_layernorm_input_needs_no_grad};

namespace {

/// The entry names LoRA gives one adapted Linear [P].
struct LoraNames {
  std::string_view out, base, in, a, b, scaled, sum;
};
constexpr LoraNames kLoraNames[] = {
    {"qkv.out", "qkv.base", "qkv.lora_in", "qkv.lora_A", "qkv.lora_B", "qkv.lora_scaled", "qkv.lora_sum"},
    {"q_proj.out", "q_proj.base", "q.lora_in", "q.lora_A", "q.lora_B", "q.lora_scaled", "q.lora_sum"},
    {"k_proj.out", "k_proj.base", "k.lora_in", "k.lora_A", "k.lora_B", "k.lora_scaled", "k.lora_sum"},
    {"v_proj.out", "v_proj.base", "v.lora_in", "v.lora_A", "v.lora_B", "v.lora_scaled", "v.lora_sum"},
    {"o_proj.out", "o_proj.base", "o.lora_in", "o.lora_A", "o.lora_B", "o.lora_scaled", "o.lora_sum"},
    {"out_proj.out", "out_proj.base", "out.lora_in", "out.lora_A", "out.lora_B", "out.lora_scaled", "out.lora_sum"},
    {"dense.out", "dense.base", "dense.lora_in", "dense.lora_A", "dense.lora_B", "dense.lora_scaled", "dense.lora_sum"},
    {"gate_proj.out", "gate_proj.base", "gate.lora_in", "gate.lora_A", "gate.lora_B", "gate.lora_scaled", "gate.lora_sum"},
    {"up_proj.out", "up_proj.base", "up.lora_in", "up.lora_A", "up.lora_B", "up.lora_scaled", "up.lora_sum"},
    {"down_proj.out", "down_proj.base", "down.lora_in", "down.lora_A", "down.lora_B", "down.lora_scaled", "down.lora_sum"},
    {"fc1.out", "fc1.base", "fc1.lora_in", "fc1.lora_A", "fc1.lora_B", "fc1.lora_scaled", "fc1.lora_sum"},
    {"fc2.out", "fc2.base", "fc2.lora_in", "fc2.lora_A", "fc2.lora_B", "fc2.lora_scaled", "fc2.lora_sum"},
};

/// The entry whose tensor a Linear reads.
std::string_view linear_input(const OpList& l, std::string_view out) {
  if (out == "qkv.out" || out == "q_proj.out" || out == "k_proj.out" || out == "v_proj.out") return "ln1.out";
  if (out == "dense.out" || out == "o_proj.out" || out == "out_proj.out") return find_op(l, "attn.copy") ? "attn.copy" : "attn.out";
  if (out == "fc1.out" || out == "gate_proj.out" || out == "up_proj.out") return find_op(l, "ln2.out") ? "ln2.out" : "ln1.out";
  if (out == "down_proj.out") return "mlp.mul";
  return "mlp.act";
}

/// One adapted Linear: the frozen base product, lora_A (saves its input, in the adapter dtype),
/// lora_B, the scaled adapter output, the sum (fp32 by type promotion in half precision, then cast
/// back) [P]. The sum keeps the base output's name, lifetime and consumers.
void adapt_linear(OpList& l, const LoraNames& n, bool half, std::string_view input) {
  auto it = position(l, n.out);
  TensorOp result = *it;
  const Shape out = it->shape, in = it->grad_input;
  const Sym in_w = in.f[1], out_w = out.f[1];
  it->name = n.base;
  it->saved = false;
  it->dies_after = half ? n.sum : n.out;
  it->weight = kNone;
  it->bias = kNone;
  // (the adapter and the frozen base both read the sum's gradient; the chain runs them one after
  // the other, as the Llama lists do)
  it->branch_of = {};
  it->residual_of = {};
  (void)input;
  OpList e;
  if (half) {
    e.push_back({n.in, "_to_copy", in, Dt::F32, true, {}, in});
    e.back().released_by = n.a;  // kept by lora_A: released once lora_A's backward has run, as Llama's [D]
  }
  e.push_back({n.a, "linear", shape(Sym::T, Sym::R), Dt::Adapter, true, {}, in, shape(in_w, Sym::R), Dt::Adapter,
               Dt::Adapter});
  e.push_back({n.b, "linear", out, Dt::Adapter, false, n.scaled, shape(Sym::T, Sym::R), shape(Sym::R, out_w),
               Dt::Adapter, Dt::Adapter});
  // `* scaling` saves nothing; its backward scales the gradient into a new tensor in the adapter
  // dtype, the one lora_B's backward reads (as Llama's) [D: mul]
  e.push_back({n.scaled, "mul", out, Dt::Adapter, false, half ? n.sum : n.out, out, kNone, Dt::Model, Dt::Adapter});
  // result + adapter: add hands its gradient to both operands [D: add]; the frozen base's part is
  // cast to the base output's dtype and waits at the base entry while the adapter's chain runs
  // (under checkpointing through the recomputation lora_B's backward starts: peak dump of tuning
  // case stablelm/h384-L2-V1024/lora-r16-all/bf16/gc/eager/b4s128/adamw/gas2, a bf16 [T, h]
  // _to_copy beside the fp32 scaled gradient), as the Llama lists do
  if (half) e.push_back({n.sum, "add", out, Dt::F32, false, {}, kNone, kNone, Dt::Model, Dt::Model, n.base});
  result.op = half ? "_to_copy" : "add";
  result.weight = kNone;
  result.bias = kNone;
  result.grad_input = out;
  if (half) result.grad_dtype = Dt::F32;  // the cast back's backward: the gradient in fp32 [D: _to_copy]
  e.push_back(result);
  l.insert(position(l, n.base) + 1, e.begin(), e.end());
}

}  // namespace

void edit_layernorm_lora(OpList& l, bool half) {
  // frozen norms: no weight or bias gradients (LayerNorm's backward needs no normalised copy) [D]
  for (TensorOp& t : l) t.weight = kNone, t.bias = kNone;
  for (const LoraNames& n : kLoraNames) {
    if (!find_op(l, n.out)) continue;
    const std::string_view input = linear_input(l, n.out);
    adapt_linear(l, n, half, input);
    // in half precision lora_A keeps its own fp32 cast: a Linear's half input stays only if its
    // own op saves it (relu its output) [P][D]
    TensorOp* in = find_mut(l, input);
    const bool kept_by_own_op = in && (in->op == "relu" || in->op.starts_with("_scaled_dot_product"));
    if (half && in && !kept_by_own_op) in->saved = false, in->dies_after = n.out;
    // in fp32 the frozen Linear keeps nothing: a tensor its backward released (Llama's mlp.mul) is
    // kept by lora_A instead, released once lora_A's backward has run [D]
    if (!half && in && in->released_by == n.out) in->released_by = n.a;
  }
}

void edit_layernorm_input_needs_no_grad(OpList& l) {
  // the first layer of a LoRA run without checkpointing: its input (the frozen embedding's
  // output) needs no gradient, so the norms reading it record nothing, and the frozen Linears
  // and adapters reading their outputs compute no input gradient; only the adapters' own chain
  // (lora_B onwards) needs one [D]. In a parallel block the MLP reads the input's norm too.
  const bool parallel = find_op(l, "mlp.sum") != nullptr;
  auto reads_input = [&](std::string_view n) {
    for (std::string_view p : {"ln1.", "qkv.", "q_proj.", "k_proj.", "v_proj.", "q.lora_", "k.lora_", "v.lora_"})
      if (n.starts_with(p)) return true;
    if (!parallel) return false;
    return n.starts_with("ln2.") || n.starts_with("fc1.");
  };
  for (TensorOp& t : l) {
    const std::string_view n = t.name;
    if (!reads_input(n)) continue;
    const bool adapter_chain = n.ends_with("lora_B") || n.ends_with("lora_scaled") || n.ends_with("lora_sum") ||
                               n.ends_with("_proj.out") || n == "qkv.out" || n == "fc1.out";
    if (!adapter_chain) t.grad_input = kNone;
    if (n.ends_with(".mean") || n.ends_with(".rstd")) t.saved = false, t.dies_after = {};
  }
  TensorOp* in = find_mut(l, "input");
  in->saved = false;
  in->dies_after = find_op(l, "attn.residual") ? "attn.residual" : "layer.out";
  for (TensorOp& t : l)
    if (t.residual_of == "input" && t.branch_of.empty()) t.residual_of = {};
}

namespace {

Activation activation_of(const std::string& act) {
  if (act == "relu") return Activation::Relu;
  if (act == "silu") return Activation::Silu;
  if (act == "gelu_new" || act == "gelu_fast" || act == "gelu_python") return Activation::GeluExpr;
  return Activation::Gelu;  // gelu, gelu_pytorch_tanh: F.gelu
}

/// `elements` parameters held as tensors of `width` (the norms' weights and biases).
void split_params(std::vector<ParamTensor>& p, u64 elements, u64 width, u64 bytes, bool trained) {
  for (u64 e = 0; e < elements && width > 0; e += width) p.push_back({mul(std::min(width, elements - e), bytes), trained});
}

}  // namespace

void complete_layernorm_setup(const Request& r, StepSetup& s) {
  const ModelSpec& m = r.model;
  const LayerGroup& g = m.groups.front();
  const u64 bytes = s.dtypes.model, ad = s.dtypes.adapter;
  const bool full = s.layer.full;
  s.dims.qkv = add(s.dims.q, mul(2, s.dims.kv));
  if (m.hidden > 0) s.dims.pos = m.position_params / m.hidden;
  if (m.rotary_dim > 0) {
    s.dims.qr = mul(m.heads, m.rotary_dim);
    s.dims.kr = mul(m.kv_heads, m.rotary_dim);
    s.dims.head_dim = m.rotary_dim;  // what cos / sin hold per position
  }
  s.dtypes.norm_stats = r.device == Device::Cuda ? 4 : bytes;  // native_layer_norm: acc type on CUDA
  s.layer.act = activation_of(m.activation);
  s.layer.attn_dropout = m.attention_dropout > 0;
  s.layer.resid_dropout = m.hidden_dropout > 0;
  s.layer.embd_dropout = m.embedding_dropout > 0;
  s.layer.cuda = r.device == Device::Cuda;
  s.layer.head_bias = !m.tied_embeddings && m.lm_head.bias;
  s.layer.checkpointing = r.gradient_checkpointing;
  s.layer.logits_fp32_in_model = m.logits_fp32_in_model;
  // the layer's norms (weight and bias of width h), then each Linear's weight and bias; LoRA's A
  // [r, in] and B [out, r] for every Linear, in the adapter dtype (PEFT)
  std::vector<ParamTensor>& lw = s.layer_weights;
  split_params(lw, g.other_params, m.hidden, bytes, full);
  for (const Linear& l : g.linears) {
    lw.push_back({mul(l.weight_params(), bytes), full});
    if (l.bias) lw.push_back({mul(l.bias_params(), bytes), full});
  }
  if (!full)
    for (const Linear& l : g.linears) lw.push_back({mul(s.dims.r, l.in, ad), true}), lw.push_back({mul(l.out, s.dims.r, ad), true});
  std::vector<ParamTensor>& ow = s.outer_weights;
  ow.push_back({mul(m.embedding_params, bytes), full});
  if (m.position_params > 0) ow.push_back({mul(m.position_params, bytes), full});
  s.leading_outer = ow.size();  // the embeddings come before the layers
  split_params(ow, m.other_params, m.hidden, bytes, full);
  // registered buffers the modules keep on the device (GPTBigCode's [n_pos, n_pos] causal mask, ...)
  if (m.buffer_bytes > 0) ow.push_back({m.buffer_bytes, false});
  if (!m.tied_embeddings) {
    ow.push_back({mul(m.lm_head.weight_params(), bytes), full});
    if (m.lm_head.bias) ow.push_back({mul(m.lm_head.bias_params(), bytes), full});
  }
}

void complete_gptj_setup(const Request& r, StepSetup& s) {
  complete_layernorm_setup(r, s);
  s.dims.pos = r.model.max_positions;  // rows of the sin / cos table (embed_positions.repeat)
}

void complete_codegen_setup(const Request& r, StepSetup& s) {
  complete_layernorm_setup(r, s);
  // CodeGenAttention.forward: mp_num = 4 groups of heads / 4 heads each [X]
  s.layer.heads_split_copied = r.model.heads > 4;
}

void complete_falcon_setup(const Request& r, StepSetup& s) {
  complete_layernorm_setup(r, s);
  s.dims.kr = s.dims.q;  // _split_heads broadcasts K to every query head before rotary
}

}  // namespace memfit::sched
