// The estimate: model states + activations composed into a timeline of one training step (or
// an inference run); the peak is the largest moment, reported with its named components.
//
// Timeline of a training step (PyTorch + Transformers, zero_grad(set_to_none=True)):
//   forward   weights + optimizer states + saved activations of every layer (+ AMP weight casts)
//   loss      + logits, their fp32 copy and the log-softmax output
//   backward  starts with the loss/head gradients; then each layer frees its saved activations
//             while its parameter gradients appear: the live total is linear in the number of
//             layers processed, so its maximum is at one end of each run of identical layers
//   step      weights + gradients + optimizer states (created lazily on the first step) + the
//             optimizer's temporaries (foreach AdamW: one extra copy of exp_avg_sq)
// The steady state (step >= 2) has optimizer states during forward/backward, so states are
// present throughout. Then the CUDA side: cuBLAS workspace (inside the allocator), the caching
// allocator's overhead (reserved - allocated) and the CUDA context (outside the allocator).
//
// That timeline is the engine. For the training runs the tensor schedule covers (schedule.hpp
// step_setup) the allocated peak, its phase, the phase peaks and the components come from the
// schedule instead (its live tensors at its peak), where the engine agrees within 2 %; where the
// two disagree the larger is reported (choose_allocated); Estimate::allocated_method says which.
#include "memfit/estimate.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <string_view>
#include <optional>

#include "activations.hpp"
#include "frameworks.hpp"
#include "memfit/error.hpp"
#include "memfit/gpus.hpp"
#include "parallel.hpp"
#include "reserved.hpp"
#include "schedule.hpp"
#include "states.hpp"

namespace memfit {

using namespace detail;

namespace {

constexpr u64 MiB = u64{1} << 20;

/// A moment's bytes per component name, in the order first set. A fixed array, not a map of
/// strings: the engine builds a dozen moments for every estimate (a plan makes thousands), and
/// the map's node and string allocations were most of its cost. Names must outlive it (they are
/// the static component names).
class PartBytes {
 public:
  using Entry = std::pair<std::string_view, u64>;
  PartBytes() = default;
  PartBytes(std::initializer_list<Entry> entries) {
    for (const Entry& e : entries) (*this)[e.first] = e.second;
  }
  /// The bytes of `name`, added as 0 when absent.
  u64& operator[](std::string_view name) {
    for (size_t i = 0; i < size_; ++i)
      if (at_[i].first == name) return at_[i].second;
    if (size_ == at_.size()) throw Error("estimate: a moment with more components than PartBytes holds");
    at_[size_] = {name, 0};
    return at_[size_++].second;
  }
  [[nodiscard]] const Entry* find(std::string_view name) const {
    return std::find_if(begin(), end(), [&](const Entry& e) { return e.first == name; });
  }
  [[nodiscard]] const Entry* begin() const { return at_.data(); }
  [[nodiscard]] const Entry* end() const { return at_.data() + size_; }

