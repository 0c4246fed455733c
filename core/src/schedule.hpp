// The schedule pass: turns the tensor lists of layer_ops.hpp into the ordered allocations and
// frees of training steps (weights, forward through every layer, loss, backward with the
// recomputation of checkpointed layers, weight gradients appearing, the optimizer step with
// its foreach temporaries, zero_grad(set_to_none)). The allocated peak is the maximum of the
// live bytes; the same events replayed through alloc::simulate give the reserved peak.
//
// Identical layers make the step periodic. The pass runs each per-layer loop through a Sink:
// the trace sink runs every iteration and records every event; the peak sink runs one and
// extrapolates (n copies of a block with net change d and in-block peak m relative to its start
// peak at start + m + (n - 1) * max(d, 0)), which is exact when the iterations are identical
// (tests/schedule_test.cpp checks it against the trace sink).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "layer_ops.hpp"
#include "memfit/request.hpp"

namespace memfit::sched {

enum class StepOptimizer { AdamWForeach, AdamWFused };

/// Everything the pass needs, resolved from a Request.
struct StepSetup {
  LayerSetup layer;
  Dims dims;
  Dtypes dtypes;
  u64 layers = 0;
  bool checkpointing = false;
  bool tied_embeddings = false;
  bool qkv_bias = false;
  StepOptimizer optimizer = StepOptimizer::AdamWForeach;
  u64 steps = 2;                 ///< the validator measures two steps (optimizer state appears in the first)
  u64 accumulation = 1;          ///< micro-batches per step
  bool round_512 = false;        ///< CUDA: every block is a multiple of 512 B
  /// CUDA: buffers the first matmul allocates through the caching allocator and keeps (the
  /// cuBLAS and cuBLASLt workspaces); step_setup leaves it empty, the estimator fills it.
  std::vector<u64> workspaces;
};

/// The setups the lists describe: llama / mistral / qwen2, fp32 or bf16/fp16 (no autocast),
/// full or LoRA, eager or SDPA, single GPU, AdamW. nullopt for anything else.
[[nodiscard]] std::optional<StepSetup> step_setup(const Request& r);

/// The whole run as the tracker records it: n > 0 allocates n bytes, -k - 1 frees allocation k.
[[nodiscard]] std::vector<std::int64_t> step_trace(const StepSetup& s);

/// A per-layer loop of a trace: `iterations` back-to-back runs of `length` events from event `first`
/// (the trace sink's repeat, where every iteration has as many events).
struct Loop {
  size_t first = 0, length = 0, iterations = 0;
};
struct Trace {
  std::vector<std::int64_t> events;  ///< as step_trace
  std::vector<Loop> loops;           ///< in trace order
};

/// step_trace, with where its per-layer loops are (hints for alloc::simulate_periodic).
[[nodiscard]] Trace step_trace_with_loops(const StepSetup& s);

/// Peak live bytes of the run, by the periodic shortcut.
[[nodiscard]] u64 peak_allocated(const StepSetup& s);

/// Peak live bytes of a trace (the full simulation, for tests).
[[nodiscard]] u64 trace_peak(const std::vector<std::int64_t>& trace, bool round_512);

}  // namespace memfit::sched
