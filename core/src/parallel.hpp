// Distributed methods: how a layout of data / tensor / pipeline / context parallelism divides
// model states, activations and buffers over the GPUs, per rank.
#pragma once

#include <string>
#include <vector>

#include "activations.hpp"
#include "memfit/checked.hpp"
#include "memfit/request.hpp"
#include "states.hpp"

namespace memfit::detail {

/// One kind of rank of a layout (pipeline stages differ: the first keeps the embedding and
/// the most micro-batches in flight, the last the head and the logits).
struct RankRole {
  std::string name;                ///< "every rank", "first pipeline stage", "last pipeline stage"
  std::vector<u64> layers;         ///< decoder layers of each LayerGroup held by this rank
  bool embedding = true;
  bool head = true;
  u64 in_flight = 1;               ///< micro-batches whose activations are alive at once
};

struct Layout {
  ParallelMethod method = ParallelMethod::Single;
  u64 world = 1, dp = 1, tp = 1, pp = 1, cp = 1;
  u64 shard = 1;                   ///< degree over which ZeRO/FSDP shard states (dp, or GPUs per node for hybrid)
  bool sequence_parallel = false;
  /// Tensor parallelism splits the embedding, the logits and the loss over the vocabulary
  /// (Megatron-LM's vocab-parallel embedding and cross-entropy: the CUDA default). False on CPU,
  /// where tensor parallelism is torch DTensor (Transformers tp_plan / parallelize_module): only
  /// the projections are split; embeddings and norms stay replicated, lm_head's output is
  /// gathered, so every rank holds the full logits and computes the full loss.
  bool vocab_parallel = true;
  [[nodiscard]] u64 vocab_split() const { return vocab_parallel ? tp : 1; }
  bool offload_optimizer = false;
  bool offload_params = false;
  MixedMode mixed = MixedMode::None;
  std::vector<RankRole> roles;
  std::vector<std::string> notes;
};

/// Whether tensor parallelism of degree tp gives every rank whole query and key/value heads
/// (make_layout refuses the other degrees; MLA's latent K/V has no key/value heads to split).
[[nodiscard]] bool whole_heads(const ModelSpec& m, u64 tp);

/// Validates the degrees against num_gpus and fills the roles. Throws Error with what to fix.
[[nodiscard]] Layout make_layout(const Request& r);

/// Per-GPU model states of one rank, in bytes.
struct RankStates {
  u64 weights = 0;          ///< resident (sharded) weights
  u64 master = 0;           ///< fp32 master copies kept by the optimizer
  u64 grads = 0;            ///< gradients once backward is complete
  u64 grads_per_layer_group_unit = 0;
  u64 states = 0;           ///< optimizer states on the GPU
  u64 paged_states = 0;
  u64 step_temporary = 0;   ///< optimizer-step temporaries on the GPU (incl. fp32 grad partitions)
  u64 gathered = 0;         ///< unsharded parameters live during forward/backward (ZeRO-3/FSDP units)
  u64 gathered_root = 0;    ///< the part of `gathered` that is the root unit (embeddings, head, final norm)
  u64 gather_held = 0;      ///< FSDP2: the last forward all-gather's flat output, held until the next all-gather
  u64 root_params = 0;      ///< FSDP2 (fully_shard of the whole model): the root unit's unsharded weights
  u64 buckets = 0;          ///< gradient buckets / reduce-scatter buffers
  u64 nccl = 0;             ///< NCCL buffers outside the allocator
  u64 cpu_ram = 0;          ///< host memory: offloaded states/params, pinned buffers
  u64 trainable = 0;        ///< trainable parameters this rank updates
  /// The optimizer's states or step temporaries were sized over DeepSpeed's flat partitions, where
  /// they differ from the model's tensors (from DeepSpeed's source: not measured)
  bool flat_partition_figures = false;
};
[[nodiscard]] RankStates rank_states(const ModelStates& s, const Request& r, const Layout& l, const RankRole& role);

/// Per-rank share of one layer's activations (TP splits heads and the MLP width; sequence
/// parallelism also the [tokens, hidden] tensors; context parallelism the sequence).
[[nodiscard]] LayerActivations shard_layer(const LayerActivations& a, const Layout& l);
[[nodiscard]] HeadActivations shard_head(const HeadActivations& a, const Layout& l);

/// x * num / den without overflow for the sizes memfit allows (128-bit intermediate).
[[nodiscard]] u64 scale(u64 x, u64 num, u64 den);

}  // namespace memfit::detail