 private:
  std::array<Entry, 16> at_{};
  size_t size_ = 0;
};

struct Moment {
  std::string phase;
  PartBytes parts;  // component name -> bytes
  [[nodiscard]] u64 total() const {
    u64 t = 0;
    for (const auto& [k, v] : parts) t = add(t, v);
    return t;
  }
};

const char* formula_of(std::string_view name) {
  static const std::map<std::string, const char*, std::less<>> f = {
      {"weights", "parameters x bytes of their stored dtype (quantized Linear layers: code bits + block constants); sharded share under ZeRO-3/FSDP"},
      {"master_weights", "fp32 master copy of trainable parameters kept by the optimizer (DeepSpeed/Megatron mixed precision)"},
      {"gradients", "trainable parameters x gradient bytes; during backward only the layers already processed"},
      {"optimizer_states", "per trainable parameter: AdamW 2 states, SGD-momentum/Lion 1, 8-bit AdamW 2 bytes + absmax, Adafactor row+column factors"},
      {"activations", "tensors saved for backward: per-layer sum over the ops of the layer x layers (checkpointing: each layer's input, plus one layer recomputed)"},
      {"logits_loss", "logits [b,s,V], their fp32 copy, the log-softmax output and its gradients"},
      {"autocast_weight_copies", "half casts of Linear weights that autocast keeps for backward (2 bytes x weights)"},
      {"temporary_buffers", "transient tensors at the peak moment: attention scores, gradient buffers, optimizer-step temporaries"},
      {"kv_cache", "2 x layers x kv_heads x head_dim x bytes x tokens (MLA: latent + rope key; sliding-window layers: the window)"},
      {"communication_buffers", "gradient buckets, gathered parameter units (ZeRO-3/FSDP), pipeline send/recv buffers"},
      {"cublas_workspace", "cuBLAS/cuBLASLt workspaces, allocated through PyTorch's allocator"},
      {"allocator_overhead", "caching allocator: reserved minus allocated (approximate rule: 20 MiB + 1/4 of the activations, loss buffers and temporaries at the peak)"},
      {"allocator_overhead_unsure", "caching allocator: reserved minus allocated, the larger of the approximate rule (20 MiB + 1/4 of the peak's activations, loss buffers and temporaries) and the fragmentation simulated over the tensor schedule, whose allocated peak is over 2 % from the engine's here"},
      {"allocator_whole_blocks", "caching allocator, simulated over the step's tensor schedule: blocks handed out whole (a cached block whose remainder is too small to split off) count at their full size in allocated_bytes, beyond the tensors' 512-byte sizes"},
      {"allocator_fragmentation", "caching allocator, simulated over the step's tensor schedule: segments held at the reserved peak minus the allocated peak (2 MiB segments for blocks <= 1 MiB, 20 MiB or the size rounded to 2 MiB above; freed blocks cached, split and merged; a request no cached block fits takes a new segment)"},
      {"cuda_context", "CUDA context and kernel images outside the allocator (nvidia-smi minus reserved)"},
      {"paged_optimizer_states", "bitsandbytes paged states in CUDA unified memory (outside PyTorch's allocator)"},
      {"nccl_buffers", "NCCL channel buffers, allocated outside PyTorch's allocator"},
  };
  auto it = f.find(name);
  return it == f.end() ? "" : it->second;
}

/// The request as the activations see it: engines that run the model in half precision with an
/// fp32 master in the optimizer (DeepSpeed, FSDP, Megatron) have pure-half activations.
Request activation_view(const Request& r, MixedMode mixed) {
  Request a = r;
  if (mixed == MixedMode::HalfMaster || mixed == MixedMode::ShardedFp32)
    a.precision = r.precision == Precision::AmpFp16 ? Precision::Fp16 : Precision::Bf16;
  return a;
}

/// The gradients of a layer's MLP block (its Linears reading the second norm's output or the
/// intermediate: experts, router, shared expert; under LoRA their adapters), the rank's share:
/// what the block's backward has made when the second norm's backward runs. (PEFT's parametrised
/// experts' adapter gradients are left out.)
u64 mlp_block_grads(const Request& r, const LayerGroup& g, const TrainableLinears& t, u64 grads, u64 total_t) {
  if (g.frozen) return 0;
  u64 block_t = 0;
  for (size_t j = 0; j < g.linears.size() && j < t.saves_input.size(); ++j) {
    const Linear& lin = g.linears[j];
    if (lin.input != LinearInput::MlpIn && lin.input != LinearInput::MlpHidden) continue;
    if (lin.routed && !g.moe) continue;
    if (r.task == Task::Full) block_t = add(block_t, lin.params());
    else if (r.lora.rank > 0 && t.saves_input[j] && !lin.routed)
      block_t = add(block_t, mul(r.lora.rank, add(lin.in, lin.out)));
  }
  return scale(grads, block_t, total_t);
}

/// One training step as its moments read it: the request (and the request as the activations
/// see it), the model states, the layout, and this rank's role and states, with the sizes every
/// moment uses.
struct StepInputs {
  const Request& r;
  Request ar;  ///< activation_view(r, l.mixed)
  const ModelSpec& m;
  const ModelStates& s;
  const Layout& l;
  const RankRole& role;
  const RankStates& rs;
  u64 b = 0;                     ///< micro-batch size
  u64 seq = 0;                   ///< sequence length per rank (context parallelism splits it)
  u64 tokens = 0;                ///< b x seq
  bool gc = false;               ///< gradient checkpointing
  bool accumulate = false;       ///< gradients accumulate over micro-batches
  bool grads_unsharded = false;  ///< see step_inputs
  u64 in_flight = 0;             ///< micro-batches whose activations are alive at once (RankRole)
  u64 total_t = 1;               ///< the rank's trainable parameters (at least 1): gradient shares divide by it
};

StepInputs step_inputs(const Request& r, const ModelStates& s, const Layout& l, const RankRole& role,
                       const RankStates& rs) {
  StepInputs st{.r = r, .ar = activation_view(r, l.mixed), .m = r.model, .s = s, .l = l, .role = role, .rs = rs};
  st.b = r.micro_batch_size;
  st.seq = r.sequence_length / l.cp;
  st.tokens = mul(st.b, st.seq);
  st.gc = r.gradient_checkpointing;
  st.accumulate = r.gradient_accumulation_steps > 1;
  // rank_states already holds whole (unsharded) gradients under no_sync accumulation
  st.grads_unsharded = st.accumulate && r.parallelism.unsharded_grad_accumulation;
  st.in_flight = role.in_flight;
  st.total_t = std::max<u64>(1, rs.trainable);
  return st;
}

/// A run of identical layers (one LayerGroup on this rank) as the backward through it reads it:
/// bytes per layer, this rank's share, the in-flight micro-batches included where they count.
struct LayerRun {
  u64 count;          ///< layers in the run
  u64 kept;           ///< kept for backward (checkpointing: the layer's input and what contexts hold)
  u64 full_saved;     ///< checkpointing: what the recomputed forward saves (LayerActivations::recomputed)
  u64 mlp_bwd_t;      ///< extra live at the MLP block's worst backward moment
  u64 attn_bwd_t;     ///< extra live at the attention block's worst backward moment, before attn_released
  u64 attn_released;  ///< the layer's saved tensors already released at that moment
  u64 grad;           ///< the layer's share of the rank's gradients
  u64 casts;          ///< autocast weight casts kept for backward (none under checkpointing)
  u64 fwd_t;          ///< extra live at the worst moment of the recomputed forward
  u64 in_grad;        ///< the incoming gradient while the recomputation runs (the checkpointed input's size)
  u64 held;           ///< gradients the first backward nodes hold while the recomputation runs
  u64 down_grad;      ///< gradients alive at the MLP's worst moments (layer_grads)
  u64 late_grad;      ///< gradients alive at the attention's worst backward moment (layer_grads)
  u64 new_grads;      ///< with gradients kept: the new, not yet accumulated, gradient (new_weight_grads)
  u64 mlp_at_down;    ///< extra live at the down projection's node
  u64 moe_wgrad;      ///< trained fused experts: extra live after down's node (act * up's node, gate_up's weight gradient)
  u64 moe_down_grad;  ///< ... and the down stack's gradient then
  u64 shared_bwd;     ///< a shared expert whose backward runs last: extra live at it
  u64 shared_grad;    ///< ... and the gradients made by then
  u64 norm_bwd;       ///< a sequential block's second RMSNorm: extra live at its backward
  u64 norm_grad;      ///< ... and the MLP block's gradients then (mlp_block_grads)
};

/// The layers' forward, summed over the runs: what the step's moments read of them.
struct LayerTotals {
  std::vector<LayerRun> runs;
  u64 kept = 0;         ///< activations every layer keeps for backward (all runs)
  u64 casts_total = 0;  ///< autocast weight casts the layers keep for backward
  u64 fwd_t_max = 0;    ///< the largest extra live in one layer's forward
  u64 ctx_graph = 0;  // what quantized Linears' autograd contexts hold (plain ctx attributes), all layers
  u64 second_layer_moment = 0;  // the second layer's attention beside the first's unsaved probabilities (below)
};

/// Layer group i's activations, this rank's share.
LayerActivations rank_layer_activations(const StepInputs& st, size_t i) {
  const ModelSpec& m = st.m;
  LayerActivations la = shard_layer(layer_activations(m, m.groups[i], st.ar, st.s.linears[i], st.tokens, st.seq), st.l);
  if (m.groups[i].frozen) {
    // frozen bottom layers: nothing below the first trained layer needs a gradient, so
    // autograd keeps nothing; their forward is a no-grad forward
    la.forward_transient = la.recompute_transient = la.inference_transient;
    la.saved = la.checkpoint_saved = la.checkpoint_ctx_held = la.recomputed = la.backward_transient = 0;
    la.mlp_backward_transient = la.mlp_backward_at_down = la.attention_backward_transient = la.moe_backward_start = 0;
    la.attention_backward_gross = la.attention_released = la.moe_weight_grad_moment = la.shared_expert_backward = 0;
    la.mlp_norm_backward = 0;
  }
  return la;
}

/// Weight gradients of layer group i alive at its worst backward moments (bytes, this rank).
struct LayerGrads {
  u64 down_grad = 0, late_grad = 0, moe_down_grad = 0, shared_grad = 0;
};

/// Layer group i's LoRA adapters on down_proj: their gradients, this rank's share.
u64 lora_down_grad(const StepInputs& st, size_t i) {
  const Request& r = st.r;
  const ModelSpec& m = st.m;
  const Layout& l = st.l;
  // LoRA on down_proj: its adapter's lora_A and lora_B gradients are made by the nodes before
  // the MLP's worst moment (the sum of the base and adapter input gradients) and stay as .grad
  // (measured, peak dump of tuning case biogpt/h256-L3-V2048/lora-r64-mlp/fp32/gc/eager/b4s48/sgd_momentum:
  // layer 0's fc2 lora_A [64, 1024] and lora_B [256, 64] gradients at the add)
  if (r.task != Task::Full && !m.groups[i].moe && !m.groups[i].frozen && r.lora.rank > 0 &&
      (l.method == ParallelMethod::Single || l.method == ParallelMethod::Ddp)) {
    u64 adapter_t = 0;
    const std::vector<Linear>& lins = m.groups[i].linears;
    for (size_t j = 0; j < lins.size() && j < st.s.linears[i].saves_input.size(); ++j)
      if (lins[j].input == LinearInput::MlpHidden && !lins[j].routed && st.s.linears[i].saves_input[j])
        adapter_t = add(adapter_t, mul(r.lora.rank, add(lins[j].in, lins[j].out)));
    return scale(st.rs.grads, adapter_t, st.total_t);
  }
  return 0;
}

/// The weight gradients that layer group i's backward has made by its MLP's and its attention's
/// worst moments (gradients appearing layer by layer).
LayerGrads layer_grads(const StepInputs& st, size_t i, const LayerActivations& la) {
  const Request& r = st.r;
  const ModelSpec& m = st.m;
  const Layout& l = st.l;
  const RankStates& rs = st.rs;
  const u64 total_t = st.total_t;
  // the trained down_proj's gradient (dense layers, replicated or DDP gradients). Gemma2/3 put
  // a post-feedforward RMSNorm after down_proj: their worst backward moment is that norm's fp32
  // backward, before down_proj's node runs (measured, peakdump gemma2/full/bf16/gc/eager: the
  // peak at post_feedforward_layernorm's backward, no gradient of the layer yet)
  const bool post_ff_norm = detail::family_activations(m).post_norms;
  // FSDP2 (not torchtune's per-module units): the unit's gradients accumulate unsharded on its
  // unsharded parameters until the unit's post-backward reduce-scatter, so down_proj's gradient
  // is whole at the MLP backward (measured, fsdpdump llama/full/bf16/gc/sdpa/fsdp_full_shardx2
  // rank 0: mm.default [128, 512] bf16 = 131,072 B alive at the peak in layers.0's MLP backward).
  const bool fsdp2_units = (l.method == ParallelMethod::FsdpFullShard || l.method == ParallelMethod::FsdpShardGradOp) && r.runtime.framework != Framework::Torchtune;
  // At the attention block's worst backward moment (eager: softmax's backward) the nodes after
  // it have run: the gradients of o_proj and of every MLP Linear exist (measured, peak dump of
  // tuning case phi3/h256-L2-V2048/full/fp32/nogc/eager/b1s256/adamw_fused: gate_up_proj's,
  // down_proj's and o_proj's fp32 gradients alive at _softmax_backward_data).
  LayerGrads g;
  g.down_grad = g.late_grad = lora_down_grad(st, i);
  const bool moe = m.groups[i].moe;
  if (r.task == Task::Full && !m.groups[i].frozen &&
      (l.method == ParallelMethod::Single || l.method == ParallelMethod::Ddp || fsdp2_units)) {
    u64 down_t = 0, late_t = 0, routed_down_t = 0;
    for (const Linear& lin : m.groups[i].linears) {
      if (lin.routed && !moe) continue;
      if (lin.routed && lin.input == LinearInput::MlpHidden) routed_down_t = add(routed_down_t, lin.params());
      if (lin.input == LinearInput::MlpHidden) down_t = add(down_t, lin.params());
      if (lin.input == LinearInput::MlpHidden || lin.input == LinearInput::MlpIn || lin.input == LinearInput::AttnOut)
        late_t = add(late_t, lin.params());
    }
    const u64 grads_base = fsdp2_units && !st.grads_unsharded ? mul(rs.grads, l.shard) : rs.grads;
    if (!post_ff_norm && !moe) g.down_grad = scale(grads_base, down_t, total_t);
    // trained fused experts: the down stack's gradient at gate_up's weight-gradient moment
    if (moe) g.moe_down_grad = scale(grads_base, routed_down_t, total_t);
    // a shared expert whose backward runs last (activations.cpp shared_expert_backward): by then
    // the routed stacks, the router, the shared gate and the shared down_proj have their gradients
    if (moe && la.shared_expert_backward > 0) {
      u64 before_t = 0;
      for (const Linear& lin : m.groups[i].linears)
        if (lin.routed || lin.input == LinearInput::MlpHidden || lin.name == "gate" || lin.name == "shared_expert_gate")
          before_t = add(before_t, lin.params());
      g.shared_grad = scale(grads_base, before_t, total_t);
    }
    // The same in a checkpointed layer's recomputed backward (measured, peak dumps of tuning
    // cases gptj/h256-L2-V1024/full/amp_bf16/gc/eager/b1s512/adamw: layer 0's fc_in, fc_out and
    // out_proj gradients at _softmax_backward_data; gemma2/h128-L2-V2048/full/fp32/gc/eager/b1s1024/sgd:
    // gate, up, down and o_proj's; CPU SDPA's math path alike, biogpt/h128-L3-V1024/full/fp32/gc/sdpa/b2s512/adamw:
    // fc1, fc2 and out_proj's at the PV bmm's backward). (Fused kernels keep down_proj's gradient
    // only, as before.)
    // One-shape gpt_bigcode gc eager overshot with it because of the position table's gradient
    // (see head_t).
    // MoE blocks (eager): the fused expert stacks' and the router's gradients too, made by the
    // block's backward before the attention's (measured, peak dump of tuning case
    // mixtral/h384-L2-V4096/full/bf16/gc/eager/b2s128/sgd: layer 0's [4, 2688, 384] and
    // [4, 384, 1344] bf16 _grouped_mm gradients, the router's and o_proj's at
    // _softmax_backward_data). Their MLP moments keep the earlier bound (no down_grad).
    g.late_grad = la.attention_backward_unfused ? scale(grads_base, late_t, total_t) : g.down_grad;
  }
  return g;
}

/// With gradients kept: the new weight gradient alive beside the accumulated .grad at layer group
/// i's MLP moments (at most the layer's share `grad`).
u64 new_weight_grads(const StepInputs& st, size_t i, u64 grad) {
  const ModelSpec& m = st.m;
  // With gradients kept (accumulation), AccumulateGrad adds each new weight gradient into .grad
  // as soon as it is made: at the MLP's worst moments one new gradient is alive, down_proj's,
  // while its node makes its input and weight gradients; by the activation's backward it is
  // accumulated (measured, peak dumps of tuning cases
  // qwen2/h384-L3-V2048/full/bf16/gc/sdpa/b1s128/sgd/gas2: down_proj's bf16 [336, 1824] mm next
  // to dm, the other [V, h] being the tied head's (below);
  // biogpt/h512-L4-V4096/full/fp32/gc/sdpa/b2s128/sgd_momentum/gas2: fc2's fp32 [512, 2048] mm
  // next to dm; bloom/h256-L2-V1024/full/fp32/nogc/eager/b1s96/adamw_fused/gas2: none at
  // bloom_gelu's backward). MoE layers keep the earlier bound, two of the largest.
  // LoRA: an adapter's weight gradient is accumulated (AccumulateGrad runs first) before the
  // base and adapter input gradients are summed, the MLP's worst moment: none is alive then
  // (measured, peak dump of tuning case codegen/h512-L2-V1024/lora-r64-mlp/fp32/gc/eager/b4s96/sgd/gas2:
  // only the accumulated .grad next to three fp32 [384, 2048] at the add)
  u64 largest = 0;
  for (const Linear& lin : m.groups[i].linears) largest = std::max(largest, lin.weight_params() / std::max<u64>(1, lin.copies));
  u64 down_w = 0;
  for (const Linear& lin : m.groups[i].linears)
    if (lin.input == LinearInput::MlpHidden && !lin.routed) down_w = std::max(down_w, lin.weight_params());
  const u64 new_t = !m.groups[i].moe && down_w > 0 ? down_w : mul(2, largest);
  // (Also under LoRA in MoE layers: tuning cases deepseek_v3/h512-L2-V1024/lora-r16-all/bf16/nogc/sdpa/b1s48/adamw/gas2
  // and qwen2_moe/h512-L2-V1024/lora-r16-all/bf16/nogc/eager/b1s32/adafactor/gas2 are within 0.4 %
  // with no new adapter gradient, closer than with the two largest adapter matrices.)
  return st.r.task == Task::Full ? std::min(grad, scale(st.rs.grads, div_ceil(new_t, st.l.tp), st.total_t)) : 0;
}

/// Layer group i as a run of `count` identical layers.
LayerRun layer_run(const StepInputs& st, size_t i, u64 count, const LayerActivations& la) {
  const ModelSpec& m = st.m;
  const ModelStates& s = st.s;
  const Layout& l = st.l;
  const bool gc = st.gc;
  const u64 kept = mul(st.in_flight, gc ? add(la.checkpoint_saved, la.checkpoint_ctx_held) : la.saved);
  const u64 casts = gc ? 0 : mul(st.in_flight, div_ceil(s.groups[i].casts, l.tp));
  // this layer's share of the rank's gradients
  const u64 layer_t = add(div_ceil(s.groups[i].t_split, l.tp), s.groups[i].t_repl);
  const u64 grad = scale(st.rs.grads, layer_t, st.total_t);
  const LayerGrads g = layer_grads(st, i, la);
  // Checkpointing under autocast: the recomputed forward casts the layer's weights again (the
  // forward's cast cache is gone by then) and its matmuls keep the half copies until their own
  // backward. At an MoE block's first backward nodes (the weighted slot sum, the gathers) no
  // Linear of the layer has run its backward, so every cast is alive and no weight gradient
  // exists yet (measured, peak dump of tuning case
  // qwen2_moe/h256-L4-V4096/full/amp_bf16/gc/sdpa/b3s256/sgd_momentum at index_put: bf16 copies
  // of q, k, v, o, the router and the shared expert's gate, up and down, no half gradient).
  // (Dense layers' worst moments come later in their backward: adding the casts there overshoots
  // tuning cases that matched without them, e.g. qwen2/h336-L3-V2048/full/amp_bf16/gc/sdpa/b2s128/adafactor,
  // so they are left out there.)
  u64 mlp_bwd_t = la.mlp_backward_transient, mlp_at_down = la.mlp_backward_at_down;
  if (gc && m.groups[i].moe && s.groups[i].casts > 0) {
    const u64 start = add(la.moe_backward_start, div_ceil(s.groups[i].casts, l.tp));
    mlp_bwd_t = std::max(mlp_bwd_t, start);
    mlp_at_down = std::max(mlp_at_down, start);
  }
  return {count, kept, la.recomputed, mlp_bwd_t, la.attention_backward_gross, la.attention_released, grad, casts,
          la.recompute_transient, la.checkpoint_saved, la.recompute_held, g.down_grad, g.late_grad,
          new_weight_grads(st, i, grad), mlp_at_down, la.moe_weight_grad_moment, g.moe_down_grad,
          la.shared_expert_backward, g.shared_grad, la.mlp_norm_backward,
          mlp_block_grads(st.r, m.groups[i], s.linears[i], st.rs.grads, st.total_t)};
}

/// The first layer under LoRA without checkpointing (layer group i, `kept` per layer): what it
/// does not keep, taken off t.kept; its unsaved casts (returned) and the second layer's moment.
u64 first_lora_layer(const StepInputs& st, size_t i, const LayerActivations& la, u64 kept, LayerTotals& t) {
  const ModelSpec& m = st.m;
  const ModelStates& s = st.s;
  const u64 in_flight = st.in_flight;
  u64& all_kept = t.kept;
  u64 first_unsaved_casts = 0;
  // (A post-norm layer's norms read residual sums that need a gradient through the adapters:
  // BERT's embedding LayerNorm is the one over the embedding output, counted apart; measured,
  // tuning case bert/h128-L2-V1024/mlm/lora-r16-all/fp32/nogc/sdpa/b2s128/adamw: both
  // LayerNorms of layer 0 keep their input and statistics at the loss backward)
  const u64 first_norm = family_activations(m).post_norm_layers ? 0 : la.first_norm;
  all_kept = sub_floor(all_kept, mul(in_flight, add(first_norm, la.first_qk_unkept)));
  // Nor do its frozen Linears reading that norm keep their autocast weight cast (autocast
  // caches no cast of a frozen weight, and an op whose inputs need no gradient saves nothing;
  // measured, peak dump of llama/litgpt/lora/amp_bf16/nogc/sdpa/gas2: one bf16 qkv weight, layer 1's)
  if (s.groups[i].casts > 0) {
    u64 unsaved = 0;
    for (const Linear& lin : m.groups[i].linears)
      if (lin.input == LinearInput::AttnIn) unsaved = add(unsaved, mul(2, lin.weight_params()));
    first_unsaved_casts = mul(in_flight, div_ceil(unsaved, st.l.tp));
  }
  // In a parallel block the MLP reads that norm's output too: with no adapter on the MLP its
  // first-layer ops get no input needing a gradient and keep nothing (measured, tuning cases
  // phi/h256-L4-V1024/lora-r8-attn/fp32/nogc/sdpa/b2s48/adamw_fused and
  // gptj/h256-L3-V16384/lora-r16-attn/fp32/nogc/eager/b4s64/sgd: layer 0's gelu_new keeps none
  // of its four [T, i] tensors)
  bool mlp_adapted = false, attn_adapted = false;
  for (size_t j = 0; j < m.groups[i].linears.size(); ++j) {
    const LinearInput in = m.groups[i].linears[j].input;
    const bool mlp = in == LinearInput::MlpIn || in == LinearInput::MlpHidden;
    mlp_adapted = mlp_adapted || (mlp && s.linears[i].saves_input[j]);
    attn_adapted = attn_adapted || (!mlp && s.linears[i].saves_input[j]);
  }
  // (NeoX's parallel residual reads the layer input through a second norm: the same holds,
  // tuning case gpt_neox/h256-L3-V1024/lora-r32-attn/fp32/nogc/sdpa/b4s48/adamw_fused)
  if ((m.parallel_block || m.parallel_two_norms) && !mlp_adapted) all_kept = sub_floor(all_kept, mul(in_flight, la.mlp_saved));
  // A sequential block with adapters on the MLP only: the first layer's attention and the
  // norm after it see no input needing a gradient and keep nothing (measured, tuning cases
  // biogpt/h256-L4-V4096/lora-r8-mlp/fp32/nogc/eager/b1s96/sgd,
  // gemma2/h256-L4-V4096/lora-r8-mlp/bf16/nogc/eager/b3s96/sgd,
  // stablelm/h64-L4-V2048/lora-r4-mlp/fp32/nogc/sdpa/b1s64/adamw)
  if (!m.parallel_block && !attn_adapted && mlp_adapted)
    all_kept = sub_floor(all_kept, mul(in_flight, add(sub_floor(la.attn_saved, la.first_norm), la.mlp_norm)));
  // A parallel block with adapters on the MLP only: the first layer's attention keeps nothing;
  // the norm output stays for the MLP's adapters (tuning case
  // codegen/h128-L3-V4096/lora-r32-mlp/fp32/nogc/eager/b3s96/sgd/gas2)
  if (m.parallel_block && !attn_adapted && mlp_adapted)
    all_kept = sub_floor(all_kept, mul(in_flight, sub_floor(la.attn_saved, add(la.first_norm, la.first_norm_slot))));
  // Its attention probabilities, saved by no one, still live through the next layer's forward
  // where the model's loop keeps each block's return (tensor log of tuning case
  // falcon/h128-L2-V2048/lora-r8-mlp/bf16/nogc/eager/b1s512/sgd: layer 0's [1, 16, 512, 512]
  // _softmax dies at the end of layer 1's forward, beside layer 1's scores, masked scores and
  // softmax). Forward moments are transients over every layer's saved tensors: at the second
  // layer's attention the layers after it have saved none yet.
  u64 layers = 0;
  for (size_t j = i; j < m.groups.size(); ++j) layers = add(layers, st.role.layers[j]);
  if (!attn_adapted && mlp_adapted && layers > 1)
    t.second_layer_moment = sub_floor(add(la.forward_transient, la.returned_probs), mul(layers - 2, kept));
  return first_unsaved_casts;
}

/// The layers' forward on this rank, run by run (bottom to top).
LayerTotals layer_totals(const StepInputs& st) {
  const Request& r = st.r;
  const ModelSpec& m = st.m;
  const bool gc = st.gc;
  LayerTotals t;
  for (size_t i = 0; i < m.groups.size(); ++i) {
    const u64 count = st.role.layers[i];
    if (count == 0) continue;
    const LayerActivations la = rank_layer_activations(st, i);
    t.runs.push_back(layer_run(st, i, count, la));
    const u64 kept = t.runs.back().kept, casts = t.runs.back().casts;
    t.kept = add(t.kept, mul(count, kept));
    t.ctx_graph = add(t.ctx_graph, mul(count, mul(st.in_flight, la.checkpoint_ctx_held)));
    u64 first_unsaved_casts = 0;  // casts the first layer does not keep (LoRA, see below)
    // LoRA without checkpointing: the embedding output needs no gradient, so the first layer's
    // frozen first norm saves nothing (measured, gpt2/lora/fp32/nogc/eager: no ln_1 input, mean
    // or rstd of layer 0 alive at the loss backward; lora_A keeps ln_1's output). Nor do the
    // dropouts of its q/k/v adapters keep a mask (measured, llama-tiny all-linear lora_dropout 0.1:
    // no noise saved by layer 0's q/k/v lora_dropout; saved_tensors_hooks per module)
    if (st.role.embedding && t.runs.size() == 1 && !gc && r.task != Task::Full && !m.groups[i].frozen)
      first_unsaved_casts = first_lora_layer(st, i, la, kept, t);
    t.casts_total = sub_floor(add(t.casts_total, mul(count, casts)), first_unsaved_casts);
    // a checkpointed layer runs its forward without saving: a no-grad forward's live tensors
    const u64 ckpt_fwd_t = sub_floor(la.inference_transient, la.transient_inputs);
    t.fwd_t_max = std::max(t.fwd_t_max, gc ? std::max(ckpt_fwd_t, la.forward_transient) : std::max(la.forward_transient, t.second_layer_moment));
  }
  return t;
}

/// What the step's moments read besides the inputs, computed once: the activations outside the
/// layers, the layers' totals, the head, the weight casts, and the gradients and buffers that
/// live through the step.
struct StepTotals {
  u64 shared = 0;                ///< activations outside the layers through the forward (shared_forward_bytes)
  u64 shared_after = 0;          ///< ... after the model's forward
  u64 masks_gone_at_bottom = 0;  ///< ... of which freed before the bottom layer's backward
  LayerTotals layers;            ///< (activation offloading: layers.kept is what the device holds)
  bool offloaded = false;        ///< activation offloading
  u64 prev_graph_ctx = 0;        ///< what the previous step's graph still holds (previous_graph_contexts)
  HeadActivations head;          ///< this rank's head (chunked loss: loss peaks per chunk)
  u64 chunked_logits = 0;        ///< chunked loss: every chunk's logits in their dtype
  u64 head_casts = 0;            ///< autocast's cast of the lm_head weight
  u64 kept_logits = 0;           ///< logits the model output keeps through backward
  u64 forward_casts = 0;         ///< autocast weight casts alive through the forward and the loss
  bool grads_kept = false;       ///< gradients live through the whole step
  u64 persistent_grads = 0;      ///< ... their bytes (0 when they are not kept)
  bool fsdp = false;             ///< FSDP, any sharding strategy
  u64 comm = 0;                  ///< communication buffers through forward and backward
  u64 tied_head_t = 0;           ///< a tied head's trainable parameters (the token table's)
  u64 head_t = 0;                ///< the head's trainable parameters on this rank
  bool fsdp2_root = false;       ///< FSDP2's root unit holds the head: its gradients stay whole
  u64 head_grad = 0;             ///< the head's gradient, this rank's share
};

/// The activations outside the layers (embedding output, masks, position tables): on the ranks
/// with the embedding or the head.
void shared_activations(const StepInputs& st, StepTotals& t) {
  const RankRole& role = st.role;
  const ModelSpec& m = st.m;
  const Request& ar = st.ar;
  const u64 b = st.b, seq = st.seq;
  const bool gc = st.gc;
  const u64 shared = role.embedding || role.head ? shared_forward_bytes(m, ar, b, seq) : 0;
  t.shared = shared;
  // After the model's forward: without checkpointing eager attention's 4-D mask is gone (the
  // score add keeps nothing; measured, peak dump of tuning case
  // gemma/h128-L3-V1024/lora-r8-qv/fp32/nogc/eager/b2s512/sgd: no [2, 1, 512, 512] alive at the
  // loss backward); checkpointing keeps it as an input of each checkpointed layer.
  t.shared_after = gc || !(role.embedding || role.head) ? shared : sub_floor(shared, eager_mask_bytes(m, ar, b, seq));
  // With several 4-D masks (full + sliding), each lives while a checkpointed layer using it has
  // yet to run its backward: in the bottom layer's backward only that layer's kind is left
  // (Gemma-2: layer 0 is sliding, the full mask goes with layer 1's backward).
  const u64 masks_kept = gc && (role.embedding || role.head) ? eager_mask_bytes(m, ar, b, seq) : 0;
  t.masks_gone_at_bottom = masks_kept - masks_kept / eager_mask_count(m);
}

/// The layers' totals, then what activation offloading leaves on the device.
void layer_activations_on_device(const StepInputs& st, StepTotals& t) {
  t.layers = layer_totals(st);
  // Activation offloading (torchtune OffloadActivations): each layer's saved tensors move to
  // CPU memory after its forward and come back one layer ahead of its backward: the GPU holds
  // about two layers' worth.
  u64 max_kept = 0;
  for (const LayerRun& g : t.layers.runs) max_kept = std::max(max_kept, g.kept);
  t.offloaded = st.r.runtime.activation_offloading;
  if (t.offloaded) t.layers.kept = std::min(t.layers.kept, mul(2, max_kept));
}

/// What the autograd contexts of the previous step's graph still hold through this step's
/// forward, loss and optimizer step (`ctx_graph`: the layers' contexts).
u64 previous_graph_contexts(const Request& r, u64 ctx_graph) {
  // A loop that keeps the model output (LitGPT's fit(): `logits`, `loss`) keeps the whole autograd
  // graph of the step: backward frees what save_for_backward saved, but tensors a custom Function
  // keeps as plain ctx attributes (bitsandbytes MatMul4Bit's ctx.tensors before 0.43.2) live as long
  // as its node, i.e. through the optimizer step and the next step's forward and loss, until the
  // loop rebinds `loss` (bitsandbytes #1270, released in 0.43.2, stopped keeping A: "the bug that
  // caused a lot of memory issues with QLoRA"). Not when later steps are shorter than the first.
  return r.runtime.drop_outputs_before_backward || r.runtime.later_steps_shorter ? 0 : ctx_graph;
}

/// The head's activations (chunked loss: per chunk), the chunks' logits and the lm_head cast.
void head_totals(const StepInputs& st, StepTotals& t) {
  const Request& r = st.r;
  const RankRole& role = st.role;
  HeadActivations& head = t.head;
  head = role.head ? shard_head(head_activations(st.m, st.ar, r.task == Task::Full, st.tokens), st.l) : HeadActivations{};
  // Chunked cross-entropy (torchtune CEWithChunkedOutputLoss): the logits come as chunks, each
  // upcast to fp32 and reduced on its own; the fp32 log-softmax of every chunk is kept, but the
  // upcast copy and the backward's gradient buffers exist for one chunk at a time.
  // All chunks' logits in their dtype: held by the model output (eager loss) or saved by the
  // compiled loss, whose backward peak is one logits-sized gradient (activations.cpp).
  t.chunked_logits = r.runtime.compile ? head.loss_backward_peak : head.held_logits;
  if (r.runtime.loss_chunks > 1 && role.head) {
    const u64 c = r.runtime.loss_chunks;
    head.loss_forward_peak = div_ceil(head.loss_forward_peak, c);
    head.loss_backward_peak = add(div_ceil(head.loss_backward_peak, c), div_ceil(head.held_logits, c));
  }
  // The head is not checkpointed: under autocast its mm keeps the half cast of the lm_head weight
  // for the input gradient, with or without checkpointing (measured, peak dump of tuning case
  // codegen/h256-L2-V16384/full/amp_bf16/gc/eager/b1s192/sgd: a bf16 [16384, 256] alive at the
  // loss backward).
  t.head_casts = role.head ? div_ceil(st.s.head_casts, st.l.tp) : 0;
  t.kept_logits = r.runtime.drop_outputs_before_backward ? 0 : head.held_logits;
}

/// The weight casts through the forward, the gradients kept through the step and the
/// communication buffers.
void casts_grads_and_buffers(const StepInputs& st, StepTotals& t) {
  const Request& r = st.r;
  const ModelSpec& m = st.m;
  const ModelStates& s = st.s;
  const Layout& l = st.l;
  const RankStates& rs = st.rs;
  const bool gc = st.gc;
  // Under checkpointing autocast still caches the casts of trainable weights during forward.
  u64 cast_cache = 0;
  if (gc && r.task == Task::Full)
    for (size_t i = 0; i < m.groups.size(); ++i) cast_cache = add(cast_cache, mul(st.role.layers[i], div_ceil(s.groups[i].casts, l.tp)));
  t.forward_casts = add(gc ? cast_cache : t.layers.casts_total, t.head_casts);
  // Gradients live through the forward when they accumulate over micro-batches or are zeroed
  // rather than freed; stepping inside backward frees each one as soon as it is produced.
  t.grads_kept = (st.accumulate || !r.runtime.zero_grad_to_none) && !r.runtime.optimizer_in_backward;
  t.persistent_grads = t.grads_kept ? rs.grads : 0;
  // FSDP's reduce-scatter buffers exist only once a unit's backward has finished (its unsharded
  // gradients flattened for the collective): not in forward, not while the first unit of the
  // backward computes (measured, FSDP2 on gloo: llama-tiny fsdp_full_shard peaks in the last
  // layer's backward with the root and two units unsharded and no reduce-scatter buffer). DDP's
  // buckets are allocated in the first iteration and live for good.
  t.fsdp = l.method == ParallelMethod::FsdpFullShard || l.method == ParallelMethod::FsdpShardGradOp ||
           l.method == ParallelMethod::FsdpHybrid;
  t.comm = t.fsdp ? rs.gathered : add(rs.gathered, rs.buckets);
}

/// The head's trainable parameters and its weight gradient, this rank's share.
void head_gradient(const StepInputs& st, StepTotals& t) {
  const Request& r = st.r;
  const ModelSpec& m = st.m;
  const ModelStates& s = st.s;
  const Layout& l = st.l;
  const RankStates& rs = st.rs;
  // A tied head's weight gradient is the [V, h] token table's (waiting in autograd's input buffer
  // for the embedding's own); a learned position table gets its gradient only from the
  // embeddings' backward, after every layer (measured, peak dump of tuning case
  // gpt_bigcode/h256-L3-V1024/full/bf16/gc/sdpa/b2s128/sgd: the head's bf16 [1024, 256] mm alive
  // in layer 0's backward, no gradient of wpe [1024, 256]).
  t.tied_head_t = s.tied_embeddings ? sub_floor(s.emb_t, m.position_params) : 0;
  t.head_t = st.role.head ? add(div_ceil(s.head_t_split, l.vocab_split()), add(s.head_t_repl, div_ceil(t.tied_head_t, l.vocab_split()))) : 0;
  // FSDP2 reduce-scatters the root unit's gradients only in the final callback: through the
  // layers' backward the tied embedding / head gradient is whole (measured, fsdpdump llama
  // fsdp_full_shardx2 rank 0: mm.default [1024, 128] + the final norm's sum.dim_IntList alive in
  // layers.0's backward; bf16 gc: 262,400 B).
  t.fsdp2_root = t.fsdp && rs.gathered_root > 0 && r.runtime.framework != Framework::Torchtune;
  t.head_grad = scale(t.fsdp2_root && !st.grads_unsharded ? mul(rs.grads, l.shard) : rs.grads, t.head_t, st.total_t);
}

StepTotals step_totals(const StepInputs& st) {
  StepTotals t;
  shared_activations(st, t);
  layer_activations_on_device(st, t);
  t.prev_graph_ctx = previous_graph_contexts(st.r, t.layers.ctx_graph);
  head_totals(st, t);
  casts_grads_and_buffers(st, t);
  head_gradient(st, t);
  return t;
}

/// A moment of the step with the states that live through it: weights, master weights,
/// optimizer states, the kept gradients and the communication buffers.
Moment with_states(const char* phase, const StepInputs& st, const StepTotals& t) {
  Moment p{phase, {}};
  p.parts["weights"] = st.rs.weights;
  p.parts["master_weights"] = st.rs.master;
  p.parts["optimizer_states"] = st.rs.states;
  p.parts["gradients"] = t.persistent_grads;
  p.parts["communication_buffers"] = t.comm;
  return p;
}

/// Forward: every layer's saved activations and the largest transient of one layer.
Moment forward_moment(const StepInputs& st, const StepTotals& t) {
  const HeadActivations& head = t.head;
  Moment fwd = with_states("forward", st, t);
  fwd.parts["activations"] = add(t.layers.kept, t.shared);
  fwd.parts["autocast_weight_copies"] = t.forward_casts;
  fwd.parts["temporary_buffers"] = t.layers.fwd_t_max;
  if (head.held_until_next_forward) fwd.parts["logits_loss"] = head.held_until_next_forward;  // the previous step's
  fwd.parts["activations"] = add(fwd.parts["activations"], t.prev_graph_ctx);
  return fwd;
}

/// The loss (the head's rank): the logits, their fp32 copy and the loss's forward peak.
Moment loss_moment(const StepInputs& st, const StepTotals& t) {
  const RankStates& rs = st.rs;
  const HeadActivations& head = t.head;
  Moment loss = with_states("loss", st, t);
  loss.parts["activations"] = add(add(t.layers.kept, t.shared_after), t.prev_graph_ctx);
  loss.parts["autocast_weight_copies"] = t.forward_casts;
  loss.parts["logits_loss"] = add(add(head.saved, head.held_logits), head.loss_forward_peak);
  // FSDP2 without resharding after forward (SHARD_GRAD_OP): every unit is unsharded at the loss,
  // plus the last layer's all-gather output held by comm_ctx.all_gather_state until the next
  // all-gather (measured, llama/qwen3 fp32 fsdp_shard_grad_opx2: the peak at nll_loss_forward).
  // FULL_SHARD really holds the root + that buffer at the loss (the layers are resharded); its
  // `comm` (root + two units) overcounts the loss by one unit, left as is (the loss is not the
  // peak of the measured FULL_SHARD runs: their backward, with the root's gradients whole, is).
  if (t.fsdp && rs.gathered_root == 0) loss.parts["communication_buffers"] = add(t.comm, rs.gather_held);
  return loss;
}

/// The loss's backward (the head's rank).
Moment loss_backward_moment(const StepInputs& st, const StepTotals& t) {
  const RankStates& rs = st.rs;
  const HeadActivations& head = t.head;
  // Backward at the head: loss gradients while every activation is still saved.
  Moment p = with_states("backward", st, t);
  // FULL_SHARD: at the loss backward only the root unit is unsharded (FSDP2 keeps the root
  // after forward; each layer is all-gathered again by its pre-backward hook)
  if (t.fsdp && rs.gathered_root > 0) p.parts["communication_buffers"] = rs.gathered_root;
  p.parts["activations"] = add(t.layers.kept, t.shared_after);
  p.parts["autocast_weight_copies"] = add(t.layers.casts_total, t.head_casts);
  p.parts["logits_loss"] = add(add(head.saved, t.kept_logits), head.loss_backward_peak);
  return p;
}

/// The trained head's own backward node, after the loss's: its weight gradient beside the logits'
/// gradient (a full fine-tune with an unchunked loss, one rank per model).
std::optional<Moment> head_node_moment(const StepInputs& st, const StepTotals& t) {
  const Request& r = st.r;
  const ModelSpec& m = st.m;
  const Layout& l = st.l;
  const HeadActivations& head = t.head;
  const u64 tokens = st.tokens;
  // Then the head's own node: the loss has freed its log-softmax output; the logits' gradient
  // (in the logits' dtype), the head's input gradient and its new weight gradient are alive next
  // to every saved activation (measured, peak dump of tuning case
  // gptj/h512-L2-V4096/full/bf16/nogc/eager/b1s48/adamw_fused/gas2: lm_head's bf16 [4096, 512] mm
  // beside its kept .grad, at the bias gradient's sum). Unchunked eager loss, one rank per model.
  if (!(st.role.head && r.task == Task::Full && t.head_t > 0 && head.held_logits > 0 && r.runtime.loss_chunks <= 1 &&
        (l.method == ParallelMethod::Single || l.method == ParallelMethod::Ddp) && !r.runtime.optimizer_in_backward))
    return std::nullopt;
  Moment p = with_states("backward", st, t);
  p.parts["gradients"] = add(t.persistent_grads, t.head_grad);
  p.parts["activations"] = add(t.layers.kept, t.shared_after);
  p.parts["autocast_weight_copies"] = add(t.layers.casts_total, t.head_casts);
  const u64 log_softmax_out = mul(tokens, 4, m.vocab);
  p.parts["logits_loss"] = add(sub_floor(head.saved, log_softmax_out), add(t.kept_logits, head.held_logits));
  p.parts["temporary_buffers"] = mul(tokens, dtypes_for(st.ar).compute, m.hidden);
  return p;
}

/// Chunked cross-entropy's backward (the head's rank, more than one chunk).
Moment chunked_loss_backward_moment(const StepInputs& st, const StepTotals& t) {
  const Request& r = st.r;
  const ModelSpec& m = st.m;
  const Layout& l = st.l;
  const u64 tokens = st.tokens, chunked_logits = t.chunked_logits;
  // Chunked cross-entropy (eager): the autograd engine runs every chunk's loss backward before
  // any chunk's output projection (the loss nodes are the newest), so the logits gradients of
  // all chunks wait in the logits dtype while the log-softmax outputs are already freed. A
  // trained head then sums its weight gradient over the chunks out of place: the running sum,
  // the next chunk's product and their sum are alive at the second chunk (measured, peak dump
  // of llama/torchtune/full/bf16/nogc/sdpa: three [1024, 128] bf16 and six of eight [16, 1024]
  // bf16 logits-gradient chunks at step 2's backward peak).
  // Under torch.compile the same holds: torchtune compiles each TransformerSelfAttentionLayer and
  // the loss's compute_cross_entropy, not the chunked output projection (training/_compile.py
  // compile_model / compile_loss), so the chunks' projections and their weight-gradient sum run
  // eager; what each compiled loss chunk saved (its logits) is freed by its own backward.
  const u64 c = r.runtime.loss_chunks;
  const u64 elem = chunked_logits / std::max<u64>(1, mul(tokens, div_ceil(m.vocab, l.vocab_split())));
  const u64 wgrad = mul(div_ceil(m.vocab, l.vocab_split()), m.lm_head.in, elem);
  const u64 queued = t.head_t > 0 ? add(scale(chunked_logits, c - 2, c), mul(3, wgrad))
                                  : add(scale(chunked_logits, c - 1, c), div_ceil(mul(tokens, m.lm_head.in, elem), c));
  const u64 freed = r.runtime.compile ? chunked_logits : scale(mul(tokens, 4, m.vocab), 1, l.vocab_split());
  Moment q = with_states("backward", st, t);
  if (t.fsdp && st.rs.gathered_root > 0) q.parts["communication_buffers"] = st.rs.gathered_root;  // as at the head's backward above
  q.parts["activations"] = add(t.layers.kept, t.shared_after);
  q.parts["autocast_weight_copies"] = add(t.layers.casts_total, t.head_casts);
  q.parts["logits_loss"] = add(sub_floor(t.head.saved, freed), queued);
  return q;
}

/// What one layer of run g has alive beyond the saved activations at its worst backward moment
/// (`grads_grow`: gradients appear layer by layer).
u64 layer_backward_temporaries(const LayerRun& g, bool grads_grow, bool gc) {
  // Checkpointed layer: its recomputed forward (with the incoming gradient alive), then its
  // backward over the recomputed tensors.
  // Gradients appearing layer by layer: the layer's MLP backward moments come after
  // down_proj's node has produced its weight (and bias) gradient (measured,
  // bloom/full/fp32/nogc/eager: dense_4h_to_h's 262,656 B of gradient next to BloomGelu's
  // backward temporaries).
  // (the attention moment: its transients and gradients, less what the layer's MLP and the
  // attention block's tail have released by then)
  // (trained fused experts: also gate_up's weight-gradient moment, activations.cpp; with
  // gradients kept the down stack's is accumulated by then)
  // (the second norm's backward, activations.cpp mlp_norm_backward: by then the MLP block's
  // weight gradients exist)
  const u64 bwd_t = grads_grow ? std::max({add(g.mlp_bwd_t, g.down_grad), sub_floor(add(g.attn_bwd_t, g.late_grad), g.attn_released),
                                           g.moe_wgrad > 0 ? add(g.moe_wgrad, g.moe_down_grad) : 0,
                                           g.shared_bwd > 0 ? add(g.shared_bwd, g.shared_grad) : 0,
                                           g.norm_bwd > 0 ? add(g.norm_bwd, g.norm_grad) : 0})
                               : std::max({add(g.mlp_at_down, g.new_grads), g.mlp_bwd_t, sub_floor(g.attn_bwd_t, g.attn_released),
                                           g.moe_wgrad, g.shared_bwd, g.norm_bwd});
  return gc ? std::max(add(g.full_saved, bwd_t), add(g.full_saved, add(g.fwd_t, add(g.in_grad, g.held)))) : bwd_t;
}

/// Backward through the layers, appended to `out`.
void layers_backward(const StepInputs& st, const StepTotals& t, std::vector<Moment>& out) {
  const Request& r = st.r;
  const RankRole& role = st.role;
  const RankStates& rs = st.rs;
  const std::vector<LayerRun>& runs = t.layers.runs;
  const bool grads_kept = t.grads_kept;
  // Backward through the layers, top to bottom: both ends of each run of identical layers.
  // gradients that appear layer by layer (not when they are kept all along or freed at once)
  const bool grads_grow = !grads_kept && !r.runtime.optimizer_in_backward;
  u64 grads_done = grads_grow ? t.head_grad : 0;
  // With gradients kept, a tied head's new weight gradient still waits in autograd's input buffer
  // for the embedding's own (see the tied-embedding moment below), beside the kept .grad, through
  // every layer's backward (measured, peak dump of tuning case
  // biogpt/h512-L4-V4096/full/fp32/gc/sdpa/b2s128/sgd_momentum/gas2: an fp32 [4096, 512] mm next
  // to the accumulated [4096, 512] .grad in the last layer's MLP backward).
  const u64 head_waiting = grads_kept && !grads_grow ? scale(rs.grads, div_ceil(t.tied_head_t, st.l.vocab_split()), st.total_t) : 0;
  u64 remaining_kept = t.layers.kept, remaining_casts = t.layers.casts_total;
  for (size_t gi = runs.size(); gi-- > 0;) {
    const LayerRun& g = runs[gi];
    for (int end = 0; end < 2; ++end) {
      const u64 done = end == 0 ? 0 : g.count - 1;
      Moment p = with_states("backward", st, t);
      p.parts["gradients"] = add(t.persistent_grads, add(grads_done, grads_grow ? mul(done, g.grad) : 0));
      const u64 left = sub_floor(remaining_kept, mul(done, g.kept));
      const bool bottom_layer = role.embedding && gi == 0 && done + 1 == g.count;
      p.parts["activations"] = add(t.offloaded ? std::min(left, mul(2, g.kept)) : left, sub_floor(t.shared_after, bottom_layer ? t.masks_gone_at_bottom : 0));
      p.parts["autocast_weight_copies"] = sub_floor(remaining_casts, mul(done, g.casts));
      const u64 layer_t = layer_backward_temporaries(g, grads_grow, st.gc);
      p.parts["temporary_buffers"] = add(layer_t, role.head ? head_waiting : 0);
      p.parts["logits_loss"] = t.kept_logits;
      const bool first_unit = gi + 1 == runs.size() && done == 0;
      // FSDP2 on later units: the root, the unit's unsharded parameters and its all-gather output
      // (held in comm_ctx.all_gather_state), i.e. `comm`; the previous unit's reduce-scatter buffer
      // is already freed (measured, fsdpdump bf16 gc fsdp_full_shardx2 in layers.0's backward: no
      // [475648]-byte reduce-scatter input alive). Other FSDP set-ups keep the bucket.
      if (t.fsdp && !first_unit) p.parts["communication_buffers"] = t.fsdp2_root ? t.comm : add(t.comm, rs.buckets);
      out.push_back(p);
    }
    grads_done = add(grads_done, grads_grow ? mul(g.count, g.grad) : 0);
    remaining_kept = sub_floor(remaining_kept, mul(g.count, g.kept));
    remaining_casts = sub_floor(remaining_casts, mul(g.count, g.casts));
  }
}

/// The trainable parameters of FSDP2's root unit: embeddings, the untied head, the final norm.
u64 root_trainable(const ModelStates& s) { return add(s.emb_t, add(s.head_t_split, s.head_t_repl)); }

/// A moment at the end of FSDP2's backward: the states, the layers' gradients sharded (the root's,
/// whole until the final callback, are the caller's), every layer unit resharded after its
/// backward but FULL_SHARD's last backward all-gather (layer 0's), held in comm_ctx.all_gather_state.
Moment fsdp2_backward_end(const StepInputs& st, const StepTotals& t) {
  const RankStates& rs = st.rs;
  Moment p = with_states("backward", st, t);
  p.parts["gradients"] = t.grads_kept ? rs.grads : sub_floor(rs.grads, scale(rs.grads, root_trainable(st.s), st.total_t));
  p.parts["communication_buffers"] = st.l.method == ParallelMethod::FsdpShardGradOp ? 0 : rs.gather_held;
  p.parts["activations"] = t.shared_after;
  return p;
}

/// Backward through a trained, tied token embedding (full fine-tune, one rank or FSDP2's root).
std::optional<Moment> tied_embedding_moment(const StepInputs& st, const StepTotals& t) {
  const Request& r = st.r;
  const ModelSpec& m = st.m;
  const ModelStates& s = st.s;
  const RankStates& rs = st.rs;
  // Backward through a trained, tied token embedding (one rank holds the whole vocabulary): the
  // head's weight gradient waits in autograd's input buffer until the embedding's backward has
  // made its own dense [V, h] gradient, and the two are summed out of place before the weight's
  // AccumulateGrad runs: two [V, h] buffers beyond the gradient, three when gradients are kept
  // (the .grad already exists and the sum is added to it). Negligible at vocab 1024; the peak of
  // a step when vocab x hidden outgrows the activations (measured, tuning cases
  // gemma2/h384-L2-V32000/full/bf16/nogc/eager/b2s32/adamw and
  // falcon/h384-L3-V32000/full/amp_bf16/gc/eager/b2s64/adamw/gas2: 3 x [32000, 384] alive in
  // embedding_dense_backward / the input-buffer add, all layer gradients done).
  // Under FSDP2 the tied table is the root unit's, unsharded there, and its gradients are whole
  // (reduced only in the final callback): the head's and the embedding's [V, h] gradients and
  // their sum beside the root's unsharded weights and the layers' sharded gradients (measured,
  // tuning case llama/h192-L3-V16384/full/fp32/nogc/sdpa/b1s64/sgd/fsdp_full_shardx2: 3 x
  // [16384, 192] fp32 beside the [16384, 192] unsharded table at the embedding's backward).
  const bool root = rs.root_params > 0;
  if (!(r.task == Task::Full && st.role.embedding && s.tied_embeddings && s.emb_t > 0 &&
        (st.l.method == ParallelMethod::Single || root) && !r.runtime.optimizer_in_backward))
    return std::nullopt;
  if (root) {
    Moment p = fsdp2_backward_end(st, t);
    const u64 table = scale(mul(rs.grads, st.l.shard), mul(m.vocab, m.hidden), st.total_t);
    p.parts["communication_buffers"] = add(p.parts["communication_buffers"], rs.root_params);
    p.parts["temporary_buffers"] = mul(t.grads_kept ? 4 : 3, table);
    return p;
  }
  Moment p = with_states("backward", st, t);
  p.parts["gradients"] = rs.grads;
  p.parts["activations"] = t.shared_after;
  const u64 table = scale(rs.grads, mul(m.vocab, m.hidden), st.total_t);
  p.parts["temporary_buffers"] = mul(t.grads_kept ? 3 : 2, table);
  return p;
}

/// FSDP2's final callback (the root unit's post-backward, run once every layer unit has reduced
/// its gradients): the root's unsharded gradients are taken off its parameters, the parameters
/// resharded, and foreach_reduce allocates the reduce-scatter input, copies the gradients into it
/// and only then drops them, before the output shard is allocated (torch 2.15
/// _fsdp_param_group.py post_backward, _fsdp_collectives.py foreach_reduce). On gloo the
/// reduce-scatter works on one more copy of the input (measured, tuning case
/// qwen3/h128-L2-V32000/full/fp32/nogc/sdpa/b2s32/adamw/fsdp_shard_grad_opx2 rank 0 at the end of
/// backward: the [8192128] input, a [4096064] `split` over a copy of it and the [4096064] output,
/// 2.5 x the root's gradients, beside the layers' sharded gradients). With a large vocabulary
/// this is the step's peak.
std::optional<Moment> fsdp2_root_reduce_moment(const StepInputs& st, const StepTotals& t) {
  const Request& r = st.r;
  const ModelStates& s = st.s;
  const RankStates& rs = st.rs;
  const Layout& l = st.l;
  if (!(rs.root_params > 0 && r.task == Task::Full && st.role.embedding && st.role.head && l.shard > 1 &&
        !r.runtime.optimizer_in_backward))
    return std::nullopt;
  const u64 root_grads = mul(scale(rs.grads, root_trainable(s), st.total_t), l.shard);
  Moment p = fsdp2_backward_end(st, t);
  const u64 copy_in = mul(2, root_grads);
  const u64 after = add(add(root_grads, div_ceil(root_grads, l.shard)), r.device == Device::Cpu ? root_grads : 0);
  p.parts["temporary_buffers"] = std::max(copy_in, after);
  return p;
}

/// The optimizer step.
Moment optimizer_step_moment(const StepInputs& st, const StepTotals& t) {
  const Request& r = st.r;
  const RankStates& rs = st.rs;
  // Optimizer step: all gradients, states, step temporaries.
  Moment step = with_states("optimizer_step", st, t);
  step.parts["gradients"] = r.runtime.optimizer_in_backward ? 0 : rs.grads;
  step.parts["communication_buffers"] = rs.buckets;
  step.parts["temporary_buffers"] = rs.step_temporary;
  if (t.head.held_until_next_forward) step.parts["logits_loss"] = t.head.held_until_next_forward;
  if (t.prev_graph_ctx) step.parts["activations"] = t.prev_graph_ctx;
  return step;
}

/// One training step as a timeline of moments (see the top of this file): forward, the loss and
/// its backward on the head's rank, each run of layers' backward, the tied embedding's backward,
/// the optimizer step.
std::vector<Moment> training_moments(const Request& r, const ModelStates& s, const Layout& l, const RankRole& role,
                                     const RankStates& rs) {
  const StepInputs st = step_inputs(r, s, l, role, rs);
  const StepTotals t = step_totals(st);
  std::vector<Moment> out;
  out.push_back(forward_moment(st, t));
  if (role.head) {
    out.push_back(loss_moment(st, t));
    out.push_back(loss_backward_moment(st, t));
    if (std::optional<Moment> p = head_node_moment(st, t)) out.push_back(*p);
    if (r.runtime.loss_chunks > 1) out.push_back(chunked_loss_backward_moment(st, t));
  }
  layers_backward(st, t, out);
  if (std::optional<Moment> p = tied_embedding_moment(st, t)) out.push_back(*p);
  if (std::optional<Moment> p = fsdp2_root_reduce_moment(st, t)) out.push_back(*p);
  out.push_back(optimizer_step_moment(st, t));
  return out;
}

/// Reserved minus allocated at the peak (PyTorch's caching allocator without expandable
/// segments). Blocks over 1 MiB are carved from segments rounded to 2 MiB, freed blocks are
/// split to serve later requests, and a request that no cached block fits reserves a new
/// segment: the tensors allocated and freed within a step (activations, loss buffers,
/// temporaries) leave holes, so the reserve grows with that churn. The fraction (1/4) and the
/// 20 MiB floor are fitted on the nine HF Trainer BERT-large runs of data/calibration that
/// report nvidia-smi with the CUDA context measured separately (V100, PyTorch 1.x, 2022; tagged
/// role "fit", so tools/calibrate.py lists them apart from the accuracy figures). No other
/// measurement supports these two numbers, on another GPU or PyTorch version;
/// persistent states (weights, gradients, optimizer states) are allocated once and do not
/// fragment.
u64 allocator_overhead(const Moment& peak) {
  u64 churn = 0;
  for (const char* k : {"activations", "logits_loss", "temporary_buffers", "autocast_weight_copies", "kv_cache",
                        "communication_buffers"}) {
    auto it = peak.parts.find(k);
    if (it != peak.parts.end()) churn = add(churn, it->second);
  }
  return add(20 * MiB, churn / 4);
}

u64 cuda_context_for(const Request& r) {
  if (r.runtime.cuda_context_bytes) return r.runtime.cuda_context_bytes;
  const GpuSpec* g = find_gpu(r.gpu.name);
  // A GPU not in the catalog: 500 MiB is an assumption (the middle of the catalog's assumed
  // values, see gpus.cpp), not a measurement; runtime.cuda_context_bytes overrides it.
  return g ? g->cuda_context_bytes : 500 * MiB;
}

/// The cuBLAS and cuBLASLt workspaces, allocated through PyTorch's allocator. From PyTorch's
/// source, not measured: its default CUBLAS_WORKSPACE_CONFIG is ":4096:2:16:8" (8.125 MiB) before
/// Hopper and ":4096:8" (32 MiB) on sm90+ (aten/src/ATen/cuda/CublasHandlePool.cpp), plus a
/// cuBLASLt workspace (1 MiB).
std::vector<u64> cublas_workspaces(const Request& r) {
  const GpuSpec* g = find_gpu(r.gpu.name);
  const std::string name = g ? g->name : "";
  const bool hopper = name.starts_with("H") || name.starts_with("B");
  return {hopper ? 32 * MiB : 8 * MiB + MiB / 8, MiB};
}

u64 cublas_workspace_for(const Request& r) {
  u64 total = 0;
  for (u64 w : cublas_workspaces(r)) total = add(total, w);
  return total;
}

constexpr const char* kSimulatedMethod = "simulated allocator over the tensor schedule";

/// The tensor schedule of a training run it covers (sched::step_setup): its allocated peak with the
/// phase and the components there, and on CUDA the caching-allocator simulation replaying it.
struct SimulatedStep {
  bool covered = false;
  sched::StepPeak peak;             ///< with the cuBLAS workspaces and 512-byte blocks on CUDA
  u64 reserved = 0, allocated = 0;  ///< CUDA: the simulation's peaks (0, 0 on CPU)
};

SimulatedStep simulated_step_for(const Request& r) {
  if (r.task == Task::Inference) return {};
  std::optional<sched::StepSetup> s = sched::step_setup(r);
  if (!s) return {};
  SimulatedStep out;
  out.covered = true;
  if (r.device == Device::Cuda) {
    s->workspaces = cublas_workspaces(r);
    const alloc::Stats st = sched::simulated_stats(*s, alloc::config_from_alloc_conf(r.runtime.alloc_conf));
    out.reserved = st.peak_reserved;
    out.allocated = st.peak_allocated;
  }
  out.peak = sched::step_peak(*s);
  return out;
}

/// Two models of one step agree when `other` is within 2 % of `engine`.
bool agree(u64 other, u64 engine) {
  const u64 gap = other > engine ? other - engine : engine - other;
  return gap * 50 <= engine;
}

/// Reserved minus allocated. Where the schedule's simulation is trusted (the reported allocated peak
/// is the schedule's and the engine agrees, or, the schedule unused, it agrees with the engine): its
/// simulated reserved (never below the allocated peak). Where the schedule covers the run but the
/// two disagree: the larger of the approximate rule and the simulation's own fragmentation (reserved
/// minus allocated), since neither is known to hold and under-estimating is the dangerous direction.
u64 reserved_overhead(const Moment& peak, u64 allocated, const SimulatedStep& sim, bool trusted) {
  if (trusted) return sim.reserved - std::min(sim.reserved, allocated);
  const u64 rule = allocator_overhead(peak);
  return sim.reserved > 0 ? std::max(rule, sim.reserved - std::min(sim.reserved, sim.allocated)) : rule;
}

/// The allocated peak an estimate reports: the moment (phase and components) and each phase's largest.
struct AllocatedPeak {
  Moment peak;
  std::vector<PhasePeak> phases;
  bool from_schedule = false;
};

/// The engine's: the largest of its moments (the cuBLAS workspaces added on CUDA).
AllocatedPeak engine_peak(const Request& r, const std::vector<Moment>& moments) {
  AllocatedPeak a;
  size_t best = 0;
  for (size_t i = 0; i < moments.size(); ++i) {
    const u64 t = moments[i].total();
    auto it = std::find_if(a.phases.begin(), a.phases.end(), [&](const PhasePeak& p) { return p.phase == moments[i].phase; });
    if (it == a.phases.end()) a.phases.push_back({moments[i].phase, t});
    else it->allocated_bytes = std::max(it->allocated_bytes, t);
    if (t > moments[best].total()) best = i;
  }
  a.peak = moments[best];
  const u64 workspace = r.device == Device::Cuda ? cublas_workspace_for(r) : 0;
  if (workspace) a.peak.parts["cublas_workspace"] = workspace;
  for (PhasePeak& p : a.phases) p.allocated_bytes = add(p.allocated_bytes, workspace);
  return a;
}

/// The schedule's: its peak moment with the live tensors' components, and each phase's largest moment.
AllocatedPeak schedule_peak(const sched::StepPeak& p) {
  AllocatedPeak a;
  a.peak.phase = std::string(sched::phase_name(p.phase));
  for (size_t c = 0; c < sched::kParts; ++c)
    if (p.parts[c] > 0) a.peak.parts[sched::part_name(static_cast<sched::Part>(c))] = p.parts[c];
  for (size_t f = 0; f < sched::kPhases; ++f)
    if (p.phase_peaks[f] > 0) a.phases.push_back({std::string(sched::phase_name(static_cast<sched::Phase>(f))), p.phase_peaks[f]});
  a.from_schedule = true;
  return a;
}

/// Which allocated peak is reported, and in what words (Estimate::allocated_method).
struct AllocatedChoice {
  AllocatedPeak chosen;
  std::string method;
  bool trusted = false;  ///< the schedule's simulated reserved applies as it is
};

/// The schedule where it covers the run and the engine agrees within 2 %; where they disagree,
/// the larger of the two (neither is then known to be right, and under-estimating is the
/// dangerous direction); the engine where the schedule does not cover the run, or when asked.
AllocatedChoice choose_allocated(const Request& r, AllocatedPeak engine, const SimulatedStep& sim, AllocatedFrom from) {
  const u64 e = engine.peak.total();
  if (!sim.covered) {
    const char* why = r.task == Task::Inference ? "engine (inference: the tensor schedule describes training steps)"
                                                : "engine (the tensor schedule does not describe this setup)";
    return {std::move(engine), why, false};
  }
  if (from == AllocatedFrom::Engine) {
    const bool trusted = sim.reserved > 0 && agree(sim.allocated, e);
    return {std::move(engine), "engine", trusted};
  }
  const u64 t = sim.peak.bytes;
  if (agree(t, e)) return {schedule_peak(sim.peak), "tensor schedule", true};
  char text[160];
  const double gap = 100.0 * (static_cast<double>(t) - static_cast<double>(e)) / static_cast<double>(e);
  std::snprintf(text, sizeof text, "tensor schedule and engine disagree by %+.1f %%: the larger (%s)", gap,
                t > e ? "tensor schedule" : "engine");
  if (t > e) return {schedule_peak(sim.peak), text, false};
  return {std::move(engine), text, false};
}

/// The formula text of a component taken from the tensor schedule: the live tensors at its peak
/// (indexed by sched::Part).
constexpr std::string_view kScheduleFormulas[sched::kParts] = {
    "every parameter tensor",
    "the .grad of each trained parameter whose backward has run",
    "AdamW's exp_avg and exp_avg_sq (fused: and its step counters)",
    "tensors saved for backward or handed to the next layer, the token ids",
    "autocast's cached half casts of the trained weights",
    "the logits, their fp32 copy, the labels, the log-probabilities and their gradients",
    "tensors that die within a forward or backward op: intermediates, the gradient chain, weight gradients before they become the .grad, foreach temporaries",
    "cuBLAS/cuBLASLt workspaces",
};

std::string schedule_formula_of(std::string_view name, const std::string& phase) {
  std::string text = "tensor schedule, live at its peak (" + phase + "): ";
  for (size_t c = 0; c < sched::kParts; ++c)
    if (sched::part_name(static_cast<sched::Part>(c)) == name) text += kScheduleFormulas[c];
  return text;
}

/// Fills allocated/reserved/device figures and the breakdown from the largest moment.
Estimate summarise(const Request& r, const std::vector<Moment>& moments, u64 paged, u64 nccl, const SimulatedStep& sim = {},
                   AllocatedFrom from = AllocatedFrom::ScheduleWhereCovered) {
  Estimate e;
  AllocatedChoice choice = choose_allocated(r, engine_peak(r, moments), sim, from);
  // PyTorch counts a block it hands out whole (a cached block whose remainder is too small to split
  // off, CUDACachingAllocator.cpp should_split) at its full size in allocated_bytes: the simulation
  // over the schedule counts that, its 512-byte tensor sizes do not (at most a few tenths of a %)
  const bool whole_blocks = r.device == Device::Cuda && choice.trusted && choice.chosen.from_schedule &&
                            sim.allocated > choice.chosen.peak.total();
  if (whole_blocks) choice.chosen.peak.parts["allocator_whole_blocks"] = sim.allocated - choice.chosen.peak.total();
  const Moment& peak = choice.chosen.peak;
  e.phases = choice.chosen.phases;
  e.peak_phase = peak.phase;
  e.allocated_method = choice.method;
  const bool cuda = r.device == Device::Cuda;
  e.allocated_peak_bytes = peak.total();
  const bool simulated = cuda && choice.trusted;
  const bool disagrees = cuda && sim.reserved > 0 && !simulated;
  const u64 overhead = cuda ? reserved_overhead(peak, e.allocated_peak_bytes, sim, choice.trusted) : 0;
  e.reserved_peak_bytes = add(e.allocated_peak_bytes, overhead);
  e.reserved_method = simulated   ? kSimulatedMethod
                      : disagrees ? "approximate rule or the schedule's simulated fragmentation, the larger (the tensor schedule's allocated peak is over 2 % from the engine's)"
                      : cuda      ? "approximate rule"
                                  : "no caching allocator (CPU): reserved = allocated";
  const u64 context = cuda ? cuda_context_for(r) : 0;
  if (!cuda) nccl = 0;
  e.device_total_bytes = add(add(e.reserved_peak_bytes, context), add(paged, nccl));

  static const char* order[] = {"weights", "master_weights", "gradients", "optimizer_states", "activations",
                                "autocast_weight_copies", "logits_loss", "kv_cache", "temporary_buffers",
                                "communication_buffers", "cublas_workspace", "allocator_whole_blocks"};
  for (const char* k : order) {
    auto it = peak.parts.find(k);
    if (it == peak.parts.end() || it->second == 0) continue;
    const bool scheduled = choice.chosen.from_schedule && std::string_view(k) != "allocator_whole_blocks";
    e.breakdown.push_back({k, it->second, scheduled ? schedule_formula_of(k, peak.phase) : formula_of(k)});
  }
  if (overhead)
    e.breakdown.push_back({"allocator_overhead", overhead, formula_of(simulated   ? "allocator_fragmentation"
                                                                      : disagrees ? "allocator_overhead_unsure"
                                                                                  : "allocator_overhead")});
  if (paged) e.breakdown.push_back({"paged_optimizer_states", paged, formula_of("paged_optimizer_states")});
  if (nccl) e.breakdown.push_back({"nccl_buffers", nccl, formula_of("nccl_buffers")});
  if (context) e.breakdown.push_back({"cuda_context", context, formula_of("cuda_context")});
  e.gpu_memory_bytes = r.gpu.memory_bytes;
  e.fits = e.device_total_bytes <= e.gpu_memory_bytes;
  return e;
}

// ------------------------------------------------------------------------------------------
// Inference: weights + KV cache + the larger of the largest no-grad layer transient at prefill and the logits.

u64 kv_cache_bytes(const ModelSpec& m, const Request& r, u64 batch, u64 ctx, u64 tp) {
  u64 total = 0;
  for (const LayerGroup& g : m.groups) {
    u64 per_token = 0;
    if (m.attention == AttentionKind::MultiLatent && !r.inference.expanded_mla_cache)
      per_token = add(m.kv_lora_rank, m.qk_rope_head_dim);  // latent + shared rope key, replicated under TP
    else  // K and V per KV head; TP splits KV heads (each rank keeps at least one)
      per_token = mul(div_ceil(m.kv_heads, tp), add(m.head_dim, m.v_head_dim));
    const u64 held = g.sliding_window ? std::min(ctx, g.sliding_window) : ctx;
    total = add(total, mul(g.count, bytes_of_bits(mul(batch, held, per_token), r.inference.kv_cache_bits)));
  }
  return total;
}

struct InferenceParts {
  std::vector<Moment> moments;
  u64 nccl = 0;
};

InferenceParts inference_moments(const Request& r, const ModelStates& s, const Layout& l, u64 batch, u64 ctx) {
  const ModelSpec& m = r.model;
  const Dtypes d = dtypes_for(r);
  InferenceParts out;
  // Inference shards by TP (and PP stages); every rank holds its layers' weights.
  const RankRole& role = l.roles.front();
  const RankStates rs = rank_states(s, r, l, role);
  out.nccl = rs.nccl;
  u64 layers_on_rank = 0;
  for (u64 c : role.layers) layers_on_rank = add(layers_on_rank, c);
  const u64 kv = scale(kv_cache_bytes(m, r, batch, ctx, l.tp), layers_on_rank, m.layers);
  u64 transient = 0;
  for (size_t i = 0; i < m.groups.size(); ++i) {
    const TrainableLinears none{std::vector<bool>(m.groups[i].linears.size(), false), 0};
    // the prompt is prefilled in one forward; generated tokens then go one at a time
    const u64 prompt = ctx - std::min(ctx - 1, r.inference.new_tokens);
    transient = std::max(transient, shard_layer(layer_activations(m, m.groups[i], r, none, mul(batch, prompt), prompt), l).inference_transient);
  }
  const u64 prompt_tokens = ctx - std::min(ctx - 1, r.inference.new_tokens);
  const u64 logit_tokens = r.inference.full_prompt_logits ? mul(batch, prompt_tokens) : batch;
  u64 logits = div_ceil(mul(logit_tokens, m.vocab, add(d.compute, 4)), l.tp);  // logits + fp32 copy for sampling
  // Lightning's 4-bit layers (LitGPT generate --quantize bnb.*, frameworks.hpp bnb_quantized_from_fp16 /
  // bnb_quantizes_lm_head): a prefill of more than one token runs MatMul4Bit, which dequantizes the whole
  // weight to fp16 (its quantization source) and casts it to the compute dtype; one-token decode at
  // batch 1 takes gemv_4bit (no dense weight). The head's two dense copies precede its logits.
  const FrameworkTraits& fw = framework_traits(r.runtime.framework, r.runtime.framework_version);
  const bool bnb4 = r.quantization == Quantization::Nf4 || r.quantization == Quantization::Nf4Double ||
                    r.quantization == Quantization::Fp4;
  const u64 dense_bytes = add(d.compute, r.precision != Precision::Fp16 ? 2 : 0);
  if (bnb4 && fw.bnb_quantized_from_fp16 && mul(batch, prompt_tokens) > 1) {
    u64 biggest = 0;
    for (const LayerGroup& g : m.groups)
      for (const Linear& lin : g.linears)
        if (!lin.routed) biggest = std::max(biggest, lin.weight_params());
    transient = add(transient, div_ceil(mul(dense_bytes, biggest), l.tp));
    if (fw.bnb_quantizes_lm_head && !m.tied_embeddings) {
      const u64 head = mul(m.vocab, m.hidden);
      logits = std::max(div_ceil(mul(dense_bytes, head), l.tp), add(div_ceil(mul(d.compute, head), l.tp), logits));
    }
  }
  // The layers' transients are gone when the head makes the logits: the prefill peak is the larger
  // of the two, not their sum (measured, tuning cases llama/h128-L3-V32000/inference/bf16/sdpa/b2c128
  // and mixtral/h128-L2-V16384/inference/fp32/sdpa/b2c64: the peak inside a layer, no logits alive).
  if (transient >= logits)
    out.moments.push_back({"prefill", {{"weights", rs.weights}, {"kv_cache", kv}, {"temporary_buffers", transient}}});
  else
    out.moments.push_back({"prefill", {{"weights", rs.weights}, {"kv_cache", kv}, {"logits_loss", logits}}});
  out.moments.push_back({"decode", {{"weights", rs.weights}, {"kv_cache", kv}, {"logits_loss", div_ceil(mul(batch, m.vocab, add(d.compute, 4)), l.tp)}}});
  return out;
}

/// Largest x in [1, limit] with fits(x) for a monotone predicate; 0 if none.
template <class F>
u64 largest_fitting(u64 limit, F fits) {
  if (!fits(1)) return 0;
  u64 lo = 1;
  while (lo < limit && fits(std::min(limit, lo * 2))) lo = std::min(limit, lo * 2);
  if (lo >= limit) return limit;
  u64 hi = std::min(limit, lo * 2);  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const u64 mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

Estimate estimate(const Request& r) { return estimate_from(r, AllocatedFrom::ScheduleWhereCovered); }

Estimate estimate_from(const Request& r, AllocatedFrom from) {
  if (r.task == Task::Serve) throw Error("task \"serve\" is sized by the serving engine's accounting: call serve() (serving.hpp) or estimate_json");
  const Layout layout = make_layout(r);
  const ModelStates s = model_states(r, layout.mixed);
  const ParamCounts params = count_params(r.model);

  Estimate e;
  bool flat_partitions = false;  // a rank's optimizer figures come from DeepSpeed's flat partitions
  if (r.task == Task::Inference) {
    const u64 b = r.inference.batch_size, ctx = r.inference.context_length;
    const InferenceParts ip = inference_moments(r, s, layout, b, ctx);
    e = summarise(r, ip.moments, 0, ip.nccl);
    e.inference.kv_cache_bytes = kv_cache_bytes(r.model, r, b, ctx, layout.tp);
    e.inference.kv_cache_bytes_per_token = kv_cache_bytes(r.model, r, 1, 1, layout.tp);
    const u64 mem = r.gpu.memory_bytes;
    auto total = [&](u64 batch, u64 context) {
      const InferenceParts p = inference_moments(r, s, layout, batch, context);
      return summarise(r, p.moments, 0, p.nccl).device_total_bytes;
    };
    e.inference.max_batch_at_context = largest_fitting(u64{1} << 20, [&](u64 x) { return total(x, ctx) <= mem; });
    // A context past the model's max_position_embeddings is past what it was trained for and what
    // a serving engine accepts as max_model_len: the search stops there, and a note says so.
    const u64 positions = r.model.max_positions;
    e.inference.max_context_at_batch =
        largest_fitting(positions ? positions : u64{1} << 24, [&](u64 x) { return total(b, x) <= mem; });
    if (positions && e.inference.max_context_at_batch == positions)
      e.notes.push_back("longest context: the model's max_position_embeddings (" + std::to_string(positions) +
                        ") is reached before the memory is used up");
    if (r.model.attention == AttentionKind::MultiLatent)
      e.notes.push_back(r.inference.expanded_mla_cache ? "KV cache as Transformers stores MLA: per-head keys and values"
                                                       : "KV cache as serving engines store MLA: the compressed latent + rope key");
  } else {
    // Evaluate every kind of rank and report the busiest one.
    std::string busiest;
    const SimulatedStep simulated = simulated_step_for(r);
    for (const RankRole& role : layout.roles) {
      const RankStates rs = rank_states(s, r, layout, role);
      flat_partitions = flat_partitions || rs.flat_partition_figures;
      Estimate candidate = summarise(r, training_moments(r, s, layout, role, rs), rs.paged_states, rs.nccl, simulated, from);
      candidate.cpu_ram_bytes = rs.cpu_ram;
      if (busiest.empty() || candidate.device_total_bytes > e.device_total_bytes) {
        e = candidate;
        busiest = role.name;
      }
    }
    if (layout.roles.size() > 1) e.notes.push_back("figures for the busiest rank: the " + busiest);
    e.trainable_params = s.trainable;
    if (r.optimizer == Optimizer::PagedAdamW8bit || r.optimizer == Optimizer::PagedAdamW)
      e.notes.push_back("paged optimizer states live in CUDA unified memory: counted in the device total, not in torch's allocated/reserved");
    if (layout.mixed == MixedMode::Autocast)
      e.notes.push_back("autocast mixed precision: fp32 weights, gradients and optimizer states; Linear layers compute in half precision");
    if (layout.mixed == MixedMode::HalfMaster)
      e.notes.push_back("mixed precision with half-precision weights and an fp32 master copy in the optimizer");
  }
  e.params = params;
  std::vector<std::string> notes = r.model.notes;
  for (const std::string& n : layout.notes) notes.push_back(n);
  for (const std::string& n : r.notes) notes.push_back(n);
  for (const std::string& n : e.notes) notes.push_back(n);
  e.notes = notes;
  e.warnings = warnings_of(r);
  if (flat_partitions)
    e.warnings.push_back(std::string("optimizer \"") + to_string(r.optimizer) +
                         "\" under ZeRO steps DeepSpeed's flat fp32 partitions, not the model's tensors: its states and "
                         "step temporaries are sized over those partitions from DeepSpeed's source, not measured");
  return e;
}

}  // namespace memfit
