// "A layer is data": the tensors one Llama-like decoder layer (and the embedding, final norm,
// lm_head and loss) creates in its forward, as an explicit list a reader who knows PyTorch can
// check line by line. schedule.cpp turns the lists into the allocations and frees of a step.
//
// Each entry is one tensor: its symbolic shape, its dtype, the op that creates it, whether
// autograd saves it for backward (PyTorch derivatives.yaml says what each op saves), when a
// tensor that is not saved dies (after its last consumer in the forward), and what its op's
// backward creates (the gradient of its input, the gradient of its weight).
// Precision, attention kernel and task (full / LoRA) are edits of the base list
// (fp32, SDPA, full fine-tuning), so changing what one op saves is a change in one place.
// Covered: the llama / mistral / qwen2 families of Hugging Face Transformers (modeling_llama.py
// and its copies), pure fp32 or bf16/fp16 weights (no autocast), CPU and CUDA.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "memfit/checked.hpp"
#include "memfit/request.hpp"

namespace memfit::sched {

/// Symbolic dimensions. T = tokens of a micro-batch (b x s).
enum class Sym : std::uint8_t {
  One, T, B, S, H, Q, KV, I, A, V, R, HeadDim,
  KvHeads,
  QKV,            ///< a fused q/k/v projection's width (q + 2 kv: GPT-NeoX, Falcon, Phi-3)
  TwoI,           ///< 2 i: a fused gate_up_proj's output (Phi-3)
  S_,             ///< routed slots of an MoE layer: T x experts per token
  E,              ///< routed experts of an MoE layer
  SharedI,        ///< the shared expert's width (Qwen2-MoE)
  QR, KR,         ///< the rotated part of q / k (partial rotary: heads x rotary dims)
  QRHalf, KRHalf, ///< half of it (rotate_half's negated slice)
  Pos,            ///< rows of a learned position table
  HeadDimHalf,    ///< half a head (gpt-oss's rotary tables)
  S1,             ///< s + 1 (the scores with gpt-oss's sink column)
  // multi-head latent attention (DeepSeek-V3)
  QLora,          ///< q_lora_rank: q_a_proj's output
  KvLora,         ///< kv_lora_rank: the compressed K/V latent
  KvA,            ///< kv_lora_rank + qk_rope_head_dim: kv_a_proj_with_mqa's output
  KvB,            ///< heads x (qk_nope_head_dim + v_head_dim): kv_b_proj's output
  VH,             ///< heads x v_head_dim: the attention output o_proj reads
  // group-limited routing (DeepSeek-V3's router)
  RG,             ///< n_group
  RG2,            ///< 2 n_group (the top two scores of each group)
  RK              ///< topk_group
};

/// The sizes the symbols take for one request (per rank).
struct Dims {
  u64 b = 0, s = 0, h = 0, q = 0, kv = 0, i = 0, a = 0, v = 0, r = 0, head_dim = 0;
  u64 kv_heads = 0;
  u64 experts = 0, topk = 0;  ///< MoE: routed experts, experts per token
  u64 shared_i = 0;           ///< MoE: the shared expert's width
  u64 qkv = 0, qr = 0, kr = 0;  ///< fused q/k/v width (0: q + 2 kv); rotated widths of q and k (0: = q, kv)
  u64 pos = 0;                  ///< rows of the learned position table
  u64 q_lora = 0, kv_lora = 0, kv_rope = 0, kv_b = 0, vh = 0;  ///< MLA widths (Sym::QLora ... Sym::VH)
  u64 route_groups = 0, topk_groups = 0;                       ///< group-limited routing (n_group, topk_group)
  [[nodiscard]] u64 of(Sym x) const;
};

/// A symbolic shape: the product of up to four symbols ([T, H], [B, A, S, S], ...).
struct Shape {
  std::array<Sym, 4> f{Sym::One, Sym::One, Sym::One, Sym::One};
  bool empty = true;  ///< no tensor (e.g. an op whose backward creates no input gradient)
  [[nodiscard]] u64 elements(const Dims& d) const;
};
Shape shape(Sym a, Sym b = Sym::One, Sym c = Sym::One, Sym e = Sym::One);
inline const Shape kNone{};

/// Element type roles: the model's dtype, fp32 (upcasts), the LoRA adapters' dtype, int64, and
/// native_layer_norm's mean / rstd (the input dtype on CPU, fp32 on CUDA), and the half dtype
/// autocast computes in, and bool (masks).
enum class Dt : std::uint8_t { Model, F32, Adapter, I64, NormStats, Half, Bool };

struct Dtypes {
  u64 model = 4, adapter = 4;
  u64 norm_stats = 4;
  u64 half = 2;  ///< autocast's compute dtype (bf16 / fp16)
  [[nodiscard]] u64 of(Dt d) const {
    switch (d) {
      case Dt::Model: return model;
      case Dt::F32: return 4;
      case Dt::Adapter: return adapter;
      case Dt::I64: return 8;
      case Dt::NormStats: return norm_stats;
      case Dt::Half: return half;
      case Dt::Bool: return 1;
    }
    return model;
  }
};

/// The component of the estimate's breakdown a tensor counts in (estimate.cpp's names, part_name).
enum class Part : std::uint8_t {
  Weights, Gradients, OptimizerStates, Activations, AutocastWeightCopies, LogitsLoss, TemporaryBuffers,
  CublasWorkspace,
  ByLifetime  ///< a list entry's default (TensorOp::part): not a component of its own
};
inline constexpr std::size_t kParts = 8;  ///< the components (ByLifetime is none)
/// "weights", "gradients", "optimizer_states", "activations", "autocast_weight_copies", "logits_loss",
/// "temporary_buffers", "cublas_workspace".
[[nodiscard]] std::string_view part_name(Part p);

/// One tensor a forward op creates.
struct TensorOp {
  std::string_view name;        ///< "q_proj.out", "attn.softmax", ...
  std::string_view op;          ///< the aten op that creates it
  Shape shape;
  Dt dtype = Dt::Model;
  bool saved = false;           ///< autograd keeps it until this layer's backward reaches it
  /// A tensor not saved dies after the entry of this name has been created (its last consumer);
  /// "" = after the next entry; its own name: as soon as it is made (a result read once and dropped).
  /// "layer_out": carried to the next layer (the residual stream; the entry a list hands on).
  /// "next_layer": a checkpointed layer returns it (saved or not), alive until the next layer returns.
  /// "backward_end": the training loop holds it until the micro-batch's backward has run (the loss).
  std::string_view dies_after{};
  Shape grad_input = kNone;     ///< what this op's backward creates: the gradient of its input
  Shape weight = kNone;         ///< a trained weight: its gradient appears in this op's backward
  Dt weight_dtype = Dt::Model;
  Dt grad_dtype = Dt::Model;    ///< dtype of grad_input (fp32 where the op ran in fp32)
  /// A residual add: its backward hands the incoming gradient unchanged to both operands; the
  /// skip part waits at this earlier entry, where autograd sums it with the branch's [D: add].
  std::string_view residual_of{};
  Shape bias = kNone;           ///< a trained bias: its gradient appears after the weight's
  /// Parallel branches (attention and MLP reading one input): this entry is the last of the
  /// branch autograd runs second. Its backward reads the gradient that reached the entry named
  /// here (the branches' sum), and the gradient the first branch produced waits at the entry
  /// named by `residual_of` (the branches' common input), where autograd sums the two.
  std::string_view branch_of{};
  /// Temporaries of the input gradient's size its backward holds while it computes (a custom
  /// autograd.Function written in Python ops, e.g. BLOOM's GeLUFunction), freed when it returns.
  std::uint8_t backward_temps = 0;
  /// A saved tensor is released when the backward of the op that saved it has run: this entry's
  /// own when "" (the op right after it), else the named later entry (e.g. the input of a frozen
  /// Linear, kept only by the LoRA adapter beside it, is released by lora_A's backward).
  std::string_view released_by{};
  /// An argument of every decoder layer (the eager masks): under checkpointing each checkpoint
  /// keeps it for its recomputation until the backward of the decoder stack is over
  /// (torch.utils.checkpoint saves its tensor inputs), though it dies at "decoder_end" otherwise.
  bool checkpoint_input = false;
  /// Read by two ops whose gradients meet here (RMSNorm's fp32 upcast, read by pow and by the x_hat
  /// mul): the waiting gradient and the arriving one are summed out of place in this tensor's dtype
  /// before its own backward runs. (Otherwise a gradient waiting at an entry whose backward makes an
  /// input gradient is a LoRA base Linear's, which runs its backward on it first.)
  bool sums_first = false;
  /// The component it counts in. ByLifetime: activations when saved or handed on, temporary_buffers
  /// when it dies in the forward; otherwise the logits and the loss's tensors (logits_loss, their
  /// gradients too), autocast's cached half weights. The gradients the other entries' backward
  /// makes count as temporary_buffers, the weights' as gradients.
  Part part = Part::ByLifetime;
};

using OpList = std::vector<TensorOp>;

/// An MLP activation, by what autograd keeps (derivatives.yaml; transformers activations.py).
enum class Activation : std::uint8_t {
  Gelu,      ///< F.gelu (erf or tanh approximation): saves its input
  GeluExpr,  ///< NewGELUActivation / gelu_new: a Python expression (pow, mul, tanh, ...)
  Relu,      ///< saves its output
  Silu,      ///< saves its input
};

struct LayerSetup;
/// A family's edits of the Llama-like lists (layer_ops_rms.cpp, ...), applied to the base lists
/// before the precision, kernel and task edits; nullptr = no edit.
using ListEdit = void (*)(OpList&, const LayerSetup&);
struct FamilyEdits {
  ListEdit layer = nullptr, embedding = nullptr, head = nullptr;
  ListEdit layer_after_precision = nullptr;  ///< the decoder layer, after the half / autocast edits
};

/// The choices that edit the lists.
struct LayerSetup {
  bool half = false;          ///< bf16/fp16 weights (no autocast)
  bool eager = false;         ///< eager attention instead of SDPA (flash kernel, enable_gqa)
  bool gqa = false;           ///< fewer K/V heads than query heads
  bool full = true;           ///< full fine-tuning (every weight trained)
  bool lora_all = false;      ///< LoRA on every Linear of the layer
  bool lora_qv = false;       ///< LoRA on q_proj and v_proj only
  bool window_mask = false;   ///< a sliding window no longer than the sequence: SDPA gets a per-layer mask
                              ///< and K/V repeated to every query head (CPU and CUDA)
  // LayerNorm families (layer_ops_layernorm.hpp)
  Activation act = Activation::Gelu;  ///< the MLP's activation
  bool attn_dropout = false;   ///< attention probabilities dropout (p > 0)
  bool resid_dropout = false;  ///< dropout on the attention and MLP outputs (p > 0)
  bool embd_dropout = false;   ///< dropout on the embeddings (p > 0)
  bool cuda = false;           ///< the CUDA kernels (else the CPU ones: SDPA layouts differ)
  bool head_bias = false;      ///< the LM head has a bias (Phi)
  bool checkpointing = false;  ///< gradient checkpointing (PEFT then makes the embeddings' output need a gradient)
  bool logits_fp32_in_model = false;  ///< the model casts its logits to fp32 (CodeGen, GPT-Neo)
  bool autocast = false;      ///< fp32 weights under torch.autocast (amp_bf16 / amp_fp16), layer_ops_rms.cpp
  bool one_sequence = false;  ///< micro-batch 1: torch.matmul folds [b, heads] of a strided view without a copy
  bool heads_split_copied = false;  ///< CodeGen: _split_heads' reshape copies q, k and v (> 4 heads)
  /// CUDA fp16: softmax(dtype=float32) runs _softmax(half_to_float) on the half scores (no fp32 copy
  /// of its input, a half input gradient); elsewhere (CPU, bf16) the scores are copied to fp32 first
  bool softmax_half_to_float = false;
  const FamilyEdits* family = nullptr;  ///< the family's edits of the Llama lists (schedule.cpp's table); nullptr: none
  bool moe = false;  ///< a grouped decoder's MoE layers (the family's edit picks the MLP by it: DeepSeek-V3)
  bool nope = false;        ///< a grouped decoder's NoPE layers: no rotary (Llama 4's global layers)
  bool qk_l2_norm = false;  ///< q and k L2-normalised per head in fp32 (Llama 4's RoPE layers)
  bool route_renorm = true; ///< MoE: the top-k routing weights renormalised (ModelSpec::norm_topk_prob; DeepSeek-V3)
};

/// The lists of one family, and the edit of its first layer when its input needs no gradient.
struct FamilyLists {
  OpList (*layer)(const LayerSetup&) = nullptr;
  OpList (*embedding)(const LayerSetup&) = nullptr;
  OpList (*head)(const LayerSetup&) = nullptr;
  void (*input_needs_no_grad)(OpList&) = nullptr;
};

/// One decoder layer's forward, in op order. The last entry is the layer output.
[[nodiscard]] OpList decoder_layer(const LayerSetup& s);
/// Embedding (the first layer's input) and the tensors shared by every layer (rotary cos/sin).
[[nodiscard]] OpList embedding(const LayerSetup& s);
/// Final norm, lm_head, the upcast and the cross-entropy of ForCausalLMLoss.
[[nodiscard]] OpList head_and_loss(const LayerSetup& s);
/// The tensors of ForCausalLMLoss after the logits (and their fp32 copy): the shifted labels, the
/// log-probabilities, nll_loss's two scalars and the entry whose backward starts the chain.
void push_loss(OpList& l, const LayerSetup& s);

/// What the Llama-like models (and GPT-NeoX, StableLM, Phi) allocate after the embedding lookup:
/// the position ids and create_causal_mask's packed-sequence check, then (after the masks) the
/// rotary tables with their intermediates (layer_ops.cpp).
void push_position_ids(OpList& l);
void push_packed_sequence_check(OpList& l);
void push_rotary_tables(OpList& l, const LayerSetup& s);
/// eager_mask's set-up before the float causal mask (an entry named "causal_mask" must follow).
void push_eager_mask_setup(OpList& l);

/// The edits, exposed for tests and for families that need them.
void edit_half_precision(OpList& l);
/// Half eager attention's softmax(dtype=float32) around an existing "attn.probs_half": the fp32
/// copy of the scores it runs on and the fp32 gradients of its backward (none of the copy where
/// `half_to_float`: CUDA fp16).
void edit_softmax_of_half_scores(OpList& l, bool half_to_float);
void edit_eager_attention(OpList& l, bool gqa);
void edit_window_mask(OpList& l, bool gqa = true);
void edit_lora(OpList& l, bool all_linear, bool half);
/// The first layer of a LoRA run without checkpointing: its input (the frozen embedding's
/// output) needs no gradient, so its norm records nothing and no gradient reaches its input.
void edit_input_needs_no_grad(OpList& l);

/// The Llama lists (decoder_layer, embedding, head_and_loss, edit_input_needs_no_grad).
extern const FamilyLists kLlamaLists;

/// The list entry of a name, or nullptr.
[[nodiscard]] const TensorOp* find_op(const OpList& l, std::string_view name);
/// The same, to edit it (the families' list edits).
[[nodiscard]] TensorOp* find_mut(OpList& l, std::string_view name);
/// Where the entry of a name is (l.end() if none): the place to insert before it.
[[nodiscard]] OpList::iterator position(OpList& l, std::string_view name);

}  // namespace memfit::sched
