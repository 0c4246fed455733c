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

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "layer_ops.hpp"
#include "memfit/request.hpp"

namespace memfit::sched {

enum class StepOptimizer { AdamWForeach, AdamWFused };

/// One parameter tensor (bytes) and whether the optimizer trains it.
struct ParamTensor {
  u64 bytes = 0;
  bool trained = false;
};

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
  const FamilyLists* lists = &kLlamaLists;  ///< the family's lists (step_setup's family table)
  /// Parameter tensors in module order: of one decoder layer (LoRA adapters after the layer's
  /// own), and outside the layers. Empty: the Llama layout computed from the dims.
  std::vector<ParamTensor> layer_weights, outer_weights;
  /// How many of the outer parameter tensors come before the decoder layers in module order (the
  /// embeddings; the final norm and the head come after): the order the model creates its
  /// parameters in and the optimizer walks them.
  size_t leading_outer = 1;
  /// The Linears of one layer as the model file has them (in, out, bias, a LoRA target), from the
  /// ModelSpec; empty: the Llama layout of `dims` (tests).
  struct LayerLinear {
    u64 in = 0, out = 0;
    bool bias = false, adapted = false;
  };
  std::vector<LayerLinear> linears;
  u64 norm_params = 0;           ///< norm weights of one layer (elements), with `linears`
  /// A decoder whose layers differ is a sequence of groups, each `count` identical layers with
  /// their own list choices, sizes and parameters (DeepSeek-V3: the first_k_dense_replace dense
  /// layers, then the MoE layers); the pass runs each group as one periodic loop. Empty: one
  /// group, `layers` copies of `layer` / `dims` / `linears` / `norm_params`.
  struct Group {
    std::string_view name;  ///< the list's name in the tensor tables ("dense_layer", "moe_layer")
    u64 count = 0;
    LayerSetup layer;
    Dims dims;
    std::vector<LayerLinear> linears;
    u64 norm_params = 0;
    /// Groups of one kind have the same list, sizes and parameters (step_setup: the ModelSpec
    /// group; Llama 4's layers repeat a pattern of kinds): the pass builds their list once and the
    /// peak sink extrapolates a repeated pattern. kNoKind: unknown, never the same as another.
    size_t kind = kNoKind;
    static constexpr size_t kNoKind = static_cast<size_t>(-1);
  };
  std::vector<Group> groups;
};

/// The setups the lists describe (the families of schedule.cpp's table: llama / mistral / qwen2,
/// the RMSNorm and MoE families of layer_ops_rms.hpp, the LayerNorm families of
/// layer_ops_layernorm.hpp), fp32 or bf16/fp16 (autocast where the table says so), full or LoRA,
/// eager or SDPA, single GPU, AdamW. nullopt for anything else.
[[nodiscard]] std::optional<StepSetup> step_setup(const Request& r);

/// The lists one step runs through: the embedding (rotary tables, masks, the embedding output),
/// the decoder as runs of identical layers, the head and loss.
struct StepLists {
  /// `count` consecutive decoder layers with one list, sized by the setup of decoder group `group`.
  struct Layers {
    std::string_view name;  ///< "first_layer" (LoRA without checkpointing: layer 0's input needs no
                            ///< gradient), "layer", or the group's name
    OpList list;
    u64 count = 0;
    size_t group = 0;
    /// the group's kind (StepSetup::Group::kind); kNoKind for the first layer of a LoRA run and
    /// for the layers of an ungrouped decoder
    size_t kind = StepSetup::Group::kNoKind;
  };
  OpList embedding, head;
  std::vector<Layers> layers;  ///< in decoder order
};
[[nodiscard]] StepLists step_lists(const StepSetup& s);

/// One entry of a list, resolved for a setup (what `memfit validate --tensors` compares with the
/// tensors PyTorch creates).
struct TensorRow {
  std::string_view name, op;
  u64 elements = 0, element_bytes = 0, bytes = 0;
  bool saved = false;            ///< kept for backward: dies in this list's backward
  std::string_view freed_after;  ///< not saved: the entry after whose creation it dies ("layer_out":
                                 ///< handed to the next list, "decoder_end": when the decoder stack returns)
};
/// One tensor a list's backward creates: "<entry>.grad_input", "<entry>.weight_grad" (first
/// micro-batch) or "<entry>.grad_sum" (a residual's skip gradient summed with the branch's).
struct BackwardRow {
  std::string name;
  u64 bytes = 0;
};
struct ListTable {
  std::string_view list;  ///< "embedding", "first_layer", "layer" (or a group's name), "head"
  std::vector<TensorRow> forward;  ///< entries that allocate, in op order
  std::vector<BackwardRow> backward;  ///< in the order the backward creates them
  u64 first = 0, count = 0;  ///< decoder lists: the layers it describes (first index, how many)
};
/// The step's lists as tables (the input entry, which the previous list created, is left out).
[[nodiscard]] std::vector<ListTable> tensor_tables(const StepSetup& s);

/// The whole run as the tracker records it: n > 0 allocates n bytes, -k - 1 frees allocation k.
/// `names`, if given, receives the name of each allocation (a list entry, "grad_in", "parameter", ...).
[[nodiscard]] std::vector<std::int64_t> step_trace(const StepSetup& s, std::vector<std::string>* names = nullptr);

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

/// The phases of a step (the estimator's PhasePeak names, phase_name): the forward (the weights
/// and the batch before it), the loss (from the logits on), the backward, the optimizer step (and
/// zero_grad).
enum class Phase : std::uint8_t { Forward, Loss, Backward, OptimizerStep };
inline constexpr size_t kPhases = 4;
/// "forward", "loss", "backward", "optimizer_step".
[[nodiscard]] std::string_view phase_name(Phase p);

/// The run's allocated peak with what is live there: the phase of its first moment, the bytes of
/// each component (kParts, indexed by Part; they sum to `bytes`), and the largest live bytes
/// within each phase (indexed by Phase; 0: the phase allocates nothing).
struct StepPeak {
  u64 bytes = 0;
  Phase phase = Phase::Forward;
  std::array<u64, kParts> parts{};
  std::array<u64, kPhases> phase_peaks{};
};

/// The peak with its phase and components, by the periodic shortcut (each per-layer loop run once:
/// n identical iterations with net change d and, per component, d_c: the peak of the last one,
/// if d > 0, has the first one's components plus (n - 1) d_c).
[[nodiscard]] StepPeak step_peak(const StepSetup& s);
/// The same from the full trace (every iteration run; for tests).
[[nodiscard]] StepPeak trace_step_peak(const StepSetup& s);

/// Peak live bytes of the run, by the periodic shortcut.
[[nodiscard]] u64 peak_allocated(const StepSetup& s);

/// Peak live bytes of a trace (the full simulation, for tests).
[[nodiscard]] u64 trace_peak(const std::vector<std::int64_t>& trace, bool round_512);

}  // namespace memfit::sched
