// Activation memory: which tensors autograd keeps from the forward to the backward, and which
// transient buffers exist at the worst moment, for the Hugging Face Transformers implementations
// of each family on PyTorch.
//
// Method: walk one decoder layer op by op and count every tensor an op saves for backward
// (PyTorch's derivatives.yaml says what each op saves: e.g. mul saves the other operand when
// the operand it multiplies requires grad, softmax saves its output, silu/gelu save their
// input, relu its output, native_layer_norm its input, mean and rstd, matmul/linear their
// inputs when the corresponding gradient is needed). Tensors saved by several ops are counted
// once. References:
//  - Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
//    (arXiv 2205.05198), sec. 4.1: the 34sbh + 5as^2b count for a GPT layer in fp16; ours is the
//    same walk done for each implementation, dtypes included.
//  - transformers modeling_llama.py (LlamaRMSNorm upcasts to fp32, eager softmax in fp32),
//    sdpa_attention.py / flash_attention.py, loss_utils.py (ForCausalLMLoss upcasts logits to
//    fp32 before cross_entropy).
//  - PyTorch autocast op lists (torch/amp, "CUDA Ops that can autocast to float32"): softmax,
//    log_softmax, layer_norm, cross_entropy run in fp32; linear/matmul in half; the cast of a
//    leaf weight is cached for the autocast region.
// All quantities are bytes per token unless named otherwise; the s x s attention terms are
// bytes per token per attended position.
#include "activations.hpp"

#include "bitsandbytes.hpp"
#include "frameworks.hpp"
#include "states.hpp"

#include <algorithm>
#include <set>

namespace memfit::detail {

Dtypes dtypes_for(Precision p) {
  switch (p) {
    case Precision::Fp32: return {4, 4, false};
    case Precision::AmpBf16:
    case Precision::AmpFp16: return {2, 4, true};
    case Precision::Bf16:
    case Precision::Fp16: return {2, 2, false};
  }
  return {2, 2, false};
}

bool kbit_upcast(const Request& r) {
  const Quantization q = r.quantization;
  return r.task == Task::Qlora && r.runtime.prepare_kbit &&
         (q == Quantization::Nf4 || q == Quantization::Nf4Double || q == Quantization::Fp4 || q == Quantization::Int8);
}

Dtypes dtypes_for(const Request& r) {
  // prepare_model_for_kbit_training leaves fp32 embeddings and norms; without autocast the hidden
  // states stay fp32 (bitsandbytes' 4-bit/8-bit Linear casts its output back to its input's dtype).
  if (kbit_upcast(r) && (r.precision == Precision::Bf16 || r.precision == Precision::Fp16))
    return dtypes_for(Precision::Fp32);
  return dtypes_for(r.precision);
}

namespace {

/// Saved tensors per element of an activation function's input (in its own dtype).
u64 activation_saves(const std::string& act) {
  // NewGELUActivation (gelu_new) and FastGELU are written as Python expressions: the input,
  // tanh output and two mul operands are kept. quick_gelu: input and sigmoid output.
  if (act == "gelu_new" || act == "gelu_fast" || act == "gelu_python") return 4;
  if (act == "quick_gelu") return 2;
  return 1;  // silu, gelu, gelu_pytorch_tanh, bloom_gelu (custom fn saving its input), relu (its output)
}

// The rows of FamilyActivations (activations.hpp): Transformers 5.23 modeling files, and the
// measurements cited where each column is used below.
// - qk_in_fp32: GPT-Neo, GPT-J and CodeGen cast q and k to fp32 before QK^T.
// - v_view_of_fused_qkv: CodeGen and GPT-NeoX split v out of the fused projection as a view.
//   v_view_max_heads: CodeGen's _split_heads reshapes qkv into mp_num = 4 groups; with more than
//   one head per group the reshape copies q, k and v (measured, op-by-op live bytes of tuning
//   case codegen/h256-L3-V2048/lora-r8-qv/fp32/nogc/eager/b1s192/adamw_fused, 8 heads: a v clone
//   (1, 192, 4, 2, 32) per layer and no qkv_proj output alive at the loss backward).
// - loop_keeps_attention_probs: Falcon, BLOOM, GPT-Neo, GPT-J and CodeGen blocks return their
//   probabilities and the model loop keeps `outputs = block(...)` through the next block's forward
//   (the other families' loops keep only the hidden states).
// - window_from_buffer: GPT-Neo's `_attn` masks local layers with `self.bias[...]` in torch.where.
// - softmax_in_model_dtype: GPT-2, BioGPT, BERT, Falcon and Llama 4 (text; modeling_llama4.py's
//   eager_attention_forward: "llama4 doesn't cast attn weights to fp32") call softmax without
//   dtype=float32.
// - probs_to_value_dtype: GPT-2's eager_attention_forward casts the probabilities to v's dtype
//   (`attn_weights.type(value.dtype)`) before dropout; BioGPT and BERT drop the softmax's output.
// - norm_fp32_one_plus_weight, post_norms: Gemma's RMSNorm; Gemma2/3 post-attention and
//   post-feedforward norms. qk_norm_*: Qwen3 / Gemma3 per head, OLMo2 over the width.
// - rotary_by_cat: Phi, Phi-3, StableLM and GPT-NeoX concatenate the rotary and pass-through parts.
// - block_keeps_attn_output: GPT2Block / GPTBigCodeBlock; StableLmDecoderLayer (self_attn_output);
//   GPTNeoBlock (`hidden_states = attn_output + residual` leaves attn_output bound until the block
//   returns; measured, op-by-op live bytes of tuning case
//   gpt_neo/h256-L4-V2048/lora-r16-mlp/bf16/gc/eager/b3s192/adamw: out_proj's bf16 (576, 256)
//   output alive through the recomputed MLP to c_proj's lora_A).
// - block_keeps_first_norm_output: StableLmDecoderLayer.forward binds `hidden_states =
//   self.input_layernorm(hidden_states)` and, in the sequential branch, runs
//   `self.mlp(self.post_attention_layernorm(residual))` without rebinding it: the first norm's
//   output and `self_attn_output` stay locals until the layer returns (Llama-like layers rebind
//   hidden_states to the residual sum, which frees both).
// - fp32_router, fp32_route_weights, sigmoid_gated_shared_expert: DeepSeek-V3's fp32 router,
//   Mixtral's fp32 softmax weights, Qwen2-MoE's gated shared expert. shared_expert_first:
//   Qwen2MoeSparseMoeBlock.forward calls shared_expert before the router and the experts
//   (DeepSeek-V3 adds its shared experts after the routed ones).
// - Falcon's rotary path (no alibi) holds its scores and fused q/k/v output as locals and builds a
//   per-layer mask; its alibi path is not measured, so its row has only what both paths share.
//   BLOOM (alibi by baddbmm) holds its raw and masked scores and the fused output, and normalises
//   the word embedding.
// - BERT (modeling_bert.py): BertEmbeddings sums the word, token-type and position embeddings and
//   normalises the sum (embedding_layernorm); BertForMaskedLM's head runs
//   BertPredictionHeadTransform (dense, act, LayerNorm) before the tied decoder (head_transform)
//   and calls CrossEntropyLoss on the decoder's output as it is (loss_in_logits_dtype; Transformers'
//   ForCausalLMLoss upcasts with logits.float()); a BERT tokenizer gives input_ids,
//   token_type_ids and attention_mask (tokenizer_inputs). BertLayer normalises after each residual
//   add (post_norm_layers: see post_norm_release). Measured, peak dumps of tuning cases
//   bert/h128-L2-V1024/mlm/full/fp32/nogc/eager/b2s128/adamw (the embeddings' add and its
//   LayerNorm statistics, the transform's addmm and gelu outputs alive at the loss backward) and
//   .../mlm/full/bf16/gc/eager/... (data/measurements/cpu-suite-bert.jsonl).
// clang-format off
constexpr FamilyActivations kFamilyActivations[] = {
    {.family = "gpt2", .softmax_in_model_dtype = true, .probs_to_value_dtype = true, .block_keeps_attn_output = true},
    {.family = "gpt_bigcode", .block_keeps_attn_output = true},
    {.family = "biogpt", .softmax_in_model_dtype = true},
    {.family = "bert", .softmax_in_model_dtype = true, .embedding_layernorm = true, .head_transform = true,
     .loss_in_logits_dtype = true, .tokenizer_inputs = 3, .post_norm_layers = true,
     .inputs_embeds_apart = true},
    {.family = "falcon", .loop_keeps_attention_probs = true, .softmax_in_model_dtype = true, .scores_locals = true,
     .per_layer_mask = true, .mlp_norm_before_attention = true, .no_grad_four_scores = true, .fused_qkv_local = true},
    {.family = "falcon (alibi)", .loop_keeps_attention_probs = true, .softmax_in_model_dtype = true,
     .mlp_norm_before_attention = true, .no_grad_four_scores = true},
    {.family = "bloom", .loop_keeps_attention_probs = true, .scores_locals_fp32 = true, .baddbmm_attention = true,
     .fused_qkv_local = true, .embedding_layernorm = true},
    {.family = "gpt_neo", .qk_in_fp32 = true, .loop_keeps_attention_probs = true, .window_from_buffer = true,
     .block_keeps_attn_output = true},
    {.family = "gptj", .qk_in_fp32 = true, .loop_keeps_attention_probs = true},
    {.family = "codegen", .qk_in_fp32 = true, .v_view_of_fused_qkv = true, .v_view_max_heads = 4,
     .loop_keeps_attention_probs = true},
    {.family = "gpt_neox", .v_view_of_fused_qkv = true, .rotary_by_cat = true},
    {.family = "phi", .rotary_by_cat = true},
    {.family = "phi3", .rotary_by_cat = true},
    {.family = "stablelm", .rotary_by_cat = true, .block_keeps_attn_output = true,
     .block_keeps_first_norm_output = true},
    {.family = "gemma", .norm_fp32_one_plus_weight = true},
    {.family = "gemma2", .norm_fp32_one_plus_weight = true, .post_norms = true},
    {.family = "gemma3_text", .norm_fp32_one_plus_weight = true, .qk_norm_per_head = true, .post_norms = true},
    {.family = "qwen3", .qk_norm_per_head = true},
    {.family = "qwen3_moe", .qk_norm_per_head = true},
    {.family = "olmo2", .qk_norm_full_width = true},
    {.family = "deepseek_v3", .fp32_router = true, .fp32_route_weights = true},
    {.family = "mixtral", .fp32_route_weights = true},
    {.family = "qwen2_moe", .sigmoid_gated_shared_expert = true, .shared_expert_first = true},
    {.family = "llama4_text", .softmax_in_model_dtype = true},
};
// clang-format on
constexpr FamilyActivations kLlamaLike{};

/// BloomAttention.forward (modeling_bloom.py, eager only) in a forward without saving (a
/// checkpointed layer, prefill): beyond hidden_live's four [T, h] (inputs_embeds, the layer input,
/// the normed input and the residual add's output, which exists only at the end) it holds the
/// fused query_key_value output [T, qkv] as a local beside the per-head copies reshape makes of q,
/// k, v: `query_layer.reshape(batch_size * num_heads, -1, head_dim)` of the [b, heads, s, d]
/// transposed view copies when b > 1; at micro-batch 1 dropping the batch dimension is a view, so
/// q, k and v stay views of the fused output (measured, peak dump of tuning case
/// bloom/h192-L2-V2048/lora-r16-qv/fp32/gc/eager/b1s1024/adafactor at the residual add: one fp32
/// (1, 1024, 576) add and no (1, 1024, 6, 32) copy but _merge_heads' clone). The alibi baddbmm
/// scores (compute dtype) and the masked scores (the mask's dtype, the residual's: fp32 under
/// autocast) stay locals to the end; F.softmax(dtype=float32) copies a half input to fp32 first;
/// `.to(dtype)` makes a half copy and frees the fp32 softmax (in fp32 both are the softmax itself); every block returns its probabilities and BloomModel's loop
/// keeps `outputs` through the next block's forward. Moments: at the softmax (its fp32 input
/// copy) or at the half copy, beside the previous block's probabilities; at the residual add,
/// the probabilities plus the merged context (a reshape copy) and the dense output. Measured,
/// peak dumps of tuning cases bloom/h128-L3-V2048/full/fp32/gc/eager/b3s448/sgd_momentum/gas2 at
/// the add: fp32 baddbmm (12, 448, 448), add and two _softmax (3, 4, 448, 448), addmm
/// (1344, 384), three clone (3, 4, 448, 32), clone (3, 448, 4, 32), addmm (1344, 128);
/// bloom/h256-L3-V1024/full/bf16/gc/eager/b2s512/sgd_momentum/gas2 at _softmax: bf16 baddbmm, add
/// and the previous block's _to_copy, fp32 _to_copy and _softmax, [2, 8, 512, 512] each, addmm
/// (1024, 768) and three clone (2, 8, 512, 32); the step-2 forward of
/// bloom/h192-L3-V1024/full/amp_bf16/gc/eager/b2s384/sgd_momentum at the half _to_copy: bf16
/// baddbmm, fp32 add and _softmax, two bf16 _to_copy, [2, 6, 384, 384] each.
u64 bloom_attention_moment(u64 p, u64 residual, u64 qkv, u64 ow, u64 h, u64 heads, u64 tokens, u64 s) {
  const u64 softmax_in_copy = residual == 4 ? 0 : 4, half_copy = p == 4 ? 0 : p;
  const u64 qkv_live = mul(tokens == s ? 1 : 2, p, qkv);  // tokens == s: micro-batch 1
  const u64 scores = add(add(p, residual), add(4, p));  // scores, masked, softmax, previous block's
  const u64 at_softmax = add(mul(tokens, sub_floor(qkv_live, mul(residual, h))),
                             mul(heads, add(scores, std::max(softmax_in_copy, half_copy)), tokens, s));
  const u64 at_add = add(mul(tokens, add(qkv_live, mul(p, add(ow, h)))),
                         mul(heads, add(add(p, residual), mul(2, p == 4 ? 4 : p)), tokens, s));
  return std::max(at_softmax, at_add);
}

/// Dropout with p > 0 keeps a mask: bool on CUDA (native_dropout), input dtype on CPU (bernoulli noise).
u64 dropout_mask(double p, const Request& r, u64 elem_bytes) {
  if (p <= 0) return 0;
  return r.device == Device::Cuda ? 1 : elem_bytes;
}

/// Where a framework's own decoder modules keep other tensors than Transformers' (read from
/// torchtune 0.6.1's source, measured with validate/frameworks.py on CPU).
struct ModuleImpl {
  /// MultiHeadAttention expands K and V to every query head before SDPA (modules/attention.py:
  /// `k.unsqueeze(2).expand(...).flatten(1, 2)`): the kernel keeps the [b, heads, s, d] copies.
  bool kv_copied_to_heads = false;
  /// RMSNorm is F.rms_norm(x.float(), weight).to(dtype) (modules/rms_norm.py): a trained weight
  /// keeps the fp32 normalised value, whatever the model dtype.
  bool norm_normalised_fp32 = false;
  /// Bytes per (position, rotary dim) of the rotary tables the q/k muls keep; 0: Transformers'
  /// cos and sin [s, d] in the compute dtype. torchtune's RotaryPositionalEmbeddings keeps one
  /// fp32 cache slice [s, d/2, 2] (4); LitGPT's GPT keeps its cos and sin buffers [s, d], rebuilt
  /// in fp32 when fit() sets max_seq_length (8).
  u64 rope_bytes = 0;
  /// q is built by a cat (contiguous [b, heads, s, d]), so the CPU flash kernel's output has that
  /// layout and the reshape before the output projection is a copy, which a trained o_proj keeps.
  bool attn_output_copied = false;
  /// One Linear computes q, k and v (LitGPT's attn.qkv): under autocast a trained one keeps one
  /// half cast of its input, not three; with LoRA one adapter (LoRAQKVLinear) sits on it: a single
  /// dropout of the input feeds one lora_A for every enabled projection, and with only some of
  /// q/k/v enabled the zero-padding index_copy keeps lora_B's output [T, enabled widths].
  bool fused_qkv = false;
};

/// Frameworks whose models are their own modules (the others run Transformers' modeling code).
constexpr std::pair<Framework, ModuleImpl> kOwnModules[] = {
    {Framework::Torchtune, {true, true, 4, false, false}},  // torchtune 0.6.1 modules/ (measured, validate/frameworks.py)
    // LitGPT 0.5.13 model.py / lora.py: k and v repeat_interleave'd to every query head, RMSNorm
    // multiplies the fp32 x_normed by weight.float(), q = cat(apply_rope(q), ...), LoRAQKVLinear
    // (measured, peak dumps of the litgpt cases of validate/suite_frameworks.py)
    {Framework::Litgpt, {true, true, 8, true, true}},
};

ModuleImpl module_impl(const Request& r) {
  for (const auto& [f, impl] : kOwnModules)
    if (f == r.runtime.framework) return impl;
  return {};
}

/// The backward of a sequential block's second norm when it is an RMSNorm written in Python ops
/// over fp32 (Transformers' LlamaRMSNorm and its copies: `x.to(float32)`, `pow(2).mean(-1)`,
/// `rsqrt`, `x * rsqrt`, `.to(input_dtype)`, `weight *`; Gemma's multiplies by (1 + weight) in
/// fp32 first). It runs after the MLP block's backward, which has released everything the MLP
/// saved (and, in MoE layers, made every expert's weight gradient); the norm's weight node has
/// released its normalised half copy, its fp32 input and rsqrt stay. At pow's backward
/// (derivatives.yaml pow.Tensor_Scalar: pow_backward = grad * (exponent * self.pow(exponent - 1));
/// mean.dim: mean_backward expands grad and divides by h) five fp32 [T, h] are alive: the mul
/// node's input gradient waiting for the pow path's, mean's divided gradient, self.pow(1),
/// 2 * it and their product; the residual stream's gradient waits beside them. Measured, peak
/// dump of tuning case qwen3_moe/h512-L2-V1024/full/bf16/gc/sdpa/b2s128/sgd at layer 0's mul:
/// three mul, a div, a pow and one _to_copy fp32 [2, 128, 512] beyond the attention's saved
/// tensors, a bf16 [2, 128, 512] add, and both layers' expert stacks' gradients (-3.2 % without
/// this moment). Extra live bytes beyond the layer's saved total (0: no such moment).
u64 mlp_norm_backward(const ModelSpec& m, const Request& r, u64 mlp_saved, u64 mlp_norm, u64 tokens,
                      u64 per_layer_const) {
  const ModuleImpl impl = module_impl(r);
  if (m.parallel_block || m.norm != NormKind::RMSNorm || r.runtime.compile || impl.norm_normalised_fp32) return 0;
  const Dtypes d = dtypes_for(r);
  const u64 h = m.hidden;
  // the normalised half copy a trained weight's mul keeps (norm_keeps)
  const bool gemma_norm = family_activations(m).norm_fp32_one_plus_weight;
  const u64 x_hat = r.task == Task::Full ? mul((d.residual == 2 && !gemma_norm) ? 2 : 4, h) : 0;
  const u64 live = mul(tokens, add(mul(d.residual, h), mul(5, 4, h)));
  const u64 released = add(mul(tokens, sub_floor(mlp_saved, sub_floor(mlp_norm, x_hat))), per_layer_const);
  return sub_floor(live, released);
}

/// One decoder layer as the walk sees it: the model, its layer group, the request and which
/// Linears train, with the element sizes and widths every block of the walk reads.
struct Layer {
  const ModelSpec& m;
  const LayerGroup& g;
  const Request& r;
  const TrainableLinears& t;
  const FamilyActivations& fam;
  ModuleImpl impl;
  Dtypes d;
  u64 tokens = 0;    ///< micro-batch x sequence (per rank)
  u64 s = 0;         ///< attended positions per query (eager's s x s terms)
  u64 p = 0;         ///< bytes of the compute dtype (Linear outputs, attention)
  u64 h = 0;         ///< hidden width
  u64 a = 0;         ///< query heads
  u64 qw = 0, kw = 0, vw = 0;  ///< q, k and v projection widths
  u64 ow = 0;        ///< attention output width
  bool gqa = false;  ///< fewer K/V heads than query heads
  bool mla = false;  ///< multi-latent attention (DeepSeek-V3)
  bool full = false; ///< full fine-tuning (every Linear trains)
  u64 adapter_bytes = 0;       ///< LoRA adapters' dtype bytes (0: no adapters)
  bool cpu_sdpa_math = false;  ///< SDPA falls back to CPU's _scaled_dot_product_attention_math
  u64 moe_slots = 0;           ///< expert runs per token
  u64 xp = 0;                  ///< bytes per element of the routed experts' tensors
  u64 mlp_width = 0;           ///< MLP intermediate width per token (MoE: times the routed slots)
  u64 mlp_elem = 0;            ///< bytes per element of the MLP intermediates
  u64 norm_out = 0;            ///< bytes of a norm's output (the residual dtype: fp32 under autocast)
  bool gemma_norm = false;     ///< FamilyActivations::norm_fp32_one_plus_weight
  bool bnb4 = false, bnb8 = false;  ///< QLoRA over bitsandbytes 4-bit / LLM.int8 Linears
  bool ctx_keeps_input = false;     ///< their autograd contexts hold the Linear's input (see layer_of)
  u64 ctx_elem = 0;                 ///< bytes of the input the 4-bit context holds (the load dtype)
  u64 ctx_transposed = 0;           ///< int8 transposed copy the context holds, per input element
  u64 act_saves = 0;                ///< activation_saves(m.activation)
  bool relu = false;                ///< relu keeps its output, not its input
};

Layer layer_of(const ModelSpec& m, const LayerGroup& g, const Request& r, const TrainableLinears& t, u64 tokens,
               u64 seq) {
  const Dtypes d = dtypes_for(r);
  Layer L{.m = m, .g = g, .r = r, .t = t, .fam = family_activations(m), .impl = module_impl(r), .d = d};
  L.tokens = tokens;
  L.p = d.compute;
  L.h = m.hidden;
  L.a = m.heads;
  L.qw = mul(m.heads, m.head_dim);
  L.kw = mul(m.kv_heads, m.head_dim);
  L.vw = mul(m.kv_heads, m.v_head_dim);
  L.ow = mul(m.heads, m.v_head_dim);  // attention output width
  L.gqa = m.kv_heads < m.heads;
  L.mla = m.attention == AttentionKind::MultiLatent;
  L.full = r.task == Task::Full;
  // Eager attention materialises s x s scores even for sliding-window layers (the window is a mask).
  L.s = seq;
  L.adapter_bytes = t.lora_rank == 0 ? 0 : (r.lora.adapter_bytes ? r.lora.adapter_bytes : 4);
  // CPU SDPA: the flash kernel needs one head dim for q, k and v (sdp_utils_cpp.cpp
  // check_head_dim_size_cpp) and refuses dropout_p > 0: MLA (qk_head_dim != v_head_dim) and
  // attention dropout fall back to _scaled_dot_product_attention_math.
  L.cpu_sdpa_math = r.attention == AttentionImpl::Sdpa && r.device == Device::Cpu &&
                    (m.attention_dropout > 0 || (L.mla && m.head_dim != m.v_head_dim));
  L.moe_slots = g.experts_on_every_token ? g.experts : g.experts_per_token;  // expert runs per token
  // Fused experts run torch._grouped_mm, which is not on CPU autocast's op list: under autocast
  // their tensors stay in the (fp32) dtype of the hidden states they gather (measured, torch 2.15:
  // _grouped_mm of fp32 operands under autocast("cpu", bfloat16) returns fp32; peak dump of tuning
  // case qwen2_moe/h256-L4-V4096/full/amp_bf16/gc/sdpa/b3s256/sgd_momentum: fp32 _grouped_mm
  // [1536, 384], silu and mul [1536, 192] in the recomputed layer). CUDA's list is not verified
  // here: there the experts are taken to run in half, as before.
  const bool fp32_experts = d.amp && g.moe && !g.experts_on_every_token && r.device == Device::Cpu;
  L.xp = fp32_experts ? d.residual : L.p;
  L.mlp_width = g.moe ? mul(L.moe_slots, g.mlp_intermediate) : g.mlp_intermediate;
  L.mlp_elem = g.moe ? L.xp : L.p;
  // bitsandbytes' quantized Linears keep tensors as attributes of their autograd context, not
  // through save_for_backward (bitsandbytes.cpp: which, per release). Kept whether or not the
  // Linear has an adapter, and checkpointing's saved-tensor hooks never see them: alive from the
  // layer's first forward to the Linear's backward (llama/qlora-int8/*/gc: -0.9 %; holding them
  // to the end of the whole backward would read +4.7 %). MatMul4Bit keeps its A after Linear4bit's
  // x.to(compute_dtype) (the load dtype here, as the validator's bnb_4bit_compute_dtype): the
  // shared input when the dtypes agree, else a copy of its own. LLM.int8 keeps x itself, and
  // MatMul8bitLt before 0.45 on CUDA its int8 transposed copy too (fused experts are not Linears:
  // bitsandbytes leaves them alone).
  L.bnb4 = r.task == Task::Qlora && (r.quantization == Quantization::Nf4 ||
                                     r.quantization == Quantization::Nf4Double || r.quantization == Quantization::Fp4);
  L.bnb8 = r.task == Task::Qlora && r.quantization == Quantization::Int8;
  const BnbContext& bnb = bnb_context(r.runtime.bitsandbytes_version);
  L.ctx_keeps_input = (L.bnb4 && bnb.four_bit_keeps_input) || (L.bnb8 && bnb.int8_keeps_input);
  L.ctx_elem = r.precision == Precision::Bf16 || r.precision == Precision::Fp16 ? 2 : 4;
  L.ctx_transposed = L.bnb8 && r.device == Device::Cuda ? bnb.int8_transposed_bytes : 0;
  // Gemma's RMSNorm multiplies in fp32 by (1 + weight): a trained weight makes it keep the fp32
  // x_hat, and the mul keeps the fp32 (1 + weight) [h] (a per-layer constant, counted at the end).
  L.gemma_norm = L.fam.norm_fp32_one_plus_weight;
  // The output of a norm is in the residual dtype (fp32 under autocast).
  L.norm_out = d.residual;
  L.act_saves = activation_saves(m.activation);
  L.relu = m.activation == "relu";
  return L;
}

// What the Linear layers reading one activation keep for their weight gradients
// (the input gradient needs only the weight). A trained Linear keeps the activation itself,
// or under autocast its own half cast of it; a LoRA adapter keeps the activation when it has
// the same dtype, else its own cast (PEFT casts the input to the adapter dtype), plus the rank-r
// output of lora_A that lora_B keeps. slot_keep returns {bytes kept by consumers besides the shared
// tensor, whether the shared tensor itself is kept}.
struct SlotKeep {
  u64 extra = 0;
  bool shared = false;
  u64 masks = 0;  ///< the LoRA dropout masks in `extra` (kept only when the input needs a gradient)
  bool ctx_held = false;  ///< a quantized Linear's context holds the shared tensor outside autograd's saving
  bool ctx_only = false;  ///< ... and nothing else keeps it (a recomputation does not re-create it)
  u64 ctx_extra = 0;      ///< tensors of their own the contexts hold (a cast of the input, int8 CAt)
};

bool is_qkv_name(const std::string& n) { return n == "q_proj" || n == "k_proj" || n == "v_proj"; }

SlotKeep slot_keep(const Layer& L, std::initializer_list<LinearInput> inputs, u64 width, u64 elem) {
  const ModelSpec& m = L.m;
  const LayerGroup& g = L.g;
  const Request& r = L.r;
  const TrainableLinears& t = L.t;
  const Dtypes& d = L.d;
  const u64 adapter_bytes = L.adapter_bytes;
  SlotKeep k;
  bool qkv_seen = false;  // fused_qkv: the one input cast / dropout and lora_A input are counted
  u64 qkv_enabled = 0, qkv_enabled_width = 0;
  for (size_t i = 0; i < g.linears.size(); ++i) {
    const Linear& l = g.linears[i];
    bool reads = false;
    for (LinearInput in : inputs) reads = reads || l.input == in;
    // MLA: q_b_proj reads q_a_layernorm's output (q_lora_rank wide), kv_b_proj kv_a_layernorm's
    const u64 w = (L.mla && l.name == "q_b_proj") ? m.q_lora_rank : width;
    if (reads && L.ctx_keeps_input && !l.routed) {
      if (L.bnb8 || L.ctx_elem == elem) k.ctx_held = true;
      else k.ctx_extra = add(k.ctx_extra, mul(L.ctx_elem, w));
    }
    if (reads && !l.routed) k.ctx_extra = add(k.ctx_extra, mul(L.ctx_transposed, w));
    if (!reads || !t.saves_input[i]) continue;
    if (l.routed && g.moe) continue;  // fused experts: counted with the MoE block
    const u64 share = l.routed && g.experts > 0 ? g.experts_per_token : 1;  // routed tokens per token
    // DeepSeek-V3's router runs F.linear(x.float(), W.float()): it keeps an fp32 copy of a half input
    if (L.fam.fp32_router && l.name == "gate" && g.moe) {
      if (elem == 4) k.shared = true;
      else k.extra = add(k.extra, mul(4, w));
      continue;
    }
    // a parametrised weight (PEFT ParamWrapper: a Transformers 5 router) keeps the input like a
    // trained Linear; the merged weight is counted per layer
    if (L.full || (i < t.parametrized.size() && t.parametrized[i])) {
      if (L.impl.fused_qkv && is_qkv_name(l.name)) {
        if (qkv_seen) continue;
        qkv_seen = true;
      }
      if (d.amp) k.extra = add(k.extra, mul(2, w, share));
      else if (share == 1) k.shared = true;
      else k.extra = add(k.extra, mul(elem, w, share));
      continue;
    }
    // LoRA adapter on this Linear. With lora_dropout > 0, PEFT runs lora_A(dropout(x)) with x
    // cast to the adapter dtype: each adapted Linear keeps its own dropped copy (lora_A's
    // input; autocast keeps its half cast of it instead) plus dropout's mask.
    if (L.impl.fused_qkv && is_qkv_name(l.name)) {
      ++qkv_enabled;
      qkv_enabled_width = add(qkv_enabled_width, l.out);
      if (qkv_seen) {  // lora_A's rows for this projection: its part of the rank-r output
        k.extra = add(k.extra, mul(d.amp ? 2 : adapter_bytes, t.lora_rank));
        continue;
      }
      qkv_seen = true;
    }
    const u64 mask = dropout_mask(r.lora.dropout, r, adapter_bytes);
    k.masks = add(k.masks, mul(mask, w, share));
    if (d.amp) k.extra = add(k.extra, mul(add(mul(2, add(w, t.lora_rank)), mul(mask, w)), share));
    else if (adapter_bytes == elem && share == 1 && mask == 0) {
      k.shared = true;
      k.extra = add(k.extra, mul(adapter_bytes, t.lora_rank));
    } else {
      k.extra = add(k.extra, mul(add(mul(adapter_bytes, add(w, t.lora_rank)), mul(mask, w)), share));
    }
  }
  // LoRAQKVLinear.zero_pad: index_copy_ keeps its source, lora_B's output in the compute dtype
  if (qkv_enabled > 0 && qkv_enabled < 3) k.extra = add(k.extra, mul(d.compute, qkv_enabled_width));
  k.ctx_only = k.ctx_held && !k.shared;
  k.shared = k.shared || k.ctx_held;
  return k;
}

/// What the walk has counted so far: bytes per token kept for backward, and their parts.
struct Kept {
  u64 saved = 0;     ///< bytes per token
  u64 hidden = 0;    ///< the [T, h] part of `saved`
  u64 per_pos = 0;   ///< bytes per token per attended position (s x s terms)
  u64 ctx_held = 0;  ///< per token: what quantized Linears' contexts hold (see slot_keep)
  u64 ctx_only = 0;  ///< ... and what only they hold
  u64 norms = 0;     ///< norms counted in the layer (Gemma's fp32 (1 + weight) each)

