// Model states (weights, gradients, optimizer states) of the whole model, split the way the
// distributed methods divide them: per layer group, the part tensor parallelism splits
// (Column/Row Linears) and the part it replicates (norms, routers).
#pragma once

#include <vector>

#include "activations.hpp"
#include "memfit/checked.hpp"
#include "memfit/request.hpp"

namespace memfit::detail {

/// How mixed precision is realised, which decides the bytes per parameter.
enum class MixedMode {
  None,         ///< fp32, or pure bf16/fp16: one dtype everywhere
  Autocast,     ///< torch.autocast: fp32 weights/grads/states, half casts of Linear weights
  HalfMaster,   ///< DeepSpeed ZeRO / Megatron: half weights and grads, fp32 master + states in the optimizer
  ShardedFp32,  ///< FSDP mixed precision: sharded fp32 params (the master), gathered half for compute
};

struct GroupStates {
  u64 w_split = 0, w_repl = 0;  ///< weight bytes of one layer: TP-split part, replicated part
  u64 t_split = 0, t_repl = 0;  ///< trainable params of one layer, same split
  u64 casts = 0;                ///< autocast half copies of this layer's Linear weights
};

struct ModelStates {
  MixedMode mixed = MixedMode::None;
  std::vector<GroupStates> groups;
  std::vector<TrainableLinears> linears;
  u64 emb_w = 0, emb_t = 0;               ///< token (+ position) embeddings
  u64 head_w_split = 0, head_t_split = 0; ///< untied lm_head (vocab-parallel)
  u64 head_w_repl = 0, head_t_repl = 0;   ///< final norm, poolers, projections, head bias
  u64 head_casts = 0;                     ///< autocast copy of the lm_head weight
  u64 trainable = 0;                      ///< trainable parameters, whole model
  u64 weight_bytes_per_trainable = 4;     ///< bytes of a trainable parameter as the model holds it
  u64 grad_bytes = 4;                     ///< bytes per gradient element as produced by backward
  u64 master_bytes = 0;                   ///< fp32 master copy per trainable parameter (0: none)
  u64 state_bytes = 0;                    ///< optimizer states, whole model
  u64 paged_state_bytes = 0;              ///< bitsandbytes paged states (unified memory)
  u64 step_temporary = 0;                 ///< optimizer step temporaries, whole model (foreach)
  bool step_temporary_per_tensor = false; ///< temporaries of one tensor at a time (loop optimizers)
  u64 largest_trainable_tensor = 0;
  /// Over trained weights next to each other in parameter order (previous, current): the largest
  /// `n x current + previous` for n = 2 and n = 4 (a loop optimizer that keeps the previous tensor's
  /// result while it computes n temporaries of the current one: Adafactor)
  u64 step_pair_x2 = 0, step_pair_x4 = 0;
  /// The same two figures when the optimizer steps one flat 1-D tensor per parameter group
  /// (DeepSpeed ZeRO's fp32 partitions): the states of the whole model, and the temporaries per
  /// element of the tensor being stepped (0: the optimizer has none that scale with one tensor).
  /// They differ from state_bytes / step_temporary only where the optimizer reads a tensor's
  /// shape (Adafactor factors matrices only).
  u64 flat_state_bytes = 0;
  u64 flat_step_bytes_per_element = 0;
  bool tied_embeddings = false;
};

[[nodiscard]] ModelStates model_states(const Request& r, MixedMode mixed);
/// Whether the request's LoRA targets name a Linear (PEFT: "all-linear", or a target equal to the
/// module name or one of its dotted suffixes).
[[nodiscard]] bool lora_targets(const Request& r, const std::string& name);


}  // namespace memfit::detail
