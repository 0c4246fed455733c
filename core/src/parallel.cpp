// Distributed methods: per-rank share of model states, activations and buffers.
//
// Sources for what each engine keeps per GPU:
//  - DDP: torch/nn/parallel/distributed.py + reducer.cpp: gradient buckets (bucket_cap_mb=25)
//    are flat tensors holding a second copy of all gradients unless gradient_as_bucket_view.
//  - ZeRO-1/2/3 (Rajbhandari et al., SC'20, sec. 5; DeepSpeed stage_1_and_2.py, stage3.py):
//    stage 1 partitions optimizer states (with the fp32 master), stage 2 also gradients,
//    stage 3 also parameters, gathering each submodule's parameters before use (prefetch).
//    Buckets: reduce_bucket_size / allgather_bucket_size, with the Transformers "auto" values
//    (hidden_size^2 elements) that HF DeepSpeed configs use.
//  - FSDP / FSDP2 (torch.distributed.fsdp): FULL_SHARD reshards each unit after forward and
//    after backward; SHARD_GRAD_OP keeps units unsharded from forward to the end of backward;
//    HYBRID_SHARD shards inside a node and replicates across nodes. One unit is computed while
//    the next is prefetched; the root unit (embeddings, head) stays unsharded until backward ends.
//  - Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; Korthikanti et al. 2022 sec. 4.2):
//    Column/Row-split Linears and vocab-parallel embedding/logits divide by tp; LayerNorm,
//    dropout and residual tensors [s, b, h] stay replicated unless sequence parallelism.
//    On device "cpu" tensor parallelism can only be torch DTensor (Megatron needs CUDA):
//    Transformers' tp_plan (and torch parallelize_module of the projections) splits q/k/v/gate/up
//    column-wise and o/down row-wise, keeps embeddings and norms replicated and gathers lm_head's
//    output, so the logits and the loss are whole on every rank. torch's parallelize_module of
//    the projections (what the validate/ harness does on gloo) leaves the untied lm_head a plain
//    replicated Linear: whole weight, gradient and optimizer state per rank (HF's tp_plan would
//    split it "colwise_gather_output"; we follow the measured torch plan on device "cpu").
//  - Pipeline parallelism (Narayanan et al., SC'21, sec. 2.2): with 1F1B the first stage holds
//    the activations of up to pp micro-batches; the last stage holds the head and the logits.
//  - Context parallelism: each rank keeps its share of the sequence; ring attention passes
//    K/V chunks between neighbours (two chunks in flight).
#include "parallel.hpp"

#include <algorithm>
#include <functional>
#include <numeric>

#include "memfit/error.hpp"