  void keep(u64 bytes) { saved = add(saved, bytes); }
  void keep_hidden(u64 bytes) {
    saved = add(saved, bytes);
    hidden = add(hidden, bytes);
  }
  /// A norm's saved tensors (a [T, h] part).
  void keep_norm(u64 bytes) {
    ++norms;
    keep_hidden(bytes);
  }
  /// What quantized Linears' contexts hold of a slot whose shared tensor is `bytes` wide.
  void held_by_ctx(const SlotKeep& k, u64 bytes) {
    if (k.ctx_held) ctx_held = add(ctx_held, bytes);
    if (k.ctx_only) ctx_only = add(ctx_only, bytes);
    keep(k.ctx_extra);
    ctx_held = add(ctx_held, k.ctx_extra);
    ctx_only = add(ctx_only, k.ctx_extra);
  }
};

// A norm keeps its input (RMSNorm: an fp32 copy when the input is half) and its statistics;
// a trained RMSNorm also keeps the normalised value for its weight gradient (LayerNorm's
// backward recomputes it from mean/rstd).
u64 norm_keeps(const Layer& L, bool input_is_shared_residual) {
  const u64 in = L.d.residual, h = L.h;
  if (L.m.norm == NormKind::RMSNorm && L.r.runtime.compile) {
    // compiled: one fused kernel keeps its input and rstd; backward recomputes the rest
    return add(input_is_shared_residual ? 0 : mul(in, h), 4);
  }
  if (L.m.norm == NormKind::RMSNorm) {
    u64 b = add(in == 2 ? mul(4, h) : (input_is_shared_residual ? 0 : mul(4, h)), 4);
    if (L.full) b = add(b, mul((in == 2 && !L.gemma_norm && !L.impl.norm_normalised_fp32) ? 2 : 4, h));
    return b;
  }
  // native_layer_norm keeps mean and rstd [T, 1]: fp32 on CUDA, the input dtype on CPU
  // (measured: bf16 gpt2/falcon keep two bf16 [b, s, 1])
  const u64 stats = (L.r.device == Device::Cpu && in == 2) ? 4 : 8;
  return add(input_is_shared_residual ? 0 : mul(in, h), stats);
}

// Per token through one MLP of width w: the activation's saved input(s), the tensors the
// gated product keeps, and the input of down_proj (kept by it, or by relu as its output).
u64 mlp_keeps(const Layer& L, u64 w, u64 share) {
  const u64 p = L.p;
  u64 b = 0;
  // compiled: the activation fuses with the product; the gate and up (or fc1) outputs are kept
  // and act(gate) is recomputed in backward (down_proj still keeps its input)
  if (L.r.runtime.compile) b = mul(p, w, L.m.mlp == MlpKind::Gated ? 2 : 1);
  else if (L.m.mlp == MlpKind::Gated) b = add(mul(p, w, L.act_saves), mul(2, p, w));  // act in, act out, up out
  else b = L.relu ? mul(p, w) : mul(p, w, L.act_saves);
  return mul(b, share);
}

/// Whether a LoRA adapter sits on a Linear reading `in`.
bool lora_on(const Layer& L, LinearInput in) {
  if (L.full || L.t.lora_rank == 0) return false;
  for (size_t i = 0; i < L.g.linears.size(); ++i)
    if (L.g.linears[i].input == in && L.t.saves_input[i]) return true;
  return false;
}

/// A Linear's forward output is p x out; a LoRA adapter adds lora_B's output and its `* scaling`
/// copy in the adapter dtype before PEFT adds them to the base output (measured: peft 0.21
/// LoraLayer.forward, fp32 and bf16 models alike).
u64 linear_output(const Layer& L, LinearInput in, u64 width) {
  return mul(width, add(L.p, lora_on(L, in) ? mul(2, L.adapter_bytes) : 0));
}

/// The first norm and what the Linears reading its output keep (bytes per token).
struct AttentionInput {
  u64 first_norm = 0;        ///< what the layer's first norm keeps
  SlotKeep readers;          ///< what the Linears reading its output keep
  u64 first_norm_local = 0;  ///< the first norm's output as a block local (FamilyActivations::block_keeps_first_norm_output)
};

AttentionInput attention_input(const Layer& L, Kept& kept) {
  const ModelSpec& m = L.m;
  const u64 h = L.h, norm_out = L.norm_out;
  AttentionInput in;
  in.first_norm = norm_keeps(L, false);
  kept.keep_norm(in.first_norm);
  std::initializer_list<LinearInput> attn_readers = {LinearInput::AttnIn};
  std::initializer_list<LinearInput> shared_readers = {LinearInput::AttnIn, LinearInput::MlpIn};
  in.readers = slot_keep(L, m.parallel_block ? shared_readers : attn_readers, h, norm_out);
  in.first_norm_local =
      L.fam.block_keeps_first_norm_output && !m.parallel_block && !in.readers.shared ? mul(norm_out, h) : 0;
  kept.keep_hidden(in.readers.extra);
  if (in.readers.shared) kept.keep_hidden(mul(norm_out, h));
  kept.held_by_ctx(in.readers, mul(norm_out, h));
  return in;
}

/// The q, k and v the attention kernels read (bytes per token).
struct Qkv {
  u64 q = 0, k = 0, v = 0;
};

/// What the q/k norms and the projections (MLA's latent path included) keep; returns q, k, v.
Qkv projections(const Layer& L, Kept& kept) {
  const ModelSpec& m = L.m;
  const LayerGroup& g = L.g;
  const Request& r = L.r;
  const u64 p = L.p, a = L.a, qw = L.qw, kw = L.kw, vw = L.vw;
  const bool mla = L.mla, full = L.full;
  const FamilyActivations& fam = L.fam;

  const bool rotary = !m.learned_positions && !m.alibi;
  Qkv qkv{mul(p, qw), mul(p, kw), mul(p, vw)};
  // q_norm / k_norm (Qwen3, Gemma3: RMSNorm over each head; OLMo2: over the whole width) on the
  // projection outputs: the fp32 input (the output itself in fp32), rstd, and for a trained
  // weight x_hat (measured, analyze_saved.py qwen3-tiny: [b,s,nh,d] fp32 + [b,s,nh,1] + bf16 x_hat).
  const bool per_head_qk_norm = fam.qk_norm_per_head;
  // Llama 4's weight-free L2 norm (modeling_llama4.py Llama4TextL2Norm, x.float() * rsqrt(mean(x^2)))
  // keeps the same fp32 input and per-head rsqrt, and no x_hat (measured, peak dump of
  // llama4_text/lora/bf16/nogc/sdpa: fp32 [2, 64, 8, 16] and [2, 64, 8, 1] rsqrt per RoPE layer)
  if (!mla && (per_head_qk_norm || fam.qk_norm_full_width || g.qk_l2_norm)) {
    kept.keep(mul(4, add(qw, kw)));
    kept.keep(per_head_qk_norm || g.qk_l2_norm ? mul(4, add(m.heads, m.kv_heads)) : 8);
    if (full && !g.qk_l2_norm) kept.keep(mul((p == 2 && !L.gemma_norm) ? 2 : 4, add(qw, kw)));
  }
  if (mla) {
    // q_a -> q_a_layernorm -> q_b; kv_a -> kv_a_layernorm -> kv_b; the rope parts recombined by
    // cat into per-head q and k; v is a view of the kv_b output.
    if (m.q_lora_rank > 0) {
      kept.keep(add(mul(4, m.q_lora_rank), 4));  // norm input (fp32 copy or itself) + rsqrt
      if (full) kept.keep(mul(p, m.q_lora_rank));
    }
    // kv_a_layernorm's input: an fp32 copy of a half input; in fp32 the input itself, a view of
    // kv_a_proj's whole [T, kv_lora_rank + rope] output (measured, deepseek_v3-tiny fp32)
    kept.keep(add(mul(4, p == 4 ? add(m.kv_lora_rank, m.qk_rope_head_dim) : m.kv_lora_rank), 4));
    if (full) kept.keep(mul(p, m.kv_lora_rank));
    const SlotKeep latent_in = slot_keep(L, {LinearInput::Latent}, m.kv_lora_rank, p);
    kept.keep(latent_in.extra);
    if (latent_in.shared) kept.keep(mul(p, add(m.q_lora_rank, m.kv_lora_rank)));
    kept.held_by_ctx(latent_in, mul(p, add(m.q_lora_rank, m.kv_lora_rank)));
    // kv_b output (v is a view of it) for the flash-style kernels; eager attention and the SDPA
    // math path copy the strided v for their bmm, so nothing keeps it (measured, deepseek_v3-tiny)
    if (!L.cpu_sdpa_math && r.attention != AttentionImpl::Eager) kept.keep(mul(p, a, add(m.qk_nope_head_dim, m.v_head_dim)));
    qkv.q = mul(p, a, m.head_dim);
    qkv.k = mul(p, a, m.head_dim);
    qkv.v = 0;
  } else if ((m.fused_qkv || L.impl.fused_qkv) && rotary) {
    // the v view keeps the whole fused output alive (LitGPT without GQA: measured, peak dump of
    // llama/litgpt/lora/bf16/nogc/sdpa/mha-b1s256: the [b, s, 3h] qkv output of both layers)
    qkv.v = mul(p, add(qw, mul(2, kw)));
  }
  return qkv;
}

// CPU SDPA's math path: what is alive as it returns, beyond what the layer keeps (see
// sdpa_math_locals); set only on that path, where it replaces the generic attention moment
struct MathLocals {
  bool on = false;
  u64 tok = 0, tok_s = 0, layer = 0;  // bytes per token, per token and position, per layer
};

/// What an attention kernel adds beyond the tensors it keeps (bytes per token; `_s`: per token
/// and attended position).
struct AttentionKernel {
  bool out_is_kept = false;  ///< the attention output tensor is kept by the kernel itself
  u64 first_qk_unkept = 0;   ///< see LayerActivations::first_qk_unkept (bytes per token)
  u64 v_excess = 0;          ///< what a v kept as a view of a fused projection holds beyond v
  u64 fwd_s = 0;             ///< score tensors alive at the worst moment of its forward
  u64 fwd_only_s = 0;        ///< fwd_s of a forward that is not a recomputation, where larger
  u64 bwd_s = 0, bwd_tok = 0;  ///< extra live at its worst backward moment
  /// Gradients beside the score terms at that moment (see attention_backward): the [T, h] ones
  /// in the residual dtype (0: three, the fused kernels' count) and v's [T, ow] (bytes per element)
  u64 bwd_hidden_grads = 0, bwd_grad_v_bytes = 0;
  MathLocals math;
};


// Eager softmax in fp32 (then a half copy for the PV matmul) unless the implementation keeps the
// model dtype (measured bf16: OPT and GPT-Neo upcast, GPT-2/BigCode/BioGPT and Falcon do not).
// GPTBigCode upcasts when attention_softmax_in_fp32 (its config default; measured,
// analyze_saved.py gpt_bigcode-tiny --precision bf16 --attention eager: an fp32 (2,4,64,64)
// softmax output).
// gpt-oss's eager attention (modeling_gpt_oss.py eager_attention_forward) runs
// softmax(dtype=combined_logits.dtype) in the model dtype.
bool eager_softmax_in_fp32(const Layer& L) { return !L.fam.softmax_in_model_dtype && !L.m.attention_sinks; }
/// Autocast over eager scores the model does not upcast itself: are they fp32 at the softmax?
/// CUDA autocast lists softmax among its fp32 ops; CPU autocast does not (its fp32 list has the
/// losses, not softmax), and there the scores become fp32 only by adding the model's 4-D mask,
/// which is in the fp32 residual dtype: always for causal models; an encoder fed no padding gets
/// no mask (masking_utils create_bidirectional_mask returns None) and its scores stay half
/// (measured, tuning cases bert/h128-L2-V1024/{mlm,cls}/full/amp_bf16/nogc/eager/b2s128/adamw:
/// bf16 _softmax, empty_like and mul [2, 4, 128, 128] per layer).
bool amp_scores_fp32(const Layer& L) { return L.d.amp && (L.r.device != Device::Cpu || L.m.causal); }