namespace memfit::detail {

namespace {
constexpr u64 MiB = u64{1} << 20;

bool is_zero(ParallelMethod m) {
  return m == ParallelMethod::Zero1 || m == ParallelMethod::Zero2 || m == ParallelMethod::Zero3;
}
bool is_fsdp(ParallelMethod m) {
  return m == ParallelMethod::FsdpFullShard || m == ParallelMethod::FsdpShardGradOp || m == ParallelMethod::FsdpHybrid;
}
bool shards_params(ParallelMethod m) {
  return m == ParallelMethod::Zero3 || m == ParallelMethod::FsdpFullShard || m == ParallelMethod::FsdpHybrid ||
         m == ParallelMethod::FsdpShardGradOp;
}
bool shards_grads(ParallelMethod m) { return m == ParallelMethod::Zero2 || shards_params(m); }
bool shards_states(ParallelMethod m) { return is_zero(m) || is_fsdp(m); }
}  // namespace

u64 scale(u64 x, u64 num, u64 den) {
  if (den == 0) return 0;
  const unsigned __int128 v = static_cast<unsigned __int128>(x) * num / den;
  if (v > static_cast<unsigned __int128>(~u64{0})) throw_overflow("a scaled size");
  return static_cast<u64>(v);
}

/// "tp" with no explicit degree: the largest TP that divides the attention heads, the key/value
/// heads and the GPUs (3 GPUs, 32 heads: TP 1; 64 GPUs: TP 32; 8 key/value heads: TP 8 at most),
/// the rest as data-parallel replicas, said in a note.
static u64 tp_for_gpus(const ModelSpec& m, u64 gpus, std::vector<std::string>& notes) {
  u64 tp = gpus;
  while (tp > 1 && (!whole_heads(m, tp) || gpus % tp != 0)) --tp;
  if (tp != gpus)
    notes.push_back("tensor parallelism needs num_attention_heads (" + std::to_string(m.heads) + ")" +
                    (m.kv_heads != m.heads ? " and num_key_value_heads (" + std::to_string(m.kv_heads) + ")" : std::string()) +
                    " divisible by tp: " + std::to_string(gpus) + " GPUs run as tp " + std::to_string(tp) + " x " +
                    std::to_string(gpus / tp) + " data-parallel replicas");
  return std::max<u64>(tp, 1);
}

bool whole_heads(const ModelSpec& m, u64 tp) {
  if (tp <= 1) return true;
  const bool kv_whole = m.attention == AttentionKind::MultiLatent || m.kv_heads == 0 || m.kv_heads % tp == 0;
  return m.heads % tp == 0 && kv_whole;
}

Layout make_layout(const Request& r) {
  Layout l;
  const Parallelism& p = r.parallelism;
  l.method = p.method;
  l.world = r.num_gpus;
  l.tp = p.tp;
  l.pp = p.pp;
  l.cp = p.cp;
  if (l.method == ParallelMethod::Tp && l.tp == 1) l.tp = tp_for_gpus(r.model, l.world / std::max<u64>(1, l.pp * l.cp), l.notes);
  if (l.method == ParallelMethod::Pp && l.pp == 1) l.pp = l.world / (l.tp * l.cp);
  const u64 model_parallel = mul(l.tp, l.pp, l.cp);
  if (model_parallel == 0 || l.world % model_parallel != 0)
    throw Error("num_gpus (" + std::to_string(l.world) + ") must be a multiple of tp x pp x cp (" +
                std::to_string(model_parallel) + ")");
  l.dp = p.dp > 1 ? p.dp : l.world / model_parallel;
  if (mul(l.dp, model_parallel) != l.world)
    throw Error("dp x tp x pp x cp = " + std::to_string(mul(l.dp, model_parallel)) + " but num_gpus is " +
                std::to_string(l.world) + ": make them equal");
  if (l.method == ParallelMethod::Single && l.world > 1)
    throw Error("parallelism.method \"single\" uses one GPU but num_gpus is " + std::to_string(l.world) +
                ": pick a method (\"ddp\", \"zero3\", \"fsdp_full_shard\", \"tp\", ...)");
  const ModelSpec& m = r.model;
  if (l.tp > 1 && m.heads % l.tp != 0)
    throw Error("tensor parallelism needs num_attention_heads (" + std::to_string(m.heads) + ") divisible by tp (" +
                std::to_string(l.tp) + ")");
  // Each rank holds whole key/value heads: Megatron-LM divides the query groups by tp
  // (attention.py: num_query_groups_per_partition = divide(num_query_groups, world_size), which
  // asserts); Transformers' tp_plan shards k_proj / v_proj column-wise and has no key/value head
  // replication, so a rank with part of a head fails at the first forward's view (transformers
  // issue #48307, Qwen3-VL-30B-A3B: 4 key/value heads at tp_size 8; torchtitan #2577 refuses it).
  if (!whole_heads(m, l.tp))  // the query heads divide (above): the key/value heads do not
    throw Rejected("tensor parallelism needs num_key_value_heads (" + std::to_string(m.kv_heads) + ") divisible by tp (" +
                   std::to_string(l.tp) + "): each GPU must hold whole key/value heads (Megatron-LM asserts it); use tp " +
                   std::to_string(std::gcd(m.kv_heads, l.tp)) + " or fewer, or FSDP / ZeRO for the rest of the GPUs");
  if (l.pp > m.layers)
    throw Error("pp (" + std::to_string(l.pp) + ") exceeds the number of layers (" + std::to_string(m.layers) + ")");
  if (l.cp > 1 && r.sequence_length % l.cp != 0)
    throw Error("context parallelism needs sequence_length divisible by cp (" + std::to_string(l.cp) + ")");
  l.sequence_parallel = p.sequence_parallel && l.tp > 1;
  l.vocab_parallel = r.device != Device::Cpu;
  l.offload_optimizer = p.offload_optimizer;
  l.offload_params = p.offload_params;
  if ((l.offload_optimizer || l.offload_params) && !is_zero(l.method) && !is_fsdp(l.method))
    throw Error("CPU offload needs a ZeRO or FSDP method (zero1/zero2/zero3/fsdp_*)");
  if (l.offload_params && !shards_params(l.method))
    throw Error("parameter offload needs ZeRO-3 or FSDP (\"zero3\", \"fsdp_full_shard\")");
  // transformers' Adafactor builds its factored row / column states as plain tensors and adds
  // DTensor means into them (optimization.py Adafactor.step: exp_avg_sq_row.add_(update.mean(-1))),
  // which FSDP2's DTensor parameters refuse at the first step (measured: holdout 11's
  // qwen3/.../adafactor/fsdp_shard_grad_opx2, "aten.add_.Tensor got mixed torch.Tensor and DTensor").
  if (r.optimizer == Optimizer::Adafactor && is_fsdp(l.method) && r.task != Task::Inference)
    throw Rejected("transformers' Adafactor fails at the first step under FSDP2 (fully_shard, what memfit's fsdp_* "
                   "layouts describe): it keeps plain-tensor states next to DTensor parameters (\"got mixed "
                   "torch.Tensor and DTensor\"). Use DeepSpeed ZeRO (\"zero2\", \"zero3\"), where it steps flat "
                   "partitions, or optimizer \"adamw\". (FSDP1 runs it on flat 1-D shards, unfactored: not modelled)");
  l.shard = l.dp;
  if (l.method == ParallelMethod::FsdpHybrid) l.shard = std::min(l.dp, r.parallelism.gpus_per_node);

  const bool amp = r.precision == Precision::AmpBf16 || r.precision == Precision::AmpFp16;
  if (amp) {
    if (is_zero(l.method) || l.method == ParallelMethod::Tp || l.method == ParallelMethod::Pp) l.mixed = MixedMode::HalfMaster;
    else if (is_fsdp(l.method)) l.mixed = MixedMode::ShardedFp32;
    else l.mixed = MixedMode::Autocast;
  }
  if (r.task == Task::Inference) l.mixed = MixedMode::None;

  // Roles: pipeline stages differ; otherwise every rank holds the same.
  std::vector<u64> all;
  for (const LayerGroup& g : m.groups) all.push_back(g.count);
  if (l.pp == 1) {
    l.roles.push_back({"every rank", all, true, true, 1});
  } else {
    const u64 per_stage = div_ceil(m.layers, l.pp);
    std::vector<u64> stage;
    for (const LayerGroup& g : m.groups) stage.push_back(std::min(g.count, div_ceil(mul(g.count, per_stage), m.layers)));
    const u64 micro = std::max<u64>(1, r.gradient_accumulation_steps);
    // 1F1B: the first stage holds up to pp micro-batches; GPipe: all of them
    l.roles.push_back({"first pipeline stage", stage, true, false, r.parallelism.gpipe ? micro : std::min(l.pp, micro)});
    l.roles.push_back({"last pipeline stage", stage, false, true, 1});
    if (micro < l.pp)
      l.notes.push_back("pipeline with " + std::to_string(micro) + " micro-batch(es) per step and " + std::to_string(l.pp) +
                        " stages: most of the step is bubble; raise gradient_accumulation_steps");
  }
  if (l.world > 1) {
    std::string desc = std::string(to_string(l.method)) + ": dp " + std::to_string(l.dp) + " x tp " + std::to_string(l.tp) +
                       " x pp " + std::to_string(l.pp) + (l.cp > 1 ? " x cp " + std::to_string(l.cp) : "");
    l.notes.push_back(desc + "; figures are per GPU for the busiest rank");
  }
  if (is_fsdp(l.method) && r.task == Task::Lora && r.parallelism.frozen_in_trained_units)
    l.notes.push_back("FSDP units hold frozen weights and adapters in one flat parameter (use_orig_params=True): every "
                      "unit with an adapter gets a gradient for all its weights; wrap the adapters in units of their own "
                      "to avoid it (parallelism.frozen_in_trained_units)");
  if (is_fsdp(l.method) && r.parallelism.unsharded_grad_accumulation && r.gradient_accumulation_steps > 1)
    l.notes.push_back("gradient accumulation under no_sync(): each GPU keeps the unsharded gradients between "
                      "synchronising micro-batches (parallelism.unsharded_grad_accumulation)");
  return l;
}

namespace {

/// FSDP1 units whose flat parameter holds frozen base weights next to adapters
/// (parallelism.frozen_in_trained_units): the flat parameter requires grad, so backward makes a
/// gradient for every weight of the unit in the unsharded parameter's dtype (torch
/// fsdp/_wrap_utils.py _validate_frozen_params warns of exactly this: "total numel instead of
/// nonfrozen numel before sharding via reduce-scatter"). Returns those gradients' bytes beyond
/// the adapters' own, for the decoder layers this rank holds (one unit per layer: LitGPT's
/// auto_wrap_policy={Block}).
u64 frozen_unit_grads(const ModelStates& s, const Request& r, const Layout& l, const RankRole& role,
                      const std::function<u64(u64)>& compute_bytes) {
  if (!is_fsdp(l.method) || r.task != Task::Lora || !r.parallelism.frozen_in_trained_units) return 0;
  u64 out = 0;
  for (size_t i = 0; i < s.groups.size(); ++i) {
    const GroupStates& g = s.groups[i];
    const u64 layer_t = add(div_ceil(g.t_split, l.tp), g.t_repl);
    if (layer_t == 0 || role.layers[i] == 0) continue;
    const u64 layer_w = add(div_ceil(g.w_split, l.tp), g.w_repl);
    out = add(out, mul(role.layers[i], sub_floor(compute_bytes(layer_w), mul(s.grad_bytes, layer_t))));
  }
  return out;
}

/// What one rank holds of the model before ZeRO / FSDP sharding (tensor parallelism already
/// divided): the totals that the weights, gradients and optimizer states below are shares of.
struct HeldParams {
  u64 weights = 0;       ///< stored bytes of the rank's decoder layers and root modules
  u64 trainable = 0;     ///< trainable parameters among them
  u64 unit_weights = 0;  ///< the largest decoder layer held: one FSDP unit / ZeRO-3 submodule
  u64 root_weights = 0, root_largest = 0;  // all root modules; the largest one alone
};

HeldParams held_params(const ModelStates& s, const Layout& l, const RankRole& role) {
  HeldParams h;
  for (size_t i = 0; i < s.groups.size(); ++i) {
    const GroupStates& g = s.groups[i];
    const u64 layer_w = add(div_ceil(g.w_split, l.tp), g.w_repl);
    h.weights = add(h.weights, mul(role.layers[i], layer_w));
    h.trainable = add(h.trainable, mul(role.layers[i], add(div_ceil(g.t_split, l.tp), g.t_repl)));
    if (role.layers[i] > 0) h.unit_weights = std::max(h.unit_weights, layer_w);
  }
  const bool holds_embedding = role.embedding || (role.head && s.tied_embeddings);
  if (holds_embedding) {
    h.root_weights = add(h.root_weights, div_ceil(s.emb_w, l.vocab_split()));
    h.root_largest = h.root_weights;
    h.trainable = add(h.trainable, div_ceil(s.emb_t, l.vocab_split()));
  }
  if (role.head) {
    // CPU (DTensor, parallelize_module of the projections only): lm_head is a plain replicated
    // nn.Linear, so its weight, gradient and optimizer state are whole on every rank.
    const u64 head_w = add(div_ceil(s.head_w_split, l.vocab_split()), s.head_w_repl);
    h.root_weights = add(h.root_weights, head_w);
    h.root_largest = std::max(h.root_largest, head_w);
    h.trainable = add(h.trainable, add(div_ceil(s.head_t_split, l.vocab_split()), s.head_t_repl));
  }
  h.weights = add(h.weights, h.root_weights);
  return h;
}

/// Stored bytes -> bytes once gathered for compute (see rank_states).
using ComputeBytes = std::function<u64(u64)>;

/// ZeRO-3 / FSDP: the parameters gathered unsharded while a unit computes (out.gathered, and
/// out.gathered_root for the root unit FSDP holds).
void gathered_params(const HeldParams& h, const Request& r, const Layout& l, const ComputeBytes& compute_bytes,
                     RankStates& out) {
  const bool full = r.task == Task::Full;
  // FSDP2's root unit (fully_shard of the whole model after its layers): embeddings, head, final
  // norm. torchtune shards the root in its own way (below).
  if (is_fsdp(l.method) && r.runtime.framework != Framework::Torchtune) out.root_params = compute_bytes(h.root_weights);
  if (l.method == ParallelMethod::FsdpShardGradOp) {
    out.gathered = compute_bytes(h.weights);  // every unit stays unsharded from its forward to the end of backward
  } else if (l.method == ParallelMethod::Zero3) {
    // DeepSpeed keeps gathered parameters alive while their reuse distance is under
    // stage3_max_reuse_distance, up to stage3_max_live_parameters (both 1e9 elements by
    // default): the layers around the forward/backward turn stay gathered. On top: the
    // submodule being computed (the embedding / tied head is the largest) and the prefetch
    // bucket (0.9 x hidden^2 elements, Transformers' "auto" value).
    const u64 elem = (l.mixed == MixedMode::ShardedFp32 && full) || r.precision != Precision::Fp32 ? 2 : 4;
    const u64 live = std::min(compute_bytes(h.weights), mul(u64{1'000'000'000}, elem));
    const u64 prefetch = mul(elem, mul(r.model.hidden, r.model.hidden) / 10 * 9);
    out.gathered = add(add(live, std::max(compute_bytes(h.unit_weights), compute_bytes(h.root_weights))), prefetch);
  } else {
    // FSDP: current + prefetched unit, and the root unit (embeddings, head) held unsharded.
    // torchtune's recipes shard each decoder layer, then the root (training/_distributed.py
    // shard_model, get_shard_conditions); the root is gathered only while it computes. With
    // custom_sharded_layers ['tok_embeddings', 'output'] (its llama3_1/70B_full.yaml, for
    // instance) the two are units of their own, gathered one at a time.
    if (r.runtime.framework == Framework::Torchtune) {
      const u64 root = r.parallelism.separate_embedding_units ? h.root_largest : h.root_weights;
      out.gathered = add(compute_bytes(h.unit_weights), std::max(compute_bytes(h.unit_weights), compute_bytes(root)));
    } else {
      out.gathered = add(mul(2, compute_bytes(h.unit_weights)), compute_bytes(h.root_weights));
      out.gathered_root = compute_bytes(h.root_weights);
    }
  }
}

/// Weights: the resident share (plus the registered buffers), what is gathered while computing,
/// and the host copy when parameters are offloaded.
void place_weights(const HeldParams& h, const Request& r, const Layout& l, const ComputeBytes& compute_bytes,
                   u64 buffers, RankStates& out) {
  if (shards_params(l.method)) {
    out.weights = l.offload_params ? 0 : div_ceil(h.weights, l.shard);
    gathered_params(h, r, l, compute_bytes, out);
    if (is_fsdp(l.method)) {
      // FSDP2 (fully_shard) keeps the flat all-gather output of the last unit gathered in forward:
      // FSDPParamGroup.wait_for_unshard stores it in comm_ctx.all_gather_state (so the copy-out
      // stream's reads finish before the memory is reused) and only the next unshard's all-gather
      // drops it. The last decoder layer's buffer (its unsharded bytes in the param dtype) is thus
      // alive through the loss, next to the copied-out parameters (measured, FSDP2 on gloo,
      // llama-tiny fp32 fsdp_shard_grad_op rank 0 at nll_loss_forward: a 951,296 B
      // empty.memory_format [237824] fp32 = layers.1's parameters, besides the unsharded params).
      out.gather_held = compute_bytes(h.unit_weights);
    }
    if (l.offload_params) out.cpu_ram = add(out.cpu_ram, h.weights);
  } else {
    out.weights = h.weights;
  }
  if (l.mixed == MixedMode::ShardedFp32 && !shards_params(l.method)) out.weights = h.weights;
  out.weights = add(out.weights, buffers);
}

/// Gradients once backward is complete (out.grads). Returns the rank's unsharded gradient bytes,
/// which the DDP / ZeRO buckets are sized on.
u64 place_grads(const ModelStates& s, const Request& r, const Layout& l, const RankRole& role, u64 trainable,
                const ComputeBytes& compute_bytes, RankStates& out) {
  const bool full = r.task == Task::Full;
  u64 grad_bytes = s.grad_bytes;
  if (l.mixed == MixedMode::HalfMaster && (l.method == ParallelMethod::Tp || l.method == ParallelMethod::Pp) && full)
    grad_bytes = 4;  // Megatron accumulates into fp32 main_grad buffers
  const u64 grads = add(mul(grad_bytes, trainable), frozen_unit_grads(s, r, l, role, compute_bytes));
  // FSDP no_sync() over accumulation micro-batches: the gradients stay unsharded on every rank
  const bool unsharded = r.parallelism.unsharded_grad_accumulation && r.gradient_accumulation_steps > 1;
  out.grads = shards_grads(l.method) && !unsharded ? div_ceil(grads, l.shard) : grads;
  return grads;
}

/// Elements of the largest flat tensor DeepSpeed ZeRO's optimizer steps on a rank that updates
/// `trainable` parameters: the rank's partition of the decay group (Transformers' two parameter
/// groups, with and without weight decay, hold all but norms and biases in the first); ZeRO-3
/// steps sub-groups of at most sub_group_size elements (DeepSpeed's default 1e9, which the
/// Transformers configs keep).
u64 largest_flat_partition(const Layout& l, u64 trainable) {
  constexpr u64 kZero3SubGroupSize = 1'000'000'000;
  const u64 partition = div_ceil(trainable, l.shard);
  return l.method == ParallelMethod::Zero3 ? std::min(partition, kZero3SubGroupSize) : partition;
}

/// Optimizer states and step temporaries (the rank's trainable share of them, sharded over
/// `shard`), or their host copies when the optimizer is offloaded.
void place_optimizer_states(const ModelStates& s, const Request& r, const Layout& l, u64 trainable, u64 shard,
                            RankStates& out) {
  const bool full = r.task == Task::Full;
  const u64 total_t = std::max<u64>(1, s.trainable);
  // DeepSpeed ZeRO hands the optimizer one flat fp32 partition per parameter group, not the
  // model's tensors (stage_1_and_2.py: param_group['params'] = [single_partition_of_fp32_groups[i]];
  // stage3.py _optimizer_step: [fp32_partitioned_groups_flat[sub_group_id]], sub-groups of at most
  // sub_group_size elements), and Transformers lets any optimizer through
  // (integrations/deepspeed.py: zero_allow_untested_optimizer = True when the Trainer made it).
  // So an optimizer that reads shapes sees vectors (Adafactor keeps a full second moment), and a
  // per-tensor step's temporaries are the size of the rank's whole partition of the group.
  const bool flat = is_zero(l.method);
  out.states = div_ceil(scale(flat ? s.flat_state_bytes : s.state_bytes, trainable, total_t), shard);
  out.paged_states = div_ceil(scale(s.paged_state_bytes, trainable, total_t), shard);
  out.step_temporary =
      s.step_temporary_per_tensor ? s.step_temporary : div_ceil(scale(s.step_temporary, trainable, total_t), shard);
  if (flat && s.flat_step_bytes_per_element > 0)
    out.step_temporary = mul(s.flat_step_bytes_per_element, largest_flat_partition(l, trainable));
  out.flat_partition_figures = flat && (s.flat_state_bytes != s.state_bytes || s.flat_step_bytes_per_element > 0);
  if (l.mixed == MixedMode::HalfMaster && is_zero(l.method) && full)
    out.step_temporary = add(out.step_temporary, div_ceil(mul(4, trainable), shard));  // fp32 gradient partition
  if (l.offload_optimizer) {
    out.cpu_ram = add(out.cpu_ram, add(add(out.states, out.master), div_ceil(mul(4, trainable), shard)));
    out.states = 0;
    out.master = 0;
    out.step_temporary = 0;
    if (is_fsdp(l.method)) {
      // FSDP CPU offload moves parameters, gradients and optimizer together.
      out.cpu_ram = add(out.cpu_ram, out.grads);
      out.grads = 0;
    }
  }
}

/// Gradient buckets and collective buffers inside the allocator: DDP's bucket copy, ZeRO's
/// reduce / all-gather buckets, FSDP's reduce-scatter input, and the TP / PP activation buffers.
u64 bucket_bytes(const HeldParams& h, const Request& r, const Layout& l, u64 grads) {
  const bool full = r.task == Task::Full;
  u64 buckets = 0;
  const u64 hh = mul(r.model.hidden, r.model.hidden);
  if (l.world > 1 && l.dp > 1) {
    if (l.method == ParallelMethod::Ddp || l.method == ParallelMethod::Single) {
      // bucket storage: a second copy of every gradient, unless the gradients are views into
      // the buckets (gradient_as_bucket_view=True)
      buckets = r.parallelism.gradient_as_bucket_view ? 0 : grads;
    } else if (l.method == ParallelMethod::Zero1 || l.method == ParallelMethod::Zero2) {
      buckets = std::min(grads, mul(3, hh, 2));  // two reduce buckets (overlap_comm) + one all-gather bucket
    } else if (l.method == ParallelMethod::Zero3) {
      buckets = std::min(grads, mul(2, hh, 2));  // reduce buckets
    } else if (is_fsdp(l.method)) {
      // the flattened unsharded gradient of one unit, the reduce-scatter input: its weights' bytes
      // (fp32 params reduced in fp32, half params in half; FSDP mixed precision stores fp32
      // params and reduces in fp32)
      buckets = full || r.parallelism.frozen_in_trained_units ? h.unit_weights : 0;
    }
  }
  if (l.tp > 1 || l.pp > 1)
    buckets = add(buckets, mul(2, r.micro_batch_size, r.sequence_length, r.model.hidden, 2) / std::max<u64>(1, l.cp));
  return buckets;
}

/// NCCL's channel buffers, one set per communicator of the layout (0 on CPU or one GPU).
u64 nccl_bytes(const Request& r, const Layout& l) {
  if (!(r.device == Device::Cuda && l.world > 1)) return 0;
  // NCCL allocates its channel buffers with cudaMalloc, outside PyTorch's allocator:
  // NCCL_BUFFSIZE (4 MiB by default, NCCL's environment-variable docs) per channel and
  // protocol for each peer of each communicator. The 256 MiB per communicator is an
  // assumption, not a measurement: no record of data/calibration isolates NCCL's share.
  u64 comms = 0;
  for (u64 degree : {l.dp, l.tp, l.pp, l.cp})
    if (degree > 1) ++comms;
  return mul(comms, 256 * MiB);
}

}  // namespace

RankStates rank_states(const ModelStates& s, const Request& r, const Layout& l, const RankRole& role) {
  RankStates out;
  const HeldParams held = held_params(s, l, role);
  out.trainable = held.trainable;
  // registered buffers (causal-mask / sin-cos tables), replicated on every rank, never sharded
  const u64 buffers = scale(r.model.buffer_bytes, [&] {
    u64 n = 0;
    for (u64 c : role.layers) n = add(n, c);
    return n;
  }(), std::max<u64>(1, r.model.layers));
  const u64 shard = shards_states(l.method) ? l.shard : 1;

  // Weights: resident share, and what is gathered unsharded while computing.
  // Gathered units are in the compute dtype: half of the stored fp32 under FSDP mixed precision.
  const bool full = r.task == Task::Full;
  auto compute_bytes = [&](u64 stored) { return (l.mixed == MixedMode::ShardedFp32 && full) ? stored / 2 : stored; };
  place_weights(held, r, l, compute_bytes, buffers, out);

  // Gradients (complete, after backward) and master weights.
  const u64 grads = place_grads(s, r, l, role, held.trainable, compute_bytes, out);
  out.master = div_ceil(mul(s.master_bytes, held.trainable), shard);

  // Optimizer states and step temporaries: proportional to the trainable share.
  place_optimizer_states(s, r, l, held.trainable, shard, out);

  // Buckets and collective buffers inside the allocator.
  out.buckets = bucket_bytes(held, r, l, grads);
  out.nccl = nccl_bytes(r, l);
  return out;
}

LayerActivations shard_layer(const LayerActivations& a, const Layout& l) {
  LayerActivations out = a;
  if (l.tp > 1) {
    const u64 inner = sub_floor(a.saved, a.saved_hidden);
    const u64 hidden = l.sequence_parallel ? div_ceil(a.saved_hidden, l.tp) : a.saved_hidden;
    out.saved = add(div_ceil(inner, l.tp), hidden);
    out.saved_hidden = hidden;
    out.recomputed = sub_floor(out.saved, sub_floor(a.saved, a.recomputed));
    out.forward_transient = div_ceil(a.forward_transient, l.tp);
    out.recompute_transient = div_ceil(a.recompute_transient, l.tp);
    out.backward_transient = div_ceil(a.backward_transient, l.tp);
    out.inference_transient = div_ceil(a.inference_transient, l.tp);
    out.transient_inputs = div_ceil(a.transient_inputs, l.tp);
    out.returned_probs = div_ceil(a.returned_probs, l.tp);
    out.mlp_saved = div_ceil(a.mlp_saved, l.tp);
    out.attn_saved = div_ceil(a.attn_saved, l.tp);
    out.mlp_norm = div_ceil(a.mlp_norm, l.tp);
    out.first_norm_slot = div_ceil(a.first_norm_slot, l.tp);
    if (l.sequence_parallel) out.checkpoint_saved = div_ceil(a.checkpoint_saved, l.tp);
  }
  return out;
}

HeadActivations shard_head(const HeadActivations& a, const Layout& l) {
  HeadActivations out = a;
  if (l.tp > 1 && l.vocab_parallel) {
    // vocab-parallel cross-entropy: each rank keeps [tokens, vocab / tp] logits
    out.held_logits = div_ceil(a.held_logits, l.tp);
    out.held_until_next_forward = div_ceil(a.held_until_next_forward, l.tp);
    out.loss_forward_peak = div_ceil(a.loss_forward_peak, l.tp);
    out.loss_backward_peak = div_ceil(a.loss_backward_peak, l.tp);
    out.saved = div_ceil(a.saved, l.tp);
  }
  return out;
}

}  // namespace memfit::detail