  // What is alive as _scaled_dot_product_attention_math (aten/src/ATen/native/transformers/
  // attention.cpp) returns: the attention input (a local of the layer, when no consumer keeps
  // it), the model's q, k, v; with half inputs their fp32 copies (the locals query_acc,
  // key_acc, value_acc); the scaled query; the fp32 PV product; with half inputs its cast back
  // to the input dtype and `attn.to(origin_dtype)`, a half copy of the probabilities returned
  // beside the output (SDPA drops it only after the call); under is_causal the [s, s] mask
  // built from ones(L, S).tril() in the query's (fp32) dtype. Measured, peak dump of tuning case
  // biogpt/h256-L3-V2048/lora-r8-qv/bf16/gc/sdpa/b3s128/sgd/gas2 at that last _to_copy of the
  // recomputed layer: the first norm's bf16 output, q/v (_to_copy) and k (addmm) bf16,
  // fp32 _to_copy (3, 8, 128, 32) x3, mul (3, 8, 128, 32), bmm (24, 128, 32), bf16 _to_copy
  // (3, 8, 128, 32) and (3, 8, 128, 128), where (128, 128). (fp32: to() returns its input.)
  // With fewer K/V heads (Transformers passes enable_gqa when there is no mask),
  // pre_process_group_query_attention_input repeat_interleaves the fp32 key and value to every
  // query head: the value copy is the kept v, the key copy one more local (measured, peak dump
  // of tuning case gpt_bigcode/h256-L3-V1024/lora-r8-qv/bf16/gc/sdpa/b3s128/sgd: two fp32
  // clone (3, 1, 8, 128, 32) next to the scaled (3, 8, 32, 128) key the bmm keeps).
MathLocals sdpa_math_locals(const Layer& L, bool attn_in_shared) {
  const u64 p = L.p, h = L.h, a = L.a, qw = L.qw, kw = L.kw, vw = L.vw, ow = L.ow, s = L.s,
            norm_out = L.norm_out;
  MathLocals math;
  const bool half_in = p != 4;
  const u64 qkv = add(qw, add(kw, vw));
  math.on = true;
  math.tok = add(add(attn_in_shared ? 0 : mul(norm_out, h), mul(add(p, half_in ? 4 : 0), qkv)),
                 add(mul(L.gqa ? 8 : 4, qw), mul(add(4, half_in ? p : 0), ow)));
  math.tok_s = half_in ? mul(p, a) : 0;
  math.layer = L.m.causal ? mul(4, s, s) : 0;
  return math;
}

/// Eager attention: the q, k and v its matmuls keep.
void eager_qkv_kept(const Layer& L, const Qkv& qkv, Kept& kept, AttentionKernel& ak) {
  const ModelSpec& m = L.m;
  const LayerGroup& g = L.g;
  const Request& r = L.r;
  const TrainableLinears& t = L.t;
  const Dtypes& d = L.d;
  const u64 p = L.p, qw = L.qw, kw = L.kw, vw = L.vw, ow = L.ow, tokens = L.tokens, seq = L.s;
  const bool gqa = L.gqa, mla = L.mla, full = L.full;
  const FamilyActivations& fam = L.fam;
  std::vector<size_t> attn_linears;  // the Linears reading the attention input: q, k, v in that order when separate
  for (size_t i = 0; i < g.linears.size(); ++i)
    if (g.linears[i].input == LinearInput::AttnIn && !g.linears[i].routed) attn_linears.push_back(i);
  // repeat_kv copies K and V to every query head under GQA; matmul keeps q and the copies;
  // softmax keeps its output (fp32 when upcast, then a half copy for the PV matmul).
  // With one K/V head, repeat_kv's reshape merges a size-1 dim with the stride-0 expanded one
  // (modeling_gemma.py repeat_kv: expand, then reshape), so it is a view, and at batch 1
  // matmul's fold to 3-D is one too: the matmuls keep k and v themselves, not [T, heads * d]
  // copies (measured, peak dump of tuning case
  // gemma/h128-L3-V1024/lora-r16-mlp/fp32/gc/eager/b1s512/adamw/gas2: a [1, 1, 512, 64] k
  // and a [512, 64] v in the recomputed layer, no [1, 4, 512, 64] copies; of tuning case
  // qwen3_moe/h128-L2-V4096/full/fp32/nogc/eager/b1s512/adamw_fused: no [1, 8, 512, 32] copy,
  // k_proj's [512, 32] output kept). At batch > 1 the fold copies, as repeat_kv does with
  // more K/V heads (checked with saved-tensor hooks on torch 2.15).
  const bool kv_views = gqa && !mla && m.kv_heads == 1 && tokens == seq;
  const u64 kk = gqa && !kv_views ? mul(p, qw) : qkv.k;
  // (the PV matmul copies a strided v view: only v itself is kept, never the fused output)
  const u64 vv_own = kv_views ? qkv.v : gqa ? mul(p, ow) : (mla ? mul(p, ow) : mul(p, vw));  // MLA: the copy of the strided v
  // CodeGen's v is a view of qkv_proj's output (modeling_codegen.py: torch.split of the
  // reshaped qkv, then a permute); at batch 1 the PV matmul folds it to 3-D as a view, so it
  // keeps the whole fused output alive (measured, peak dump of tuning case
  // codegen/h128-L3-V4096/lora-r8-attn/fp32/nogc/eager/b1s512/adafactor: each layer's
  // [1, 512, 384] fp32 qkv output alive at the loss backward, no v copy). The PV node
  // releases it before softmax's backward (counted in the block's tail, attention_tail). Not in a
  // checkpointed layer's recomputation: there the PV matmul keeps a [1, s, heads, d] copy
  // and the fused output is gone by the MLP's backward (measured, peak dump of tuning case
  // codegen/h256-L2-V1024/lora-r32-qv/fp32/gc/eager/b1s256/sgd; why the two differ is not
  // established). GPT-NeoX's v is such a view too (modeling_gpt_neox.py: query_key_value's
  // output viewed [b, s, heads, 3d], transposed, chunked), so its whole output stays as well
  // (measured, peak dump of tuning case gpt_neox/h64-L4-V1024/full/fp32/nogc/eager/b1s896/
  // adamw_fused: each layer's fp32 [896, 192] addmm alive at the loss backward, no v copy).
  const bool v_views_fused = fam.v_view_of_fused_qkv && m.fused_qkv && tokens == seq && !r.gradient_checkpointing &&
                             (fam.v_view_max_heads == 0 || m.heads <= fam.v_view_max_heads);
  ak.v_excess = v_views_fused ? mul(p, add(qw, kw)) : 0;
  const u64 vv = add(vv_own, ak.v_excess);
  // GPT-Neo's, GPT-J's and CodeGen's eager attention upcast query and key to fp32 before
  // QK^T (modeling_gpt_neo.py / modeling_gptj.py / modeling_codegen.py `_attn`:
  // query.to(torch.float32), key.to(torch.float32)); the matmul keeps the fp32 copies
  // (measured, peak dump of codegen/lora/bf16/nogc/eager: fp32 [2, 4, 64, 32] q and k^T per layer;
  // under autocast the matmul casts them back to half)
  const bool qk_fp32 = fam.qk_in_fp32 && p == 2 && !d.amp;
  const u64 q_kept = qk_fp32 ? mul(4, qw) : qkv.q, k_kept = qk_fp32 ? mul(4, kw) : kk;
  kept.keep(add(q_kept, k_kept));
  // QK^T keeps q for k's gradient and k for q's. In a first layer whose input needs no
  // gradient (LoRA without checkpointing), q and k need one only through their own adapters:
  // with one of separate q/k projections adapted, the other's output is not kept (measured,
  // peak dump of tuning case gemma/h128-L3-V1024/lora-r8-qv/fp32/nogc/eager/b2s512/sgd: two
  // fp32 [2, 4, 512, 64] q clones for three layers, three k^T).
  if (!full && !mla && attn_linears.size() == 3) {
    const bool q_adapted = t.saves_input[attn_linears[0]], k_adapted = t.saves_input[attn_linears[1]];
    if (q_adapted != k_adapted) ak.first_qk_unkept = q_adapted ? q_kept : k_kept;
  }
  kept.keep(vv);
  // (repeat_kv copies the K/V views, so the fused projection output is not kept: measured on
  // falcon-tiny, GQA with a fused query_key_value)
}

/// Eager attention: the probabilities kept per attended position (softmax output, its copies,
/// dropout); returns their bytes per token per position and head.
u64 eager_probabilities(const Layer& L, Kept& kept) {
  const ModelSpec& m = L.m;
  const Request& r = L.r;
  const u64 p = L.p, a = L.a;
  const FamilyActivations& fam = L.fam;
  const bool fp32_softmax = eager_softmax_in_fp32(L);
  u64 probs = fp32_softmax ? (p == 4 ? 4 : 6) : p;
  // Attention sinks: the logits get one more column (cat with the sinks) and are shifted by
  // their row max, which keeps its int64 indices: the softmax output is [b, nh, s, s + 1]
  // (measured, analyze_saved.py gpt_oss-tiny --lora --attention eager: (2,8,64,65) and an
  // int64 (2,8,64,1) per layer)
  if (m.attention_sinks) kept.keep(mul(a, add(probs, 8)));
  if (m.attn_logit_softcapping) probs = add(probs, p);  // tanh(scores / cap) keeps its output
  // dropout keeps its mask and the PV matmul its output; after an fp32 softmax the half copy
  // is dropout's input, which nothing keeps (measured, gpt_bigcode-tiny bf16 eager: fp32
  // softmax, bf16 noise, bf16 dropout output)
  if (m.attention_dropout > 0) {
    if (fp32_softmax && p != 4) probs = sub_floor(probs, p);
    probs = add(probs, add(dropout_mask(m.attention_dropout, r, p), p));
  }
  if (amp_scores_fp32(L) && !fp32_softmax) {
    // autocast runs softmax in fp32 (the autocast fp32 op list) even where the model does not
    // upcast: softmax keeps its fp32 output, and the PV matmul keeps a half copy of the (dropped)
    // probabilities. Dropout works on fp32 (keeping an fp32 mask; the matmul's cast is the copy),
    // or, where the model casts the probabilities to v's dtype first, on that half copy (a half
    // mask; its output is the copy). Measured, tuning case
    // gpt2/h192-L4-V1024/full/amp_bf16/nogc/eager/b1s256/sgd at the loss backward: per layer
    // an fp32 _softmax, a bf16 empty_like (the mask) and a bf16 mul, each [1, 6, 256, 256].
    probs = add(4, 2);
    if (m.attention_dropout > 0)
      probs = add(probs, dropout_mask(m.attention_dropout, r, fam.probs_to_value_dtype ? p : 4));
  }
  return probs;
}

/// Eager attention: the score tensors alive at its worst forward and backward moments.
void eager_score_moments(const Layer& L, u64 probs, AttentionKernel& ak) {
  const ModelSpec& m = L.m;
  const Request& r = L.r;
  const Dtypes& d = L.d;
  const u64 p = L.p, a = L.a;
  const FamilyActivations& fam = L.fam;
  const bool fp32_softmax = eager_softmax_in_fp32(L);
  ak.fwd_s = mul(2, p, a);
  // FalconAttention's eager path without alibi (modeling_falcon.py: `attention_scores =
  // F.softmax(attention_scores + attention_mask, ...)`) still holds the scaled q @ k^T scores
  // in its local while softmax runs on the masked sum: three [b, nh, s, s] at once (measured,
  // peak dump of tuning case falcon/h512-L2-V1024/lora-r8-all/fp32/nogc/eager/b2s160/adamw/gas2
  // at the last layer's _softmax: fp32 bmm, add and _softmax outputs, [2, 64, 160, 160] each)
  // BloomAttention keeps the baddbmm result and the masked scores as locals too (fp32: the
  // softmax's output is the probabilities; measured, peak dump of tuning case
  // bloom/h128-L2-V1024/lora-r8-mlp/fp32/nogc/eager/b1s512/sgd at layer 1's attention: fp32
  // baddbmm (4, 512, 512), add and _softmax (1, 4, 512, 512), and layer 0's _softmax; half
  // models are counted by fwd_only_s below)
  if (fam.scores_locals || (fam.scores_locals_fp32 && p == 4 && !d.amp)) ak.fwd_s = mul(3, p, a);
  // A forward (not a recomputation) of a half model that upcasts at softmax holds, at the
  // softmax, the half scores and masked scores, the fp32 copy and the softmax output
  // (measured, peak dump of tuning case bloom/h256-L3-V1024/lora-r32-qv/bf16/nogc/eager/b2s320/adamw
  // at the last layer's _softmax: bf16 baddbmm and add, fp32 _to_copy and _softmax, each
  // [2, 8, 320, 320]). (Families that compute the scores in fp32 keep the earlier count.)
  // eager_attention_forward (modeling_opt.py and the shared one) rebinds `attn_weights` at each
  // step, so `matmul(q, k^T) * scaling` is freed once the mask is added: one half score tensor
  // next to the two fp32 ones (timeline of tuning case
  // opt/h192-L2-V1024/full/bf16/nogc/eager/b4s448/adamw/gas2 at the last layer's _softmax: bf16
  // add, fp32 _to_copy and _softmax [4, 6, 448, 448], the bmm and mul outputs already freed).
  const u64 half_scores = (fam.scores_locals || fam.scores_locals_fp32) ? 2 : 1;
  if (fp32_softmax && p != 4 && !d.amp && !fam.qk_in_fp32) ak.fwd_only_s = mul(a, add(mul(half_scores, p), 8));
  // Backward over the scores: the PV matmul's node frees the probabilities it kept (the half
  // copy, or dropout's output), dropout's node frees its mask, then softmax's backward holds
  // its kept output, the incoming gradient and its result, all in the softmax dtype (measured,
  // peak dump of tuning case llama/h128-L4-V1024/full/amp_bf16/gc/eager/b1s1024/adafactor:
  // three fp32 [1, 8, 1024, 1024] at _softmax_backward_data, the bf16 copy already gone).
  // With dropout the moment before is dropout's backward: the softmax output, the mask and
  // two gradients in dropout's dtype.
  {
    const u64 sm = (fp32_softmax || amp_scores_fp32(L)) ? 4 : p;
    const u64 capped = m.attn_logit_softcapping ? p : 0;
    const u64 drop_dtype = (amp_scores_fp32(L) && !fp32_softmax && !fam.probs_to_value_dtype) ? 4 : p;
    u64 worst = add(capped, mul(3, sm));
    if (m.attention_dropout > 0)
      worst = std::max(worst, add(add(capped, sm), add(dropout_mask(m.attention_dropout, r, drop_dtype), mul(2, drop_dtype))));
    ak.bwd_s = mul(a, sub_floor(worst, probs));
  }
}

/// Eager attention (eager_attention_forward and the families' own `_attn`): what the score path keeps.
AttentionKernel eager_attention(const Layer& L, const Qkv& qkv, Kept& kept) {
  AttentionKernel ak;
  eager_qkv_kept(L, qkv, kept, ak);
  const u64 probs = eager_probabilities(L, kept);
  kept.per_pos = add(kept.per_pos, mul(L.a, probs));
  eager_score_moments(L, probs, ak);
  // at softmax's backward: the residual stream's incoming gradient (a parallel block's norm output
  // gradient too) and the PV matmul's gradient of v (attention_backward's measurements)
  ak.bwd_hidden_grads = L.m.parallel_block ? 2 : 1;
  ak.bwd_grad_v_bytes = L.p;
  return ak;
}

/// CPU SDPA's math path (_scaled_dot_product_attention_math), taken for MLA and attention dropout.
AttentionKernel sdpa_math_attention(const Layer& L, bool attn_in_shared, Kept& kept) {
  const ModelSpec& m = L.m;
  const Dtypes& d = L.d;
  const u64 p = L.p, a = L.a, qw = L.qw, kw = L.kw, vw = L.vw, ow = L.ow, tokens = L.tokens, seq = L.s;
  AttentionKernel ak;
  ak.math = sdpa_math_locals(L, attn_in_shared);
  if (m.attention_dropout <= 0) {
    // the math path without dropout (measured, deepseek_v3-tiny fp32 and bf16): q*scale
    // [b*nh,s,dqk], (k*scale)^T [b*nh,dqk,s], the softmax output [b,nh,s,s] and v
    // [b*nh,s,dv], all fp32 (half inputs are upcast on CPU); o_proj reads a model-dtype copy.
    kept.keep(mul(4, add(mul(2, qw), ow)));
    kept.per_pos = add(kept.per_pos, mul(4, a));
    ak.fwd_s = mul(2, 4, a);
    ak.bwd_s = mul(2, 4, a);
    // Its backward runs op by op like eager's: at _softmax_backward_data the residual stream's
    // incoming gradient and the PV bmm's fp32 gradient of v beside the two [s, s] (measured, peak
    // dump of tuning case deepseek_v3/h128-L2-V1024/full/fp32/gc/sdpa/b2s512/adamw: one fp32 add
    // (2, 512, 128) and a bmm (8, 512, 16) next to bmm and _softmax_backward_data (2, 4, 512, 512);
    // +2.84 % counting three [T, h])
    ak.bwd_hidden_grads = m.parallel_block ? 2 : 1;
    ak.bwd_grad_v_bytes = 4;
    return ak;
  }
  // CPU: the flash kernel refuses dropout_p > 0 (sdp_utils_cpp.cpp check_for_dropout), so
  // training falls back to _scaled_dot_product_attention_math, which upcasts half inputs
  // to fp32 on CPU and repeats K/V to every query head. Measured (analyze_saved.py,
  // gpt2/gpt_bigcode, fp32 and bf16 alike): q*scale [b*nh,s,d], (k*scale)^T [b*nh,d,s],
  // softmax output [b,nh,s,s], dropout noise mask [b,nh,s,s], dropout output [b*nh,s,s]
  // and v [b*nh,s,dv], all fp32. o_proj reads a model-dtype copy of the output.
  // An fp32 v that is a view of a fused q/k/v projection (GPT-2's c_attn(...).split) is
  // not copied when the batch is 1 (matmul folds [1, nh, s, d] to [nh, s, d] as a view; with
  // more rows the transposed view cannot fold and is copied), so the matmul keeps the whole
  // fused output alive (measured, peak dump of tuning case
  // gpt2/h256-L2-V1024/full/fp32/nogc/sdpa/b1s384/sgd: each layer's fp32 [384, 768] addmm
  // alive at the loss backward; one-shape gpt2 fp32 sdpa at batch 2 keeps a v copy). Half
  // inputs are upcast to a v copy.
  const bool v_views_fused = m.fused_qkv && p == 4 && !d.amp && tokens == seq;
  kept.keep(mul(4, add(mul(2, qw), v_views_fused ? add(qw, add(kw, vw)) : ow)));
  kept.per_pos = add(kept.per_pos, mul(12, a));
  ak.fwd_s = mul(2, 4, a);
  // Backward: the PV matmul's node makes the gradient of the dropout output (all three kept
  // tensors alive), then frees that output; the mask's mul makes the softmax output's
  // gradient next to its incoming one. Either moment: the kept tensors plus one fp32 [s, s]
  // per head (measured, tuning case biogpt/h256-L2-V1024/full/fp32/gc/sdpa/b2s384/sgd).
  ak.bwd_s = mul(4, a);
  return ak;
}

/// The key positions CUDA's memory-efficient SDPA pads an attention bias by: its last dim is
/// padded to a multiple of 8 (attention.cpp preprocess_mask, mem_eff_alignment) when it is not one.
u64 mem_efficient_bias_pad(u64 keys) { return keys % 8 == 0 ? 0 : 8 - keys % 8; }

/// SDPA's flash / memory-efficient kernels (CUDA, and CPU's flash kernel).
AttentionKernel sdpa_flash_attention(const Layer& L, Qkv qkv, Kept& kept) {
  const ModelSpec& m = L.m;
  const LayerGroup& g = L.g;
  const Request& r = L.r;
  const u64 p = L.p, a = L.a, qw = L.qw, kw = L.kw, ow = L.ow, seq = L.s;
  const bool gqa = L.gqa, mla = L.mla;
  const FamilyActivations& fam = L.fam;
  const ModuleImpl& impl = L.impl;
  const u64 lse = mul(4, a);  // flash / efficient kernels: fp32 log-sum-exp per head and query
  AttentionKernel ak;
  // Flash / memory-efficient kernels keep q, k, v, output and lse; with no padding mask
  // Transformers passes enable_gqa (no K/V copies). The output is laid out [b, s, heads, d],
  // so transpose(1, 2).contiguous() is a view and o_proj reads that same storage.
  // A sliding-window layer no longer than the sequence gets an explicit [b, 1, s, s] mask
  // (shared_forward_bytes), and with a mask Transformers does not use enable_gqa: repeat_kv
  // copies K and V to every query head (measured, mistral-tiny window 32 at s=64; and at
  // s = 32, peak dump of tuning case mistral/h256-L4-V1024/lora-r8-attn/bf16/nogc/sdpa/b3s32/adamw:
  // a (3, 1, 32, 32) where and K/V repeated to (3, 4, 4, 32, 16) per layer).
  // Falcon (rotary) builds its SDPA mask inside every layer: the flash kernel keeps that
  // layer's own [b, 1, s, s] mask, and with a mask K and V are copied to every query head
  // (measured, analyze_saved.py falcon-tiny --lora --attention sdpa, fp32: per layer a
  // (2,1,64,64) mask and q, k, v, out all (2,16,64,8); the fused output is not kept).
  // On CPU the generic SDPA path likewise turns a sliding-window mask into a float mask with
  // a where inside every layer, and that per-layer tensor is what the kernel keeps (measured,
  // peakdump mistral-tiny and phi3-tiny lora fp32 sdpa: a (2,1,64,64) where.self right before
  // each layer's SDPA, no model-level mask alive in backward).
  // Llama 4's chunked attention (attention_chunk_size no longer than the sequence) is a mask
  // like a window (measured, peak dump of llama4_text/lora/bf16/nogc/sdpa: each chunked
  // layer's SDPA keeps a (2,1,64,64) where output and K/V repeated to (2,2,4,64,16); the NoPE
  // layer, full causal, keeps neither).
  // CUDA takes the same path: Transformers' mask is the same bool tensor on every device
  // (masking_utils.py sdpa_mask), SDPA turns it into a float bias in the query dtype
  // (attention.cpp convert_boolean_attn_mask), and the memory-efficient kernel (flash takes no
  // mask) saves that bias for its backward (derivatives.yaml _scaled_dot_product_efficient_attention:
  // attn_bias is an input of the backward). preprocess_mask pads its last dim to a multiple of 8
  // (mem_eff_alignment) when the key length is not one, and the padded copy is what is saved.
  const bool windowed_here = g.local_mask(seq);
  const bool layer_mask = (fam.per_layer_mask && m.causal) || (windowed_here && m.causal);
  // With one K/V head, repeat_kv's expand + reshape is a view (the size-1 head dim merges with the
  // stride-0 repeat), and SDPA's kernel takes it as it is at any batch: the kernel keeps k and v at
  // their own width (measured, peak dump of tuning case
  // mistral/h64-L3-V2048/full/fp32/nogc/sdpa/b1s384/adafactor, window 32, 1 K/V head: per layer a
  // (1, 1, 384, 16) k and a (384, 16) v alive at the loss backward, no (1, 4, 384, 16) copies; at
  // two rows, of tuning case starcoder2/h64-L2-V1024/full/fp32/nogc/sdpa/b2s512/adamw: a (2, 1, 512,
  // 16) k and a (1024, 16) v per layer, no (2, 4, 512, 16) copies).
  // (Eager attention's kv_views, eager_qkv_kept, is a view at micro-batch 1 only: matmul's fold of
  // [b, heads] into one batch dim copies a stride-0 head dim when b > 1.)
  const bool kv_view = m.kv_heads == 1 && !impl.kv_copied_to_heads;
  if (gqa && !mla && !kv_view && (windowed_here || layer_mask || impl.kv_copied_to_heads)) {
    qkv.k = mul(p, qw);
    qkv.v = mul(p, ow);
  }
  if (layer_mask) kept.per_pos = add(kept.per_pos, p);
  if (layer_mask && r.device == Device::Cuda) kept.keep(mul(mem_efficient_bias_pad(seq), p));
  kept.keep(add(qkv.q, add(qkv.k, qkv.v)));
  kept.keep(add(mul(p, ow), lse));
  ak.out_is_kept = true;
  ak.bwd_tok = mul(p, add(qw, mul(2, kw)));
  return ak;
}

/// FlashAttention-2 (flash_attn_func): q, k, v, the output and lse.
AttentionKernel flash_attention2(const Layer& L, const Qkv& qkv, Kept& kept) {
  const u64 p = L.p, qw = L.qw, kw = L.kw, ow = L.ow;
  const u64 lse = mul(4, L.a);  // fp32 log-sum-exp per head and query
  AttentionKernel ak;
  kept.keep(add(qkv.q, add(qkv.k, qkv.v)));
  kept.keep(add(mul(p, ow), lse));
  ak.out_is_kept = true;
  ak.bwd_tok = add(mul(p, add(qw, mul(2, kw))), mul(4, qw));  // dq (fp32 accumulator), dk, dv
  return ak;
}

AttentionKernel attention_kernel(const Layer& L, const Qkv& qkv, bool attn_in_shared, Kept& kept) {
  switch (L.r.attention) {
    case AttentionImpl::Eager: return eager_attention(L, qkv, kept);
    case AttentionImpl::Sdpa:
      return L.cpu_sdpa_math ? sdpa_math_attention(L, attn_in_shared, kept) : sdpa_flash_attention(L, qkv, kept);
    case AttentionImpl::FlashAttention2: return flash_attention2(L, qkv, kept);
  }
  return {};
}


/// The block's tail (o_proj's input, the residual dropout, a post-attention norm): returns what of
/// it eager attention or the SDPA math path has released by its worst backward moment (0 otherwise).
u64 attention_tail(const Layer& L, const AttentionKernel& ak, Kept& kept) {
  const ModelSpec& m = L.m;
  const Request& r = L.r;
  const u64 p = L.p, h = L.h, ow = L.ow;
  const FamilyActivations& fam = L.fam;
  const ModuleImpl& impl = L.impl;
  // What the block keeps after the softmax and the PV matmul: o_proj's input, the residual
  // dropout's mask, Gemma-2's post-attention norm. Their nodes run before softmax's backward and
  // release it, so eager attention's worst backward moment no longer has it (measured, peak dumps
  // of tuning cases gemma2/h128-L2-V2048/full/fp32/gc/eager/b1s1024/sgd and
  // phi/h256-L2-V1024/full/bf16/gc/eager/b1s256/sgd/gas2 at _softmax_backward_data: no o_proj
  // input, no post_attention_layernorm input, no resid_dropout noise of the recomputed layer).
  const u64 before_tail = sub_floor(kept.saved, ak.v_excess);
  // o_proj's input: the attention output (a transpose copy in eager mode).
  const SlotKeep o_in = slot_keep(L, {LinearInput::AttnOut}, ow, p);
  kept.keep(o_in.extra);
  if (o_in.shared && !ak.out_is_kept) kept.keep(mul(p, ow));
  kept.held_by_ctx(o_in, mul(p, ow));
  // Phi, Phi-3, StableLM and GPT-NeoX build the rotated q by concatenating the rotary and
  // pass-through parts (cat): q is contiguous [b, heads, s, d], the CPU flash kernel's output
  // follows that layout, and transpose(1, 2).contiguous() is a copy that o_proj keeps (measured,
  // peakdump phi3-tiny lora fp32 sdpa: clone (2,64,8,16) next to the SDPA output)
  const bool cat_rotary = fam.rotary_by_cat;
  if (o_in.shared && ak.out_is_kept && (cat_rotary || impl.attn_output_copied) && r.device == Device::Cpu &&
      r.attention == AttentionImpl::Sdpa)
    kept.keep(mul(p, ow));
  kept.keep_hidden(mul(dropout_mask(m.hidden_dropout, r, p), h));  // residual dropout after o_proj
  // Gemma2/Gemma3 also normalise the attention and MLP outputs before the residual add
  // (post_attention_layernorm, post_feedforward_layernorm): each keeps what a norm keeps.
  const bool post_norms = fam.post_norms;
  if (post_norms) kept.keep_norm(norm_keeps(L, false));
  // (CPU SDPA's math path likewise: o_proj's node has run before the math ops' backward; measured,
  // peak dump of tuning case biogpt/h128-L3-V1024/full/fp32/gc/sdpa/b2s512/adamw at the PV bmm's
  // backward: neither the fp32 out_proj input nor the residual dropout's fp32 mask of layer 0)
  const bool unfused_attention = r.attention == AttentionImpl::Eager || L.cpu_sdpa_math;
  return unfused_attention ? sub_floor(kept.saved, before_tail) : 0;
}

/// What the MLP block keeps and the moments inside it (bytes per token unless named).
struct MlpBlock {
  u64 before = 0;             ///< what the layer had saved before the block
  u64 norm = 0;               ///< what the sequential block's second norm keeps
  u64 pre_attn = 0;           ///< of the MLP's saved tensors, those made before the attention runs
  SlotKeep down_in;           ///< what the Linears reading down_proj's input keep
  u64 per_layer_const = 0;    ///< saved tensors whose size does not scale with tokens (bytes per layer)
  u64 merged_grad = 0;        ///< PEFT-parametrised experts: the worst merged-weight gradient moment (bytes)
  u64 shared_expert_bwd = 0;  ///< a shared expert run first: its act * up backward node (bytes)
  u64 fwd_point = 0;          ///< dense MLP: largest live bytes per token at a forward moment inside it
  u64 recompute_point = 0;    ///< the same in a checkpointed layer's recomputation (stops early)
  bool recompute_stops = false;  ///< the recomputation ends before the layer's output exists
  bool experts_trained = false;  ///< MoE: the routed experts train (full, or PEFT-parametrised)
  u64 saved = 0;              ///< what the block keeps (its second norm and the tail included)
};


/// PEFT's parametrised experts and router (Transformers 5 MoE): the merged weights the ops keep
/// (per layer) and the worst moment of their gradients; returns whether the experts train.
bool moe_merged_weights(const Layer& L, MlpBlock& mb) {
  const LayerGroup& g = L.g;
  const TrainableLinears& t = L.t;
  const u64 p = L.p, h = L.h, tokens = L.tokens, moe_slots = L.moe_slots, adapter_bytes = L.adapter_bytes;
  const u64 wi = g.mlp_intermediate;
  const bool full = L.full, fp32_router = L.fam.fp32_router;
  bool experts_trained = full;
  u64 merged_in = 0, merged_hidden = 0;  // merged fused-expert weights read by gate_up / by down
  for (size_t i = 0; i < g.linears.size(); ++i) {
    const Linear& l = g.linears[i];
    if (full || !t.saves_input[i] || i >= t.parametrized.size() || !t.parametrized[i]) continue;
    if (l.routed) {
      experts_trained = true;
      mb.per_layer_const = add(mb.per_layer_const, mul(p, l.weight_params()));  // merged W + B@A
      if (l.input == LinearInput::MlpHidden) merged_hidden = add(merged_hidden, mul(p, l.weight_params()));
      else merged_in = add(merged_in, mul(p, l.weight_params()));
      // _LoraFactorsProxy: baddbmm(W, lhs, rhs) keeps the factors, which get_delta_factors casts
      // to the weight's dtype: new tensors when the adapters' dtype differs (fp32 adapters on a
      // bf16 model), views of the adapters otherwise. gate_up_proj: rank 2r, [E, 2i, 2r] and
      // [E, 2r, h] (half on each of gate and up); down_proj: [E, h, r] and [E, r, i].
      if (adapter_bytes != p) {
        const u64 out = l.input == LinearInput::MlpIn ? mul(2, l.out) : l.out;
        mb.per_layer_const = add(mb.per_layer_const, mul(p, t.lora_rank, l.copies, add(l.in, out)));
      }
    } else {
      // a parametrised router: F.linear keeps the merged weight W + B@A [E, h] (DeepSeek-V3: its fp32 cast)
      mb.per_layer_const = add(mb.per_layer_const, mul(fp32_router ? 4 : p, l.weight_params()));
    }
  }
  // The merged weight is a non-leaf needing a gradient, so each grouped_mm's backward makes a
  // weight gradient the size of the whole expert stack, in the model dtype, before baddbmm's
  // node turns it into the factors' gradients (the node was created just before that grouped_mm
  // when the parametrised weight was read, so it runs next and frees the gradient). At
  // down_proj's node both merged weights are saved; the weighting mul's node has released the
  // down output and left its gradient [S, h] in its place; the node makes dm [S, i] and the
  // weight gradient. At gate_up_proj's node down's merged weight, its input (act * up), the
  // activation output and the gate_up output are released; it makes the weight gradient next to
  // d(gate_up) [S, 2i]. Measured, peak dump of tuning case
  // mixtral/h512-L2-V2048/lora-r16-all/bf16/gc/eager/b1s24/sgd at the recomputed layer's
  // _grouped_mm backward: the bf16 baddbmm outputs [4, 3584, 512] and [4, 512, 1792], the
  // _grouped_mm weight gradient [4, 512, 1792] and dm [48, 1792] beside the saved tensors.
  if (merged_hidden > 0 || merged_in > 0)
    mb.merged_grad = std::max(add(merged_hidden, mul(tokens, moe_slots, p, wi)),
                           sub_floor(merged_in, add(merged_hidden, mul(tokens, moe_slots, p, add(mul(2, wi), h)))));
  // the routing weight per slot: fp32 where the router's top-k values stay fp32 (Mixtral's
  // softmax output, DeepSeek-V3's sigmoid scores); Qwen-MoE casts them to the model dtype
  // (the hidden states' dtype: fp32 under autocast)
  return experts_trained;
}

/// The MoE block: router, routed experts (fused, grouped_mm), a shared expert.
void moe_block(const Layer& L, Kept& kept, MlpBlock& mb) {
  const ModelSpec& m = L.m;
  const LayerGroup& g = L.g;
  const Dtypes& d = L.d;
  const u64 p = L.p, h = L.h, tokens = L.tokens, moe_slots = L.moe_slots, xp = L.xp;
  const FamilyActivations& fam = L.fam;
  // Transformers 5.x MoE blocks (Mixtral, Qwen2/3-MoE, DeepSeek-V3): the experts are fused
  // [E, ...] parameters run with grouped_mm over the token slots sorted by expert. Measured per
  // layer (analyze_saved.py on the tiny MoE configs, fp32/bf16, full and LoRA):
  //  - router: the fp32 softmax (sigmoid) scores [T, E], the top-k indices int64 [T, k], and
  //    when the top-k weights are renormalised (Mixtral, Qwen3-MoE, DeepSeek) their sum [T, 1]
  //    and the fp32 top-k values [T, k] kept by the division;
  //  - per routed slot (T*k of them): the int64 sort and inverse-sort indices, the gate_up
  //    output [Tk, 2i] (kept whole by the activation: gate and up are views of it), the
  //    activation output, the routing weight [Tk, 1] and the down output [Tk, h] (the weighting
  //    mul keeps both); with trained experts also the gathered input [Tk, h] and act*up [Tk, i]
  //    (grouped_mm keeps its input when its weight needs a gradient).
  //  - PEFT (0.21) adapts fused experts by parametrisation: the merged weight W + B@A of each
  //    fused tensor is a non-leaf that grouped_mm keeps, p x E x in x out per layer.
  const u64 e = g.experts, k = g.experts_per_token, wi = g.mlp_intermediate;
  const bool renorm = m.norm_topk_prob;  // top-k weights renormalised: the sum and division stay
  kept.keep(add(mul(4, e), add(mul(8, k), renorm ? add(4, mul(4, k)) : 0)));
  if (!g.experts_on_every_token)
    mb.per_layer_const = add(mb.per_layer_const, mul(4, e));  // int32 tokens-per-expert counts [E] (grouped_mm offsets)
  const bool experts_trained = moe_merged_weights(L, mb);
  mb.experts_trained = experts_trained;
  const u64 route_w = fam.fp32_route_weights ? 4 : d.residual;
  // Every expert on every token (Llama 4, modeling_llama4.py Llama4TextMoe / Llama4TextExperts):
  // E slots per token and no sort indices; per slot the mul weighting the repeated input keeps
  // that input [ET, h] and the scores' copy [ET, 1] (model dtype), the experts' bmm outputs as
  // above, and nothing keeps the down output (the slots are summed, sum keeps nothing); with
  // trained experts bmm also keeps its inputs (the weighted input and act*up). Measured, peak
  // dump of llama4_text/lora/fp32/gc/eager: [4, 128, 192] gate_up, [4, 128, 96] silu output and
  // the [512, 128] repeat output of the recomputed MoE layer.
  // gpt-oss's gate (modeling_gpt_oss.py GptOssExperts._apply_gate) keeps the clamped gate,
  // sigmoid(alpha * gate), up + 1 and glu: four [slots, i] tensors where act(gate) * up keeps
  // one (measured, analyze_saved.py gpt_oss-tiny --lora: four (256, 128) besides gate_up).
  const u64 gate_saves = g.clamped_glu_experts ? 4 : 1;
  const u64 per_slot = g.experts_on_every_token ? add(mul(p, wi, 3), add(p, mul(p, h)))
                                                : add(add(mul(3, 8), mul(xp, wi, add(2, gate_saves))), add(route_w, mul(xp, h)));
  const u64 routed_kept = mul(moe_slots, add(per_slot, experts_trained ? add(mul(xp, h), mul(xp, wi)) : 0));
  kept.keep(routed_kept);
  // A shared expert that runs first has its backward last: at its act * up node the routed
  // experts' saved tensors and its down_proj input are released, and dm, d(act), d(up) [T, i]
  // are alive beside the incoming gradient (measured, peak dump of tuning case
  // qwen2_moe/h256-L3-V2048/full/fp32/gc/eager/b4s64/sgd at layer 0's mul: six fp32 [256, 1408]
  // (gate and up outputs, silu's, dm and the two products' gradients) next to the routed stacks',
  // the router's and the shared down_proj's gradients; the weight gradients are estimate.cpp's)
  if (g.shared_intermediate > 0 && fam.shared_expert_first)
    mb.shared_expert_bwd = mul(tokens, sub_floor(add(mul(d.residual, h), mul(3, p, g.shared_intermediate)),
                                              add(routed_kept, mul(p, g.shared_intermediate))));
  if (g.shared_intermediate > 0) {
    // the shared expert is an ordinary gated MLP; Qwen2-MoE gates its output with a sigmoid
    kept.keep(mlp_keeps(L, g.shared_intermediate, 1));
    kept.keep(mb.down_in.extra);
    if (mb.down_in.shared) kept.keep(mul(p, g.shared_intermediate));
    kept.held_by_ctx(mb.down_in, mul(p, g.shared_intermediate));
    if (fam.sigmoid_gated_shared_expert) kept.keep(add(mul(p, h), p));  // shared output and sigmoid gate
  }
}

// Non-reentrant checkpointing stops the recomputation as soon as the last saved tensor is
// recomputed (torch/utils/checkpoint.py: early_stop=True, _StopRecomputationError raised
// from the pack hook, which autograd calls when an op saves its inputs, before the op runs).
// With nothing saved after down_proj (no residual dropout, no post norm), its outputs are
// never made again: a trained down_proj saves its input before its mm runs; an adapter's
// lora_B saves its input after the frozen base output exists (measured, peak dumps of
// one-shape gptj/lora/bf16/gc/eager: no [T, h] adapter output during the recomputation, and
// of tuning case llama/lora/bf16/gc/sdpa/dropout0.1: no scaled copy).
// GPT-2-style blocks keep their attn_output local through it.
u64 recompute_down_output(const Layer& L, MlpBlock& mb) {
  const ModelSpec& m = L.m;
  const u64 p = L.p, h = L.h, adapter_bytes = L.adapter_bytes;
  const bool post_norms = L.fam.post_norms;
  const bool saves_after_down = m.hidden_dropout > 0 || post_norms;
  u64 recompute_down_out = saves_after_down ? linear_output(L, LinearInput::MlpHidden, h)
                                            : (lora_on(L, LinearInput::MlpHidden) ? mul(p, h) : 0);
  // Stopping at lora_B, the layer's output is never made either. Measured with adapters in the
  // model dtype (tuning case phi3/h128-L2-V1024/lora-r16-all/fp32/gc/sdpa/b2s512/sgd_momentum
  // peaks at its MLP backward, below a recomputation counted with the output; fp32
  // phi3/lora/fp32/gc/* and llama/lora/fp32/gc/eager/dropout0.1 agree): there the output is
  // not counted, and at down_proj a second [T, h] beside the base output is (which tensor it
  // is, is not established: one peak dump shows lora_B's output, another none). With fp32
  // adapters on a half model the count above (base output, then the layer output) holds
  // (one-shape gptj/codegen lora/bf16/gc/eager, llama/lora/bf16/gc/sdpa/dropout0.1).
  if (lora_on(L, LinearInput::MlpHidden) && !saves_after_down && adapter_bytes == p) {
    mb.recompute_stops = true;
    recompute_down_out = mul(2, p, h);
  }
  // A residual dropout after down_proj keeps its noise, packed before its mul runs: the
  // recomputation stops there and never makes the dropped output or the layer's output (measured,
  // op-by-op live bytes of tuning case gpt_bigcode/h256-L3-V2048/lora-r16-mlp/fp32/gc/sdpa/b2s192/adamw:
  // the recomputation ends with the MLP's bernoulli noise; its peak, at c_fc's adapter, holds the
  // base output, lora_B's output and its scaled copy beside the attention output local, no [T, h] more).
  // Not with an adapter on down_proj: there the recomputation's worst moment may be at down_proj's
  // adapter, and cases that matched with this [T, h] counted (biogpt/lora/bf16/gc/sdpa,
  // gpt2/lora/fp32/gc/eager/dropout0.1) go down by up to 1 %: what it stands for there is not established.
  if (m.hidden_dropout > 0 && !post_norms && !lora_on(L, LinearInput::MlpHidden)) mb.recompute_stops = true;
  return recompute_down_out;
}

/// A dense MLP (gated or plain): what it keeps and its forward and recomputation moments.
void dense_mlp(const Layer& L, u64 first_norm_local, Kept& kept, MlpBlock& mb) {
  const ModelSpec& m = L.m;
  const LayerGroup& g = L.g;
  const Request& r = L.r;
  const u64 p = L.p, h = L.h, adapter_bytes = L.adapter_bytes, act_saves = L.act_saves;
  const bool relu = L.relu;
  const FamilyActivations& fam = L.fam;
  // Forward moments inside the MLP, where its [T, i] tensors pile up (bytes per token, with
  // what the layer has saved so far; each Linear's output as linear_output counts it).
  const u64 wi = g.mlp_intermediate;
  bool fused_gate_up = false;  // Phi-3: one gate_up_proj Linear [h -> 2i], chunked
  for (const Linear& l : g.linears)
    fused_gate_up = fused_gate_up || (l.input == LinearInput::MlpIn && l.out == mul(2, wi));
  if (m.mlp == MlpKind::Gated && fused_gate_up) {
    // gate_up(x) being computed: its [T, 2i] output (+ the adapter's)
    mb.fwd_point = add(kept.saved, linear_output(L, LinearInput::MlpIn, mul(2, wi)));
  } else if (m.mlp == MlpKind::Gated) {
    // gate(x) -> act (keeps its input, output kept by the mul) -> up(x) being computed
    mb.fwd_point = add(kept.saved, add(mul(p, wi, add(act_saves, 1)), linear_output(L, LinearInput::MlpIn, wi)));
  } else {
    // fc1(x) being computed
    mb.fwd_point = add(kept.saved, linear_output(L, LinearInput::MlpIn, wi));
  }
  mb.recompute_point = mb.fwd_point;
  kept.keep(mlp_keeps(L, wi, 1));
  kept.keep(mb.down_in.extra);
  const bool down_keeps_shared = mb.down_in.shared && !(m.mlp == MlpKind::Plain && relu);
  if (down_keeps_shared) kept.keep(mul(p, wi));
  kept.held_by_ctx(mb.down_in, mul(p, wi));
  // down_proj running: its input (a transient when nothing keeps it: the gated product, or the
  // output of an activation that keeps its input, e.g. gelu_new's last mul, measured
  // gpt2/lora/bf16/gc/eager: the bf16 [T, 4h] mul output alive through c_proj's forward) and output
  const bool act_out_kept = m.mlp == MlpKind::Plain && relu;  // relu keeps its output
  const u64 unsaved_in = (!act_out_kept && !down_keeps_shared) ? mul(p, wi) : 0;
  // With lora_dropout > 0 and an adapter dtype other than the model's, PEFT's LoRA forward
  // (peft 0.21 tuners/lora/layer.py Linear.forward) holds the input cast to the adapter dtype
  // in a local while lora_A and lora_B run: dropout keeps only its noise and lora_A the dropped
  // copy, so the cast is a transient of its own (measured, peak dump of tuning case
  // llama/lora/bf16/gc/sdpa/dropout0.1: an fp32 [T, i] _to_copy alive at the recomputed
  // down_proj's adapter)
  const u64 dropout_cast = (lora_on(L, LinearInput::MlpHidden) && r.lora.dropout > 0 && adapter_bytes != p)
                               ? mul(adapter_bytes, wi) : 0;
  const u64 at_down = add(kept.saved, add(unsaved_in, dropout_cast));
  mb.fwd_point = std::max(mb.fwd_point, add(at_down, linear_output(L, LinearInput::MlpHidden, h)));
  mb.recompute_point = std::max(mb.recompute_point, add(at_down, recompute_down_output(L, mb)));
  // GPT2Block / GPTBigCodeBlock keep the attention output (attn_output, after resid_dropout) as
  // a local until the block returns: a [T, h] alive through the MLP that nothing saves
  // (measured, gpt2/lora/bf16/gc/eager: the resid_dropout mul output next to ln_2's output)
  // StableLM keeps its first norm's output too, a tensor of its own unless the attention's
  // Linears keep it (trained, or adapters in its dtype) or the MLP reads it (parallel block).
  // Measured, peak dump of tuning case
  // stablelm/h384-L2-V1024/lora-r16-all/bf16/gc/eager/b4s128/adamw/gas2 at the recomputed
  // up_proj's `* scaling`: both bf16 native_layer_norm outputs and o_proj's bf16 output beside
  // the six fp32 adapter input casts, -2.2 % without these two [T, h].
  const u64 block_locals = add(fam.block_keeps_attn_output ? mul(p, h) : 0, first_norm_local);
  mb.fwd_point = add(mb.fwd_point, block_locals);
  mb.recompute_point = add(mb.recompute_point, block_locals);
}

/// The MLP block, from the sequential block's second norm to its residual dropout / post norm.
MlpBlock mlp_block(const Layer& L, u64 first_norm_local, Kept& kept) {
  const ModelSpec& m = L.m;
  const LayerGroup& g = L.g;
  const Request& r = L.r;
  const Dtypes& d = L.d;
  const u64 p = L.p, h = L.h, norm_out = L.norm_out;
  const bool full = L.full, relu = L.relu;
  const FamilyActivations& fam = L.fam;
  MlpBlock mb;
  mb.before = kept.saved;
  if (!m.parallel_block) {
    // NeoX / Falcon-40B read the same residual through both norms: its copy is kept once
    // (RMSNorm on half inputs makes separate fp32 copies).
    mb.norm = norm_keeps(L, m.parallel_two_norms && (m.norm != NormKind::RMSNorm || d.residual == 4));
    kept.keep_norm(mb.norm);
    const SlotKeep mlp_in = slot_keep(L, {LinearInput::MlpIn}, h, norm_out);
    kept.keep_hidden(mlp_in.extra);
    if (mlp_in.shared) kept.keep_hidden(mul(norm_out, h));
    kept.held_by_ctx(mlp_in, mul(norm_out, h));
    // FalconDecoderLayer with num_ln_in_parallel_attn == 2 runs ln_mlp before the attention
    // (modeling_falcon.py), so what it keeps is alive at the attention's forward moment (measured,
    // peak dump of tuning case falcon/h512-L2-V1024/lora-r8-all/fp32/nogc/eager/b2s160/adamw/gas2
    // at the last layer's _softmax: both norms' [2, 160, 512] outputs of that layer). GPT-NeoX
    // calls post_attention_layernorm after its attention.
    if (fam.mlp_norm_before_attention && m.parallel_two_norms)
      mb.pre_attn = add(mb.norm, mlp_in.shared ? mul(norm_out, h) : 0);
  }
  // down_proj's input: in an MoE layer only the shared expert's down_proj reads it as a Linear
  // (the routed experts' are counted with the MoE block), so its width is the shared expert's.
  mb.down_in = slot_keep(L, {LinearInput::MlpHidden}, g.moe ? g.shared_intermediate : g.mlp_intermediate, p);
  // Under autocast slot_keep counts a half cast of each trained Linear's input, but fc2's input is
  // relu's output, already half (fc1 ran in half) and kept by relu: autocast casts nothing and fc2
  // keeps that same tensor, as without autocast (measured, peak dump of tuning case
  // opt/h64-L3-V2048/full/amp_bf16/nogc/eager/b1s768/adamw: one bf16 relu [768, 256] per layer
  // and no half copy of it; a non-relu activation's output is a tensor of its own, kept by fc2)
  if (d.amp && full && !g.moe && m.mlp == MlpKind::Plain && relu)
    mb.down_in.extra = sub_floor(mb.down_in.extra, mul(d.compute, g.mlp_intermediate));
  if (g.moe) moe_block(L, kept, mb);
  else dense_mlp(L, first_norm_local, kept, mb);
  kept.keep_hidden(mul(dropout_mask(m.hidden_dropout, r, p), h));
  if (fam.post_norms) kept.keep_norm(norm_keeps(L, false));
  mb.saved = sub_floor(kept.saved, mb.before);
  return mb;
}

/// The walk of one layer: what each block keeps and the moments they leave for the totals below.
struct LayerWalk {
  Kept kept;
  AttentionInput in;
  AttentionKernel ak;
  u64 attn_tail = 0;      ///< see attention_tail
  bool unfused = false;   ///< eager attention or CPU SDPA's math path (LayerActivations::attention_backward_unfused)
  MlpBlock mb;
};

LayerWalk walk_layer(const Layer& L) {
  LayerWalk w;
  w.in = attention_input(L, w.kept);
  const Qkv qkv = projections(L, w.kept);
  w.ak = attention_kernel(L, qkv, w.in.readers.shared, w.kept);
  w.attn_tail = attention_tail(L, w.ak, w.kept);
  w.unfused = L.r.attention == AttentionImpl::Eager || L.cpu_sdpa_math;
  w.mb = mlp_block(L, w.in.first_norm_local, w.kept);
  return w;
}


/// What the layer keeps for backward, in total and by part.
void saved_totals(const Layer& L, const LayerWalk& w, LayerActivations& out) {
  const ModelSpec& m = L.m;
  const Request& r = L.r;
  const FamilyActivations& fam = L.fam;
  const Kept& kept = w.kept;
  const SlotKeep& attn_in = w.in.readers;
  const u64 p = L.p, h = L.h, a = L.a, s = L.s, tokens = L.tokens, norm_out = L.norm_out,
            first_norm = w.in.first_norm, first_qk_unkept = w.ak.first_qk_unkept, before_mlp = w.mb.before,
            mlp_norm = w.mb.norm, per_layer_const = w.mb.per_layer_const;
  const bool gemma_norm = L.gemma_norm;
  out.saved = add(mul(kept.saved, tokens), mul(kept.per_pos, tokens, s));
  if (gemma_norm && m.norm == NormKind::RMSNorm) out.saved = add(out.saved, mul(kept.norms, 4, h));  // (1 + weight) fp32
  out.saved = add(out.saved, per_layer_const);
  out.saved_hidden = mul(kept.hidden, tokens);
  out.first_norm = mul(add(first_norm, attn_in.masks), tokens);
  out.mlp_saved = mul(sub_floor(kept.saved, before_mlp), tokens);
  out.attn_saved = add(mul(before_mlp, tokens), mul(kept.per_pos, tokens, s));
  out.first_norm_slot = mul(add(attn_in.extra, attn_in.shared ? mul(norm_out, h) : 0), tokens);
  out.mlp_norm = mul(mlp_norm, tokens);
  out.first_qk_unkept = mul(first_qk_unkept, tokens);
  if (r.attention == AttentionImpl::Eager && fam.loop_keeps_attention_probs) out.returned_probs = mul(p, a, tokens, s);
}

/// The attention's forward moment (bytes, beyond the layer's saved total): its score tensors that
/// the layer does not keep and the tensors around them, less what the MLP block saves after it
/// (`mlp_after_attn` per token), which does not exist yet.
u64 attention_forward_point(const Layer& L, const LayerWalk& w, u64 mlp_after_attn) {
  const Request& r = L.r;
  const FamilyActivations& fam = L.fam;
  const Dtypes& d = L.d;
  const Kept& kept = w.kept;
  const MathLocals& math = w.ak.math;
  const u64 p = L.p, h = L.h, qw = L.qw, kw = L.kw, s = L.s, tokens = L.tokens, fwd_s = w.ak.fwd_s;
  // eager's score tensors exist at the attention moment, before the MLP has saved anything;
  // the MLP moments come after they are freed
  // (fwd_s counts every score tensor alive at the worst moment of the attention forward; the
  // ones the layer keeps are already in its saved total, so only the excess is transient:
  // measured, tuning cases biogpt/h256-L2-V1024/full/fp32/gc/sdpa/b2s384/sgd and
  // gpt_bigcode/h256-L2-V1024/full/fp32/gc/eager/b2s384/sgd, whose recomputed forward never
  // holds more [s, s] tensors than the layer keeps)
  // (CPU SDPA's math path: its own locals, see sdpa_math_locals, instead of the layer output's two [T, h])
  // FalconAttention.forward and BloomAttention.forward keep query_key_value's output
  // (`fused_qkv`) as a local until they return (tensor log of tuning case
  // falcon/h192-L2-V1024/lora-r16-mlp/fp32/nogc/eager/b2s256/adamw: layer 1's mm [512, 240]
  // alive at its _softmax, freed after the PV matmul; peak dump of
  // bloom/h128-L2-V1024/lora-r8-mlp/fp32/nogc/eager/b1s512/sgd: addmm (512, 384) at layer 1's attention)
  const bool fused_qkv_kept = fam.fused_qkv_local;
  const u64 fused_qkv_local = fused_qkv_kept && r.attention == AttentionImpl::Eager ? mul(tokens, p, add(qw, mul(2, kw))) : 0;
  const u64 unkept_scores = mul(sub_floor(fwd_s, kept.per_pos), tokens, s);
  if (math.on) {
    // The math path's worst moment is its score products (the score tensors the layer does not
    // keep) or its return (the half copy of the probabilities), not both: the masked scores are
    // freed by _safe_softmax before `attn.to(origin_dtype)` copies its output (measured, tensor log
    // of tuning case deepseek_v3/h128-L2-V1024/full/amp_bf16/gc/sdpa/b1s512/adamw: the fp32
    // [1, 4, 512, 512] add freed one op before the bf16 _to_copy of the _safe_softmax output, in
    // the forward and the recomputation alike)
    const u64 scores = std::max(unkept_scores, mul(math.tok_s, tokens, s));
    return sub_floor(add(scores, add(mul(math.tok, tokens), math.layer)), mul(tokens, mlp_after_attn));
  }
  const u64 around_scores = add(mul(tokens, 2, d.residual, h), fused_qkv_local);
  return sub_floor(add(unkept_scores, around_scores), mul(tokens, mlp_after_attn));
}

/// The worst moments of the layer's forward and of its recomputation under checkpointing.
void forward_moments(const Layer& L, const LayerWalk& w, LayerActivations& out) {
  const LayerGroup& g = L.g;
  const Dtypes& d = L.d;
  const Kept& kept = w.kept;
  const u64 p = L.p, h = L.h, s = L.s, tokens = L.tokens, moe_slots = L.moe_slots, xp = L.xp,
            fwd_s = w.ak.fwd_s, fwd_only_s = w.ak.fwd_only_s, mlp_fwd_point = w.mb.fwd_point,
            mlp_recompute_point = w.mb.recompute_point, width_i = L.mlp_width, wp = L.mlp_elem;
  const bool recompute_stops_in_mlp = w.mb.recompute_stops;
  // Forward transient: eager's unsaved score tensors, or an MLP intermediate between ops,
  // plus the layer output.
  out.forward_transient = add(mul(fwd_s, tokens, s), mul(tokens, add(mul(wp, width_i), mul(2, d.residual, h))));
  const u64 mlp_after_attn = sub_floor(w.mb.saved, w.mb.pre_attn);
  const u64 attn_point = attention_forward_point(L, w, mlp_after_attn);
  if (!g.moe) {
    // dense: the MLP moments, the layer output next to its input
    const u64 fwd_attn_point = fwd_only_s > fwd_s ? sub_floor(add(mul(sub_floor(fwd_only_s, kept.per_pos), tokens, s), mul(tokens, 2, d.residual, h)),
                                                               mul(tokens, mlp_after_attn))
                                                     : attn_point;
    out.forward_transient = std::max(fwd_attn_point, mul(tokens, add(sub_floor(mlp_fwd_point, kept.saved), mul(d.residual, h))));
    out.recompute_transient = std::max(attn_point, mul(tokens, add(sub_floor(mlp_recompute_point, kept.saved), recompute_stops_in_mlp ? 0 : mul(d.residual, h))));
  } else {
    // MoE: an expert intermediate per routed slot and the layer output next to its input.
    // Biased experts (gpt-oss) gather each slot's biases, gate_up_proj_bias[expert_ids] [S, 2i]
    // and down_proj_bias[expert_ids] [S, h], into locals of grouped_mm_experts_forward
    // (transformers integrations/moe.py) that live until it returns (measured, peak dump of
    // gpt_oss/lora/fp32/gc/eager: index (256, 256) and (256, 128) at the recomputed MoE block).
    u64 gathered_bias = 0;
    for (const Linear& l : g.linears)
      if (l.routed && l.bias && !g.experts_on_every_token) gathered_bias = add(gathered_bias, mul(moe_slots, xp, l.out));
    out.forward_transient = std::max(attn_point, mul(tokens, add(add(mul(wp, width_i), gathered_bias), mul(2, d.residual, h))));
    out.recompute_transient = out.forward_transient;
    // Every expert on every token (Llama4TextMoe.forward): the weighted input `routed_in` and
    // the experts' output `routed_out` [E*T, h] are locals alive while the shared expert runs,
    // which is where the recomputation stops (its down_proj's last saving op); by then the
    // expert intermediates are saved (measured, peak dump of llama4_text/lora/fp32/gc/eager:
    // mul (512, 128) and bmm (4, 128, 128) next to the shared expert's down_proj outputs).
    // Trained experts: the first bmm keeps `routed_in` (moe_block's saved total), so only
    // `routed_out` is extra (measured, peak dump of tuning case
    // llama4_text/h128-L4-V1024/full/fp32/gc/sdpa/b2s256/adamw: one mul (2048, 128) and one bmm
    // (4, 512, 128) in the recomputed MoE layer; +4.60 % counting the weighted input twice).
    if (g.experts_on_every_token) {
      const u64 locals = mul(w.mb.experts_trained ? 1 : 2, moe_slots, p, h);
      out.recompute_transient = std::max(attn_point, mul(tokens, add(locals, add(mul(d.residual, h), mul(2, p, h)))));
    }
  }
}

// Autocast without checkpointing keeps every Linear's half weight copy from the forward (states.cpp
// casts); the down projection's (dense MLPs) is the one its node releases in the MLP's backward.
bool amp_weight_casts_kept(const Layer& L) {
  return L.d.amp && !L.r.gradient_checkpointing && L.r.task != Task::Qlora && !L.g.frozen;
}

// Checkpointing under autocast (full fine-tune, dense layers): the recomputed forward casts every
// trained Linear's weight to half again (the first forward's cast cache is gone) and each mm keeps
// its copy for the input gradient until its own node runs. Measured without gradient accumulation
// only: with it, a later micro-batch's fp32 weight gradient is a temporary that AccumulateGrad adds
// into the existing .grad and frees at once (op-by-op live bytes of tuning case
// gemma/h384-L2-V4096/full/amp_bf16/gc/eager/b1s128/sgd/gas2: `add_` of down_proj's [384, 3072]
// right after its fp32 cast), which the moments past the node do not describe: there the rule read
// +2.5 % and the moments without it -0.2 %, so accumulation keeps them.
bool amp_recomputed_casts(const Layer& L) {
  return L.d.amp && L.r.gradient_checkpointing && L.full && !L.g.moe && !L.g.frozen &&
         L.r.gradient_accumulation_steps <= 1;
}

/// The MoE block's backward moments; returns the worst of them and `mlp_bwd` (bytes).
u64 moe_backward(const Layer& L, const LayerWalk& w, u64 mlp_bwd, LayerActivations& out) {
  const LayerGroup& g = L.g;
  const Dtypes& d = L.d;
  const u64 h = L.h, tokens = L.tokens, moe_slots = L.moe_slots, xp = L.xp, merged_grad = w.mb.merged_grad,
            shared_expert_bwd = w.mb.shared_expert_bwd;
  const bool full = L.full;
  // MoE backward, measured (peakdump, deepseek_v3/lora/fp32/gc/sdpa): with every saved tensor
  // of the block still alive, the incoming gradient [T, h] and three [T*k, h] gradients are
  // live at once: the contiguous [T, k, h] gradient of the weighted slot sum (clone), the
  // weighting mul's gradient of the down output (allocated by the autograd engine, no
  // dispatcher op) and the zero-filled gradient of the slots' index gather (new_zeros).
  // Every expert on every token (Llama4TextMoe): the scores weight the experts' input, not their
  // output, and no index gather runs; the first nodes (add_, the sum over experts, the reshape
  // back to routed_out's [E*T, h]) leave one [E*T, h] gradient, the reshape's copy (measured,
  // peak dump of tuning case llama4_text/h128-L4-V1024/full/fp32/gc/sdpa/b2s256/adamw: one fp32
  // clone (4, 512, 128) in the recomputed MoE layer's backward; counting three read +1.63 %).
  const u64 start_grads = g.experts_on_every_token ? 1 : 3;
  out.moe_backward_start = mul(tokens, add(mul(d.residual, h), mul(start_grads, moe_slots, xp, h)));
  out.shared_expert_backward = shared_expert_bwd;
  mlp_bwd = std::max(mlp_bwd, out.moe_backward_start);
  mlp_bwd = std::max(mlp_bwd, add(mul(tokens, d.residual, h), merged_grad));
  if (g.experts_on_every_token) return mlp_bwd;
  // At the act * up node: d(act) and d(up) [S, i] next to dm [S, i] and the incoming gradient,
  // and the saved tensors the nodes after it have released: the down output and routing weight
  // (the weighting mul's) and, where down's weight needs a gradient, act * up (grouped_mm keeps
  // its input only then). Trained experts have made the down stack's gradient by then (estimate.cpp
  // adds it to this moment). Measured, peak dumps of mixtral/h128-L2-V1024/full/bf16/gc/sdpa/b3s512
  // and b2s512/sgd_momentum at the recomputed layer 0's mul: two mul [S, i] beside _grouped_mm's
  // dm [S, i], the gate_up output and silu's, both layers' down-stack gradients, no act * up and no
  // down output; the dense MLP's 3 x [S, i] over every saved tensor read +8.6 % and +6.9 % there,
  // and +1.5 % on the frozen experts of mixtral/h128-L2-V1024/lora-r8-attn/bf16/gc/sdpa/b3s512.
  const u64 wi = g.mlp_intermediate, route_w = L.fam.fp32_route_weights ? 4 : d.residual;
  const u64 released_by_mul = mul(tokens, moe_slots, add(mul(xp, add(h, w.mb.experts_trained ? wi : 0)), route_w));
  const u64 at_mul = sub_floor(add(mul(tokens, d.residual, h), mul(tokens, moe_slots, xp, mul(3, wi))), released_by_mul);
  if (!full) return std::max(mlp_bwd, at_mul);
  // Trained fused experts (full fine-tuning): gate_up's grouped_mm node makes its input gradient
  // [S, h] and then the weight gradient of the whole stack [E, h, 2i] next to d(gate_up) [S, 2i];
  // by then the block's nodes after it have released gate_up's output, the activation's, act * up
  // and the down output. Measured, peak dump of tuning case
  // mixtral/h512-L2-V2048/full/bf16/gc/eager/b4s64/sgd at the recomputed layer 0's _grouped_mm:
  // the bf16 [4, 3584, 512] weight gradient, cat [512, 3584], _grouped_mm [512, 512] and the
  // gathered input beside down_proj's [4, 512, 1792] gradient (estimate.cpp adds the latter).
  u64 stack = 0;
  for (const Linear& l : g.linears)
    if (l.routed && l.input == LinearInput::MlpIn) stack = add(stack, l.weight_params());
  const u64 gate_saves = g.clamped_glu_experts ? 4 : 1;
  const u64 made = add(mul(tokens, add(mul(d.residual, h), mul(moe_slots, xp, add(mul(2, wi), h)))), mul(xp, stack));
  const u64 released = mul(tokens, moe_slots, xp, add(mul(wi, add(3, gate_saves)), h));
  out.moe_weight_grad_moment = std::max(sub_floor(made, released), at_mul);
  return mlp_bwd;
}

/// The MLP block's backward moments (dense and MoE): mlp_backward_transient and mlp_backward_at_down.
void mlp_backward(const Layer& L, const LayerWalk& w, LayerActivations& out) {
  const ModelSpec& m = L.m;
  const LayerGroup& g = L.g;
  const Dtypes& d = L.d;
  const SlotKeep& down_in = w.mb.down_in;
  const u64 p = L.p, h = L.h, tokens = L.tokens, act_saves = L.act_saves, width_i = L.mlp_width,
            wp = L.mlp_elem;
  const bool full = L.full, relu = L.relu, amp_casts_kept = amp_weight_casts_kept(L);
  // MLP backward (dense layers), measured op by op on CPU (validate/NOTES.md): the incoming
  // residual gradient g [T, h] is alive throughout. down_proj's node computes the gradient of its
  // input dm [T, i] and then releases what it saved (its input, LoRA's rank-r intermediate and
  // casts); with a LoRA adapter on down_proj the base and adapter paths each produce a [T, i]
  // gradient and the engine sums them out of place (3 x [T, i] at once). A gated MLP's mul node
  // then produces d(act) and d(up) next to dm (3 x [T, i]) before releasing act and up.
  // (fused experts sorted by expert: their act * up node's moment is moe_backward's)
  const bool fused_experts = g.moe && !g.experts_on_every_token;
  u64 mlp_bwd = fused_experts ? 0 : mul(tokens, mul(3, wp, width_i));
  u64 mlp_at_down = 0;  // dense MLPs: the down projection's node (MoE: its whole worst moment)
  if (g.moe) mlp_bwd = moe_backward(L, w, mlp_bwd, out);
  u64 down_cast = 0;  // the down projection's half weight copy (see amp_weight_casts_kept)
  for (const Linear& lin : g.linears)
    if (amp_casts_kept && lin.input == LinearInput::MlpHidden && !lin.routed) down_cast = add(down_cast, mul(2, lin.weight_params()));
  if (!g.moe) {
    const bool down_lora = !full && down_in.shared;  // an adapter on down_proj (it keeps the input)
    const u64 many = (m.mlp == MlpKind::Gated || down_lora) ? 3 : 2;
    u64 released = down_in.extra;                 // rank-r intermediate, casts
    if (down_in.shared && !relu) released = add(released, mul(p, g.mlp_intermediate));
    // A residual dropout after the down projection (OPT, BioGPT, GPT-2: hidden dropout > 0) is
    // the block's last op: its mul node runs first in the block's backward and frees its mask
    // (torch/csrc/autograd/engine.cpp releases a node's saved variables once it has run), so at
    // every MLP moment that part of the layer's saved tensors is gone. Its output, the gradient of
    // down_proj's output [T, h], is a tensor of its own, the input of down_proj's node(s), alive
    // until they have run (measured: peak dump of opt/lora/fp32/gc/sdpa at the add of fc2's base
    // and adapter input gradients: one fp32 [T, h] noise, the attention's, and no dropout
    // gradient; of tuning case biogpt/h256-L2-V1024/full/fp32/gc/sdpa/b2s384/sgd at fc2's weight
    // gradient mm: the mask gone, the dropout's backward mul [2, 384, 256] next to dm).
    const u64 dropout_mask_freed = mul(dropout_mask(m.hidden_dropout, L.r, p), h);
    const u64 dropout_grad = m.hidden_dropout > 0 ? mul(p, h) : 0;
    const u64 at_dgrad = add(mul(p, g.mlp_intermediate), dropout_grad);  // dm before down's saved tensors go
    const u64 after = sub_floor(mul(many, p, g.mlp_intermediate), released);
    // Inside the activation's backward, next to its incoming gradient: BloomGelu's hand-written
    // backward (bloom_gelu_back) holds tanh_out, tanh_out^2, 1 - tanh_out^2 and two products, 5 x
    // [T, i] (measured, bloom/lora/fp32/gc/eager); a fused kernel (silu, gelu) only its output.
    // GELU written in Python ops (gelu_new: four saved [T, i] tensors) has two [T, i] gradients
    // alive at its mul nodes next to dm, in parallel and sequential blocks, whether or not the
    // down projection keeps its input (measured, peak dumps: seven fp32 [768, 1024] at a mul in
    // tuning case codegen/h256-L2-V1024/full/fp32/gc/eager/b2s384/sgd, seven bf16 [256, 1024] in
    // gpt2/h256-L2-V1024/lora-r8-qv/bf16/gc/eager/b2s128/sgd, seven bf16 [128, 512] with c_proj's
    // input already released in gpt2/full/bf16/gc/sdpa).
    const u64 act_live = m.activation == "bloom_gelu" ? 5 : (act_saves == 4 ? 2 : 1);
    const u64 at_act = sub_floor(mul(add(1, act_live), p, g.mlp_intermediate), released);
    mlp_bwd = mul(tokens, sub_floor(add(mul(d.residual, h), std::max({at_dgrad, after, at_act})), dropout_mask_freed));
    mlp_at_down = mul(tokens, sub_floor(add(mul(d.residual, h), at_dgrad), dropout_mask_freed));
    if (amp_casts_kept) {
      // Autocast, no checkpointing: the down projection's node releases its saved half weight copy
      // with its input, and its half weight gradient is cast to the fp32 .grad (ToCopyBackward,
      // estimate.cpp's down_grad) and freed before the activation's backward runs: at the moments
      // after the node, one cast fewer is alive and no half gradient (measured, op-by-op live
      // bytes of tuning-shaped gpt2/h384-L2-V2048/full/amp_bf16/nogc/eager/b2s96/sgd: c_proj's
      // bf16 [1536, 384] copy freed right after its addmm backward, its bf16 gradient right after
      // the fp32 cast, both before gelu_new's first mul backward).
      const u64 later = sub_floor(mul(tokens, std::max(after, at_act)), down_cast);
      mlp_bwd = sub_floor(add(mul(tokens, d.residual, h), std::max(mul(tokens, at_dgrad), later)), mul(tokens, dropout_mask_freed));
    }
    if (amp_recomputed_casts(L)) {
      // Checkpointing under autocast: at down_proj's node every half copy the recomputation made is
      // alive, with down_proj's half weight gradient; the node then frees its copy, and its half
      // gradient is cast to the fp32 .grad and freed (ToCopyBackward) before the activation's backward:
      // from there the other Linears' copies (the attention's included) are alive and no half
      // gradient (measured, op-by-op live bytes of tuning case
      // gpt2/h256-L3-V1024/full/amp_bf16/gc/sdpa/b3s128/sgd in the recomputed layer: c_proj's bf16
      // [1024, 256] copy freed right after its weight-gradient mm, the fp32 gradient made and the bf16
      // one freed next; the peak at gelu_new's mul backward with the bf16 copies of c_fc [256, 1024],
      // c_attn [256, 768] and the attention's c_proj [256, 256]). estimate.cpp adds down_proj's
      // gradient (down_grad, new_grads) to every MLP moment: at the node its half gradient stands in
      // for the fp32 one, not made yet and twice its size, so the half one is not added here.
      u64 all_casts = 0, down_w = 0;
      for (size_t i = 0; i < g.linears.size(); ++i) {
        if (g.linears[i].routed || !L.t.saves_input[i]) continue;
        all_casts = add(all_casts, mul(p, g.linears[i].weight_params()));
        if (g.linears[i].input == LinearInput::MlpHidden) down_w = add(down_w, g.linears[i].weight_params());
      }
      const u64 at_node = add(mul(tokens, at_dgrad), all_casts);
      const u64 later = add(mul(tokens, std::max(after, at_act)), sub_floor(all_casts, mul(p, down_w)));
      mlp_bwd = sub_floor(add(mul(tokens, d.residual, h), std::max(at_node, later)), mul(tokens, dropout_mask_freed));
      mlp_at_down = add(mlp_at_down, all_casts);
    }
  }
  out.mlp_backward_transient = mlp_bwd;
  out.mlp_backward_at_down = g.moe ? mlp_bwd : mlp_at_down;
}

/// The attention block's worst backward moment, and what the MLP and the block's tail have released by then.
void attention_backward(const Layer& L, const LayerWalk& w, LayerActivations& out) {
  const ModelSpec& m = L.m;
  const LayerGroup& g = L.g;
  const Request& r = L.r;
  const Dtypes& d = L.d;
  const u64 h = L.h, ow = L.ow, s = L.s, tokens = L.tokens, norm_out = L.norm_out,
            bwd_s = w.ak.bwd_s, bwd_tok = w.ak.bwd_tok, attn_tail = w.attn_tail, mlp_norm = w.mb.norm,
            per_layer_const = w.mb.per_layer_const, mlp_saved = w.mb.saved;
  const bool unfused_attention = w.unfused, amp_casts_kept = amp_weight_casts_kept(L);
  // A parallel block's MLP Linears read the first norm's output: what they keep of it (LoRA's own
  // casts and rank-r outputs, autocast's half casts, the output itself when only they read it)
  // goes when their nodes run, before the attention's backward (measured, peak dump of tuning
  // case phi/h128-L3-V1024/lora-r32-all/bf16/gc/eager/b2s384/sgd at _softmax_backward_data:
  // the fp32 casts and lora_A outputs of q, k and v, none of fc1's)
  u64 mlp_readers = 0;
  if (m.parallel_block) {
    const SlotKeep mlp_side = slot_keep(L, {LinearInput::MlpIn}, h, norm_out), attn_side = slot_keep(L, {LinearInput::AttnIn}, h, norm_out);
    mlp_readers = add(mlp_side.extra, mlp_side.shared && !attn_side.shared ? mul(norm_out, h) : 0);
  }
  // By the attention's backward the MoE block has released its per-layer tensors too: PEFT's
  // merged expert weights W + B@A that grouped_mm kept (measured, peak dump of tuning case
  // mixtral/h128-L3-V2048/lora-r8-all/fp32/gc/eager/b1s768/adamw: at the recomputed layer's
  // _softmax_backward_data no [4, 896, 128] beside the parameters)
  const u64 attn_released = add(mul(tokens, add(add(mlp_saved, attn_tail), mlp_readers)), per_layer_const);
  out.mlp_norm_backward = mlp_norm_backward(m, r, mlp_saved, mlp_norm, tokens, per_layer_const);
  const u64 attn_bwd = sub_floor(add(mul(tokens, bwd_tok), mul(bwd_s, tokens, s)), attn_released);
  // Gradients of the attention moment besides the score terms: three [T, h] in general; at eager
  // softmax's backward the residual stream's incoming gradient only in a sequential block, also
  // the norm output's gradient from the MLP side (waiting for the attention's) in a parallel one,
  // and the PV matmul's gradient of v (measured, peak dumps at _softmax_backward_data of tuning
  // cases gemma2/h128-L2-V2048/full/fp32/gc/eager/b1s1024/sgd: one fp32 [1, 1024, 128] add and a
  // [4, 1024, 32] bmm; phi3/h256-L2-V2048/full/fp32/nogc/eager/b1s256/adamw_fused: one add and a
  // [16, 256, 16] bmm; llama/h128-L4-V1024/full/amp_bf16/gc/eager/b1s1024/adafactor: one fp32 add
  // and a bf16 [8, 1024, 16] bmm; phi/h128-L3-V1024/lora-r32-all/bf16/gc/eager/b2s384/sgd: two
  // bf16 [2, 384, 128] adds and a [16, 384, 16] bmm)
  const u64 residual_grads = w.ak.bwd_hidden_grads > 0 ? w.ak.bwd_hidden_grads : 3;
  const u64 grad_v = mul(w.ak.bwd_grad_v_bytes, ow);
  out.attention_backward_transient = add(mul(tokens, add(mul(residual_grads, d.residual, h), grad_v)), attn_bwd);
  // the same before what the MLP and the block's tail released is taken off (the moment's own
  // gradients are added to it in estimate.cpp before that subtraction)
  out.attention_backward_gross = add(mul(tokens, add(mul(residual_grads, d.residual, h), grad_v)), add(mul(tokens, bwd_tok), mul(bwd_s, tokens, s)));
  out.attention_released = attn_released;
  if (amp_casts_kept && !g.moe) {
    // Autocast, no checkpointing: by the attention's worst backward moment the MLP's and the
    // output projection's nodes have run and released their half weight copies, and each half
    // weight gradient has been cast to its fp32 .grad and freed (measured, op-by-op live bytes of
    // tuning-shaped bloom/h256-L2-V1024/full/amp_bf16/nogc/eager/b1s128/sgd: the bf16 copies of
    // dense_4h_to_h, dense_h_to_4h and dense freed after their addmm backward, no bf16 weight
    // gradient alive at _softmax_backward_data).
    for (const Linear& lin : g.linears)
      if (!lin.routed && (lin.input == LinearInput::MlpIn || lin.input == LinearInput::MlpHidden || lin.input == LinearInput::AttnOut))
        out.attention_released = add(out.attention_released, mul(2, lin.weight_params()));
  }
  out.attention_backward_unfused = unfused_attention;
}

/// Post-norm layers (BertLayer: LayerNorm(dropout(dense(x)) + residual) ends both blocks): the
/// layer's last LayerNorm is the first node of its backward, so the input and statistics it saved
/// are gone at every later moment of that backward. A pre-norm layer keeps as many norms, but its
/// output-side one is the next layer's first norm, released only after this layer's backward
/// (measured, peak dump of tuning case bert/h128-L2-V1024/cls/full/fp32/nogc/sdpa/b2s128/adamw in
/// the last layer's output.dense backward: its second norm's add output and statistics gone, the
/// other layers' alive).
void post_norm_release(const Layer& L, const LayerWalk& w, LayerActivations& out) {
  if (!L.fam.post_norm_layers) return;
  const u64 last_norm = mul(w.in.first_norm, L.tokens);
  out.mlp_backward_transient = sub_floor(out.mlp_backward_transient, last_norm);
  out.mlp_backward_at_down = sub_floor(out.mlp_backward_at_down, last_norm);
  out.attention_backward_transient = sub_floor(out.attention_backward_transient, last_norm);
  out.attention_released = add(out.attention_released, last_norm);
  if (out.mlp_norm_backward > 0) out.mlp_norm_backward = sub_floor(out.mlp_norm_backward, last_norm);
}

/// Autocast: the half gradient of the largest trained Linear, alive before its cast to the fp32 .grad.
void autocast_half_gradient(const Layer& L, LayerActivations& out) {
  const LayerGroup& g = L.g;
  const TrainableLinears& t = L.t;
  const bool full = L.full, amp_casts_kept = amp_weight_casts_kept(L);
  // the half gradient of the largest trained Linear before its cast to the fp32 .grad
  u64 biggest = 0;
  for (size_t i = 0; i < g.linears.size(); ++i)
    if (t.saves_input[i] && full) biggest = std::max(biggest, g.linears[i].weight_params() / g.linears[i].copies);
  out.backward_transient = add(out.backward_transient, mul(2, biggest));
  out.attention_backward_transient = add(out.attention_backward_transient, mul(2, biggest));
  if (!amp_casts_kept || g.moe) out.attention_backward_gross = add(out.attention_backward_gross, mul(2, biggest));
  // (checkpointed dense layers: no half gradient at the MLP moments past down_proj's node, see mlp_backward)
  if ((!amp_casts_kept && !amp_recomputed_casts(L)) || g.moe) out.mlp_backward_transient = add(out.mlp_backward_transient, mul(2, biggest));
  out.mlp_backward_at_down = add(out.mlp_backward_at_down, mul(2, biggest));
}

/// QLoRA: the dequantized weight of the largest quantized Linear.
void qlora_dequantized_weight(const Layer& L, LayerActivations& out) {
  const LayerGroup& g = L.g;
  const Request& r = L.r;
  const bool bnb4 = L.bnb4;
  // A quantized Linear dequantizes its whole weight for the matmul, in forward and again in
  // backward (bitsandbytes MatMul4Bit: dequantize_4bit to the compute dtype; GPTQ/AWQ
  // kernels' fallbacks alike): one dense copy of the largest such weight is live then.
  // Forward runs inside the gemm_4bit custom op (CUDA: dequantize + F.linear past the fused
  // kernel's small-M range, i.e. in training; CPU: the same inside the op, scratch the CPU
  // validator's live-tensor view does not see). Backward calls dequantize_4bit outside the op
  // (bitsandbytes autograd/_functions.py MatMul4Bit.backward): measured on CPU, the checkpointed
  // runs' peak holds one dequantized [i, h] weight (peak dump llama/qlora-nf4/bf16/gc/sdpa), a
  // moment the layer's backward_transient already spans: adding it there again overshoots
  // every gc QLoRA case of the suite by 2.5-3 % (data/measurements/cpu-suite-frameworks.jsonl).
  u64 biggest = 0;
  for (const Linear& l : g.linears)
    if (!l.routed) biggest = std::max(biggest, l.weight_params());
  const u64 load = r.precision == Precision::Fp32 ? 4 : 2;
  // Lightning's 4-bit layers were quantized from fp16: dequantize_4bit's fp16 copy and its cast
  // to the compute dtype are alive together (frameworks.hpp bnb_quantized_from_fp16)
  const bool fp16_source = bnb4 && r.precision != Precision::Fp16 &&
                           framework_traits(r.runtime.framework, r.runtime.framework_version).bnb_quantized_from_fp16;
  const u64 deq = mul(add(load, fp16_source ? 2 : 0), biggest);
  if (r.device == Device::Cuda) {
    out.forward_transient = add(out.forward_transient, deq);
    out.recompute_transient = add(out.recompute_transient, deq);
  }
}

/// Full activation checkpointing: what is kept per layer, held while it recomputes, and re-created.
void checkpointing(const Layer& L, const LayerWalk& w, LayerActivations& out) {
  const ModelSpec& m = L.m;
  const LayerGroup& g = L.g;
  const TrainableLinears& t = L.t;
  const Dtypes& d = L.d;
  const Kept& kept = w.kept;
  const u64 p = L.p, h = L.h, tokens = L.tokens, adapter_bytes = L.adapter_bytes, moe_slots = L.moe_slots,
            xp = L.xp;
  const bool full = L.full;
  out.checkpoint_saved = mul(tokens, d.residual, h);
  // Non-reentrant checkpointing recomputes the layer when its backward first unpacks a saved
  // tensor. With a LoRA adapter on the MLP's output Linear that is lora_B's mm: the nodes before
  // it have produced the adapter branch's gradient (grad * scaling, [T, h] in the adapter dtype)
  // and, when the adapter dtype differs from the model's, the base branch's cast of the incoming
  // gradient ([T, h] in the model dtype), pending until the recomputation is done (measured,
  // llama/lora/bf16/gc/sdpa: a bf16 and an fp32 [T, h] live through layer 0's recomputation).
  bool down_adapter = false;
  for (size_t i = 0; i < g.linears.size(); ++i)
    down_adapter = down_adapter || (g.linears[i].input == LinearInput::MlpHidden && t.saves_input[i]);
  // A residual dropout after the MLP (GPT-2, Phi: resid_pdrop > 0) is the layer's last op that
  // saves something (its mask): its backward unpacks first and the recomputation runs before any
  // gradient of the block is formed; only the incoming gradient is alive (measured,
  // gpt2/lora/bf16/gc/eager and phi/lora/bf16/gc/eager: no cast, no grad * scaling held).
  if (!g.moe && !full && down_adapter && !d.amp && m.hidden_dropout <= 0)
    out.recompute_held = mul(tokens, h, add(adapter_bytes, adapter_bytes != p ? p : 0));
  // MoE: the weighted sum over the k routed slots, (down_out * routing_weight).sum(dim=1), has
  // no saved tensor: its backward (SumBackward's expand, made contiguous for MulBackward) runs
  // before the first unpack and its [T, k, h] gradient lives through the recomputation.
  if (g.moe) out.recompute_held = add(out.recompute_held, mul(tokens, moe_slots, xp, h));
  // Recomputed under checkpointing: everything `saved` except what aliases the checkpointed input
  // (the first norm keeps the layer input itself unless RMSNorm upcasts a half input to a copy).
  const bool first_norm_keeps_input = m.norm != NormKind::RMSNorm || d.residual == 4;
  out.recomputed = sub_floor(out.saved, first_norm_keeps_input ? out.checkpoint_saved : 0);
  // Quantized Linears' contexts of the first forward hold their inputs past checkpointing (see
  // slot); the recomputation's own contexts die with its graph, so what only they hold is not re-created
  out.checkpoint_ctx_held = mul(tokens, kept.ctx_held);
  out.recomputed = sub_floor(out.recomputed, mul(tokens, kept.ctx_only));
}

/// A no-grad forward of the layer (prefill, frozen bottom layers).
void no_grad_forward(const Layer& L, LayerActivations& out) {
  const ModelSpec& m = L.m;
  const LayerGroup& g = L.g;
  const Request& r = L.r;
  const Dtypes& d = L.d;
  const FamilyActivations& fam = L.fam;
  const u64 p = L.p, h = L.h, a = L.a, qw = L.qw, kw = L.kw, ow = L.ow, s = L.s, tokens = L.tokens,
            moe_slots = L.moe_slots, act_saves = L.act_saves;
  const bool fp32_softmax = eager_softmax_in_fp32(L);
  // No-grad forward (prefill), measured op by op (tracker, llama/gpt2/mixtral inference cases):
  // at the MLP of a layer past the first, [T, h] tensors alive are the model's inputs_embeds
  // (still referenced by the model's forward), the layer input, the post-attention residual and
  // the normed MLP input (GPT-2-style blocks also keep attn_output as a local); then the MLP
  // intermediates: gated act(gate) * up holds act out, up and the product; GELU written in
  // Python ops (gelu_new) holds fc1's output and three of its temporaries, other activations
  // fc1 out + act out; a fused-expert MoE holds per routed slot the gathered input, the gate_up
  // output, act out and the product. Attention holds q, k, v and its output.
  // (StableLM also its first norm's output, FamilyActivations::block_keeps_first_norm_output)
  const u64 block_local_count =
      (fam.block_keeps_attn_output ? 1 : 0) + (fam.block_keeps_first_norm_output && !m.parallel_block ? 1 : 0);
  const u64 hidden_live = mul(add(4, block_local_count), d.residual, h);
  u64 mlp_live = 0;
  if (g.moe) {
    mlp_live = mul(moe_slots, p, add(h, mul(4, g.mlp_intermediate)));
  } else if (m.mlp == MlpKind::Gated) {
    mlp_live = mul(3, p, g.mlp_intermediate);
  } else {
    mlp_live = mul(act_saves == 4 ? 4 : 2, p, g.mlp_intermediate);
  }
  const u64 attn_live = mul(p, add(add(qw, mul(2, kw)), ow));
  u64 inf_s = r.attention == AttentionImpl::Eager ? mul(a, add(mul(2, p), fp32_softmax && p != 4 ? 4 : 0)) : 0;
  // Falcon (eager): scores, scores + mask and the softmax are alive at once, and each decoder
  // layer returns its attention probabilities, which the model's loop keeps through the next
  // layer's forward (measured, falcon/lora/fp32/gc/eager forward peak)
  if (r.attention == AttentionImpl::Eager && fam.no_grad_four_scores) inf_s = mul(4, p, a);
  // the score tensors exist during attention, not next to the MLP's intermediates
  u64 attn_moment = add(mul(attn_live, tokens), mul(inf_s, tokens, s));
  if (r.attention == AttentionImpl::Eager && fam.baddbmm_attention) {
    attn_moment = bloom_attention_moment(p, d.residual, add(qw, mul(2, kw)), ow, h, a, tokens, s);
    // Under checkpointing the layer input and inputs_embeds (hidden_live's first two) are kept
    // tensors, counted with the checkpointed inputs; BLOOM's list is complete without them (its
    // tuning cases read to the byte). The other families' forward counts were fitted with them in
    // and keep them: taking them off everywhere reads falcon/lora/fp32/gc/eager -2.7 % (its fused
    // qkv output and RoPE copies are not listed either).
    out.transient_inputs = mul(2, d.residual, h, tokens);
  }
  out.inference_transient = add(mul(hidden_live, tokens),
                                std::max(mul(mlp_live, tokens), attn_moment));
}

}  // namespace

// One layer: walk_layer counts what each block keeps in op order (attention_input, projections,
// attention_kernel, attention_tail, mlp_block); the saved totals and the forward, backward,
// checkpointing and no-grad moments are then read off the walk.
LayerActivations layer_activations(const ModelSpec& m, const LayerGroup& g, const Request& r,
                                   const TrainableLinears& t, u64 tokens, u64 seq) {
  const Layer L = layer_of(m, g, r, t, tokens, seq);
  const LayerWalk w = walk_layer(L);
  LayerActivations out;
  saved_totals(L, w, out);
  forward_moments(L, w, out);
  mlp_backward(L, w, out);
  attention_backward(L, w, out);
  post_norm_release(L, w, out);
  // Backward transient: gradients flowing through the residual stream (in and out) plus the
  // larger of the MLP intermediate gradients (while all of the layer's tensors are still saved)
  // and the attention gradients (by then the MLP's saved tensors have been released).
  out.backward_transient = std::max(out.mlp_backward_transient, out.attention_backward_transient);
  if (L.d.amp) autocast_half_gradient(L, out);
  if (r.task == Task::Qlora && r.quantization != Quantization::None) qlora_dequantized_weight(L, out);
  checkpointing(L, w, out);
  no_grad_forward(L, out);
  return out;
}

/// TRL's fused LM head (trl 1.16 trainer/utils.py add_fused_lm_head, kernels/chunked_logprob.py
/// ChunkedLogProbFunction), what SFTTrainer's compute_loss calls with fused_lm_head=True. The
/// backbone output is shifted ([:, :-1], b (s - 1) positions) and copied to [N, h], which the
/// function keeps with the int64 targets and the fp32 log-normaliser and entropy [N]; no logits
/// exist. Each direction projects tiles into one buffer of [min(N, 4096), 32768] elements in the
/// compute dtype (sized by the fixed chunk width, not the vocabulary); backward accumulates the
/// hidden gradient [N, h] and a trained head's weight gradient [V, h] in fp32. On devices without
/// Triton (CPU) the tile is folded by torch ops instead of the kernel: at the worst moment of
/// _backward_tile seven fp32 [N, V] tensors and a bool one are alive (measured, peak dump of
/// llama/trl/full/fp32/nogc/sdpa in validate/frameworks.py). There too, over a half compute dtype,
/// _addmm_fp32 accumulates each chunk's gradients as acc.addmm_(a.float(), b.float()) (torch.addmm's
/// out_dtype only on CUDA): fp32 copies of the tile [n, c] and of the weight chunk [c, h] for the
/// hidden gradient, of the transposed tile and the hidden rows [n, h] for a trained head's, beside
/// the chunk's own cast to the compute dtype when the head is stored wider (measured, peak dump of
/// the frameworks holdout's trl/llama/h256-L3-V32000/lora-r8-qv/bf16/gc/sdpa/b1s32/sgd: the fp32
/// [32000, 256] and [31, 32000] copies beside the bf16 [31, 32768] buffer; -13.05 % without them).
HeadActivations trl_fused_head(const ModelSpec& m, const Request& r, u64 norm_saved, bool head_trainable, u64 tokens) {
  constexpr u64 kTokenTile = 4096, kChunk = 32768, kCpuTileTemps = 7 * 4 + 1;
  const Dtypes d = dtypes_for(r);
  const u64 n = sub_floor(tokens, r.micro_batch_size), h = m.hidden, v = m.vocab;
  HeadActivations out;
  out.saved = add(mul(tokens, norm_saved), mul(n, add(mul(d.residual, h), 8 + 4 + 4 + 4)));
  const u64 rows = std::min(n, kTokenTile), tile = mul(rows, kChunk, d.compute);
  out.loss_forward_peak = add(tile, mul(n, 7 * 4));
  out.loss_backward_peak = add(tile, add(mul(4, n, h), head_trainable ? mul(4, v, h) : 0));
  if (r.device != Device::Cpu) return out;
  u64 fold = mul(rows, v, kCpuTileTemps);
  if (d.compute == 2) {
    const u64 c = std::min(v, kChunk), chunk_cast = d.amp || kbit_upcast(r) ? mul(c, h, 2) : 0;
    fold = std::max(fold, add(chunk_cast, mul(4, add(mul(rows, c), mul(c, h)))));
    if (head_trainable) fold = std::max(fold, add(chunk_cast, mul(4, add(mul(rows, c), mul(rows, h)))));
  }
  out.loss_backward_peak = add(out.loss_backward_peak, fold);
  return out;
}

/// LitGPT 0.5.13's loss (utils.py chunked_cross_entropy, chunk_size 128, on `logits[..., :-1, :]`
/// and `targets[..., 1:]`: b (s - 1) rows). finetune/full.py runs the head whole; finetune/lora.py
/// runs it in chunks of `chunk` positions (model(..., lm_head_chunk_size=128)) and slices the last
/// one. Fabric converts a half model's outputs to fp32 (MixedPrecision / HalfPrecision
/// convert_output: torch.get_default_dtype()), so in every precision the logits the loop holds
/// and the cross-entropy works on are fp32, and so is each chunk's kept log-softmax. The reshape of the sliced logits
/// is a copy (all rows, or the last chunk's; none at micro-batch 1), alive until the loss returns. Backward runs every
/// loss chunk before any head chunk: at worst one chunk's nll and log-softmax gradients next to
/// the remaining log-softmax outputs and the queued gradients (together all rows); the whole
/// head then meets SplitBackward's cat and SliceBackward's [b, s, V] zeros. fit() keeps `logits`
/// until the next forward has returned. (Measured: peak dumps of the litgpt cases of
/// validate/suite_frameworks.py, e.g. litgpt/lora/amp_bf16/s320: two bf16 -> fp32 chunk pairs.)
HeadActivations chunked_rows_head(const ModelSpec& m, const Request& r, u64 norm_saved, bool head_trainable, u64 tokens,
                                  u64 chunk) {
  const Dtypes d = dtypes_for(r);
  const u64 b = std::max<u64>(1, r.micro_batch_size), s = tokens / b, h = m.hidden, v = m.vocab;
  const u64 rows = sub_floor(tokens, b);  // the shifted positions
  const u64 lg = 4;  // logits as the loop sees them (Fabric's convert_output)
  const bool chunked_head = r.task != Task::Full;
  const u64 c = chunked_head ? std::max<u64>(1, div_ceil(s, chunk)) : 1;
  HeadActivations out;
  u64 saved = mul(tokens, norm_saved);
  if (head_trainable) saved = add(saved, mul(tokens, d.amp ? 2 : d.residual, h));  // lm_head's input (its half cast)
  saved = add(saved, mul(rows, add(mul(lg, v), 8)));  // log-softmax outputs, int64 targets
  // autocast caches no cast of a frozen weight: each chunk's mm keeps its own half lm_head
  if (d.amp && !head_trainable) saved = add(saved, mul(c - 1, mul(2, v, h)));
  out.saved = saved;
  out.held_logits = mul(tokens, lg, v);
  out.held_until_next_forward = out.held_logits;
  // (at micro-batch 1 the slice is contiguous and reshape a view: no copy)
  const u64 copy_rows = b == 1 ? 0 : chunked_head ? mul(b, sub_floor(s - (c - 1) * chunk, 1)) : rows;
  // when this step's forward returns: the previous step's logits and the half output being
  // converted, before any log-softmax exists
  const u64 forward_end = add(out.held_logits, d.compute == 2 ? mul(tokens, 2, v) : 0);
  out.loss_forward_peak = std::max(mul(copy_rows, lg, v), sub_floor(forward_end, mul(rows, lg, v)));
  const u64 chunk_rows = chunked_head ? mul(b, std::min(s, chunk)) : std::min(rows, chunk);
  out.loss_backward_peak = mul(std::max(mul(2, chunk_rows), chunked_head ? 0 : tokens), lg, v);
  // A 4-bit lm_head (BitsandbytesPrecision quantizes it) is dequantized for every chunk's matmul,
  // forward and backward (MatMul4Bit): the dense [V, h] weight in the compute dtype, next to the
  // fp16 copy it was cast from when Lightning quantized it from fp16
  const FrameworkTraits& fw = framework_traits(r.runtime.framework, r.runtime.framework_version);
  const bool bnb4 = r.quantization == Quantization::Nf4 || r.quantization == Quantization::Nf4Double ||
                    r.quantization == Quantization::Fp4;
  if (r.task == Task::Qlora && bnb4 && fw.bnb_quantizes_lm_head && !m.tied_embeddings) {
    const u64 fp16_copy = fw.bnb_quantized_from_fp16 && r.precision != Precision::Fp16 ? 2 : 0;
    const u64 head_deq = mul(add(d.compute, fp16_copy), v, h);
    out.loss_forward_peak = add(out.loss_forward_peak, head_deq);
    out.loss_backward_peak = add(out.loss_backward_peak, head_deq);
  }
  return out;
}

HeadActivations head_activations(const ModelSpec& m, const Request& r, bool head_trainable, u64 tokens) {
  const Dtypes d = dtypes_for(r);
  const u64 p = d.compute;
  const u64 h = m.hidden;
  HeadActivations out;
  if (!m.causal && m.lm_head.out <= 16) {
    // Sequence classification: the pooled first token and [batch, labels] logits: negligible.
    out.saved = mul(tokens, d.residual, h);
    return out;
  }
  const u64 v = m.vocab;
  // Final norm: its input (fp32 copy for RMSNorm on half inputs) and statistics, the normalised
  // value when its weight is trained, and its output when lm_head's weight is trained (under
  // autocast, lm_head's half cast of it instead).
  u64 saved = 0;
  if (m.norm == NormKind::RMSNorm) {
    saved = add(mul(4, h), 4);
    if (head_trainable) saved = add(saved, mul(d.residual == 2 && !module_impl(r).norm_normalised_fp32 ? 2 : 4, h));
  } else {
    saved = add(mul(d.residual, h), 8);
  }
  const FrameworkTraits& fw = framework_traits(r.runtime.framework, r.runtime.framework_version);
  if (fw.loss == LossKind::FusedLinear && r.runtime.framework == Framework::Trl)
    return trl_fused_head(m, r, saved, head_trainable, tokens);
  if (fw.loss == LossKind::ChunkedRows) return chunked_rows_head(m, r, saved, head_trainable, tokens, fw.loss_chunk_tokens);
  if (head_trainable) saved = add(saved, mul(d.amp ? 2 : d.residual, h));
  const FamilyActivations& fam = family_activations(m);
  // BertPredictionHeadTransform before the decoder: the dense output (the activation's saved
  // input), the activation's output (the LayerNorm's input, at the residual width: its fp32 cast
  // under autocast) and, for a trained dense weight, the dense's input (the saved norm input above
  // is then the transform's LayerNorm input, its output the decoder's).
  if (fam.head_transform) {
    saved = add(saved, add(mul(activation_saves(m.activation), p, h), head_trainable ? mul(d.amp ? 2 : d.residual, h) : 0));
    // A LoRA adapter on the frozen transform dense: lora_A keeps its input cast to the adapter's
    // dtype (fp32; a half copy under autocast), lora_B the rank-r output.
    const bool adapted = (r.task == Task::Lora || r.task == Task::Qlora) && !m.outer_linears.empty() &&
                         lora_targets(r, m.outer_linears.front().name);
    const u64 adapter_elem = d.amp ? 2 : (r.lora.adapter_bytes ? r.lora.adapter_bytes : 4);
    if (adapted && !head_trainable) saved = add(saved, mul(adapter_elem, add(h, r.lora.rank)));
  }
  const u64 logits_bytes = (m.logits_fp32_in_model || p == 4) ? 4 : p;
  out.held_logits = mul(tokens, logits_bytes, v);
  if (m.final_logit_softcapping) saved = add(saved, mul(p, v));  // tanh output
  // ForCausalLMLoss: logits.float() (a copy unless already fp32), then cross_entropy keeps the
  // fp32 log-softmax output and the shifted labels (int64). A loss on the logits as they are
  // runs in their dtype, except under autocast, which casts cross_entropy's input to fp32.
  const u64 loss_bytes = fam.loss_in_logits_dtype && !d.amp ? logits_bytes : 4;
  const u64 upcast = logits_bytes == loss_bytes ? 0 : loss_bytes;
  if (r.runtime.compile && r.runtime.loss_chunks > 1) {
    // compiled chunked loss (torchtune compiles its CEWithChunkedOutputLoss): one fused kernel
    // per chunk keeps the logits themselves and the fp32 log-sum-exp per token, and writes the
    // logits' gradient directly (no fp32 copy, no log-softmax output). An unchunked loss keeps
    // the eager path: the calibration records show compile alone leaves it as it was.
    out.saved = add(mul(tokens, add(saved, add(8, 4))), out.held_logits);
    out.held_logits = 0;
    out.loss_backward_peak = mul(tokens, logits_bytes, v);
    return out;
  }
  out.saved = add(mul(tokens, add(saved, 8)), mul(tokens, loss_bytes, v));
  out.loss_forward_peak = mul(tokens, upcast, v);
  // Backward: the dense gradient of the log-softmax output (from nll_loss) and the gradient of
  // its input, while the saved output is still alive.
  out.loss_backward_peak = mul(tokens, mul(2, loss_bytes), v);
  return out;
}

u64 eager_mask_count(const ModelSpec& m) {
  // The model builds one 4-D mask per kind of layer attention it has: a full causal one and a
  // sliding-window one when some layers are windowed (modeling_gemma2.py Gemma2Model.forward:
  // causal_mask_mapping = {"full_attention": create_causal_mask(...), "sliding_attention":
  // create_sliding_window_causal_mask(...)}; modeling_qwen2.py adds the sliding one when a layer
  // type is sliding_attention; Mistral's single mask is the sliding one). Measured, peak dump of
  // tuning case gemma2/h128-L2-V2048/full/fp32/gc/eager/b1s1024/sgd: two fp32 [1, 1, 1024, 1024]
  // `where` outputs alive in the last layer's recomputed backward.
  std::set<u64> windows;
  for (const LayerGroup& g : m.groups) windows.insert(family_activations(m).window_from_buffer ? 0 : g.sliding_window);
  return std::max<u64>(1, windows.size());
}

u64 eager_mask_bytes(const ModelSpec& m, const Request& r, u64 batch, u64 seq) {
  if (r.attention != AttentionImpl::Eager || !m.causal) return 0;
  // 4-D masks [b, 1, s, s] in the dtype of the embeddings, fp32 under autocast (measured, peak dump
  // of tuning case llama/h128-L4-V1024/full/amp_bf16/gc/eager/b1s1024/adafactor: an fp32
  // [1, 1, 1024, 1024] where output)
  return mul(eager_mask_count(m), mul(batch, seq, seq, dtypes_for(r).residual));
}

u64 shared_forward_bytes(const ModelSpec& m, const Request& r, u64 batch, u64 seq) {
  const Dtypes d = dtypes_for(r);
  const u64 tokens = mul(batch, seq);
  // The tokenizer's int64 columns (input ids; BERT's also token_type_ids and attention_mask).
  // Causal LM labels are the ids tensor; a masked LM's are a masked copy
  // (DataCollatorForLanguageModeling); a classifier's, one per sequence.
  const bool masked_lm_labels = !m.causal && m.lm_head.out > 16 && r.task != Task::Inference;
  u64 bytes = mul(tokens, 8, family_activations(m).tokenizer_inputs + (masked_lm_labels ? 1 : 0));
  const bool rotary = !m.learned_positions && !m.alibi;
  // cos and sin [1, s, rotary_dim] (position_ids default to one row shared by the batch)
  const u64 rope_elem = module_impl(r).rope_bytes ? module_impl(r).rope_bytes : mul(2, d.compute);  // per (position, rotary dim)
  if (rotary) bytes = add(bytes, mul(seq, rope_elem, m.attention == AttentionKind::MultiLatent ? m.qk_rope_head_dim : m.head_dim));
  bool windowed = false;  // a sliding window no longer than the sequence: SDPA gets an explicit mask
  for (const LayerGroup& g : m.groups)
    windowed = windowed || g.local_mask(seq);
  // (SDPA with a window: each layer makes its own float mask from the model's bool one, counted
  // per layer; sdpa_flash_attention)
  bytes = add(bytes, eager_mask_bytes(m, r, batch, seq));
  if (m.alibi) bytes = add(bytes, mul(batch, m.heads, seq, d.compute));
  // Non-reentrant checkpointing keeps each layer's inputs for its recomputation: the model-level
  // bool sliding-window mask [1, 1, s, s] that SDPA layers turn into their own float masks,
  // and the int64 positions [s] (cache_position, of which position_ids is a view), alive through
  // the whole backward (measured, peak dump of tuning case
  // starcoder2/h128-L2-V1024/lora-r16-all/fp32/gc/sdpa/b2s1024/adamw: bitwise_and (1, 1, 1024, 1024)
  // bool and add (1024,) int64 beside the recomputed last layer)
  if (r.gradient_checkpointing && rotary) {
    bytes = add(bytes, mul(8, seq));
    if (r.attention == AttentionImpl::Sdpa && windowed && m.causal) bytes = add(bytes, mul(seq, seq));
  }
  // The embedding output needs a gradient only when the embeddings train or checkpointing makes
  // it require one (Transformers' enable_input_require_grads for PEFT models); otherwise the
  // embedding dropout and Bloom's embedding LayerNorm (frozen) save nothing (measured,
  // gpt2/lora/fp32/nogc/eager: no embedding dropout noise alive at the loss backward).
  // The noise is in the dtype of the dropout's input, the embedding output: the residual dtype,
  // fp32 under autocast, which does not cast embeddings (measured, peak dump of tuning case
  // gpt2/h192-L4-V4096/full/amp_bf16/gc/sdpa/b2s256/adamw at _log_softmax_backward_data: an fp32
  // (2, 256, 192) empty_like noise beside the fp32 dropout output).
  const bool embeds_need_grad = r.task == Task::Full || r.gradient_checkpointing;
  // With frozen embeddings that hook makes the embedding output a leaf requiring a gradient: its
  // AccumulateGrad node holds it until the backward has run through it, so where the first layer
  // reads something else (positions added, dropout) it is one more [T, h] alive through the whole
  // step (measured, peak dumps of tuning cases gpt_bigcode/h192-L3-V4096/lora-r16-all/bf16/gc/
  // sdpa/b2s256/adamw at the loss backward and gpt_neo/h256-L4-V2048/lora-r16-mlp/bf16/gc/eager/
  // b3s192/adamw in the last layer's recomputation: a bf16 `embedding` [b, s, h] beside the
  // dropout's noise and output)
  if (r.task != Task::Full && r.gradient_checkpointing && (m.learned_positions || m.embedding_dropout > 0))
    bytes = add(bytes, mul(tokens, d.residual, m.hidden));
  if (embeds_need_grad) {
    bytes = add(bytes, mul(tokens, dropout_mask(m.embedding_dropout, r, d.residual), m.hidden));
    if (family_activations(m).embedding_layernorm) bytes = add(bytes, mul(add(mul(d.residual, m.hidden), 8), tokens));  // embedding LayerNorm
  }
  // Frozen embeddings under checkpointing: enable_input_require_grads makes the word-embedding
  // output a leaf that requires grad, and its AccumulateGrad node keeps it to the end of the
  // backward. Where that leaf is the first layer's input it is counted as that layer's
  // checkpointed input; BertEmbeddings adds the token-type and position embeddings and normalises
  // first, so the leaf is one more [T, h] (measured, peak dump of tuning case
  // bert/h128-L2-V1024/mlm/lora-r16-all/bf16/gc/eager/b2s128/adamw: a bf16 embedding output
  // beside the add, noise and dropout output in the last layer's recomputed backward). GPT-2 and
  // BLOOM also transform it before their first layer; their rows leave this off (their tuning
  // cases are within 2 % as they are and were not re-examined for it).
  if (family_activations(m).inputs_embeds_apart && r.gradient_checkpointing && r.task != Task::Full)
    bytes = add(bytes, mul(tokens, d.residual, m.hidden));
  return bytes;
}

const FamilyActivations& family_activations(const ModelSpec& m) {
  const std::string_view family = m.family == "falcon" && m.alibi ? "falcon (alibi)" : std::string_view(m.family);
  for (const FamilyActivations& row : kFamilyActivations)
    if (family == row.family) return row;
  return kLlamaLike;
}

}  // namespace memfit::detail
