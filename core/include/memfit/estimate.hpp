// memfit: the estimate — per-GPU peak memory as a sum of named components, with the phase of
// the training step (or inference) that sets the peak.
#pragma once

#include <string>
#include <vector>

#include "memfit/checked.hpp"
#include "memfit/model.hpp"
#include "memfit/request.hpp"

namespace memfit {

/// One named part of the per-GPU memory. `formula` says how it was computed, in words and
/// symbols, so every number the user sees can be traced to the code.
struct Component {
  std::string name;
  u64 bytes = 0;
  std::string formula;
};

/// Memory live at the peak of one phase (allocator view: what max_memory_allocated sees).
struct PhasePeak {
  std::string phase;  ///< "load", "forward", "loss", "backward", "optimizer_step", "prefill", "decode"
  u64 allocated_bytes = 0;
};

struct InferenceFigures {
  u64 kv_cache_bytes = 0;             ///< at batch_size x context_length
  u64 kv_cache_bytes_per_token = 0;   ///< one token of one sequence, all layers
  u64 max_batch_at_context = 0;       ///< largest batch that fits at context_length (0: none)
  u64 max_context_at_batch = 0;       ///< largest context that fits at batch_size (0: none)
};

struct Estimate {
  ParamCounts params;
  u64 trainable_params = 0;
  u64 allocated_peak_bytes = 0;       ///< torch.cuda.max_memory_allocated
  u64 reserved_peak_bytes = 0;        ///< torch.cuda.max_memory_reserved
  u64 device_total_bytes = 0;         ///< nvidia-smi "used" for this process
  std::vector<Component> breakdown;   ///< at the peak; sums to device_total_bytes
  std::string peak_phase;
  std::vector<PhasePeak> phases;
  u64 gpu_memory_bytes = 0;
  bool fits = false;                  ///< device_total_bytes <= gpu_memory_bytes
  u64 cpu_ram_bytes = 0;              ///< host memory the setup needs (offload, pinned buffers)
  InferenceFigures inference;
  std::vector<std::string> notes;     ///< how the figures were made (layout, precision mode, defaults)
  std::vector<std::string> warnings;  ///< what to weigh before trusting them (ModelSpec and Request warnings)
  /// How reserved_peak_bytes was found: "simulated allocator over the tensor schedule" (the
  /// setups the schedule covers, on CUDA), "approximate rule", or none on CPU.
  std::string reserved_method;
  /// Where allocated_peak_bytes, peak_phase, phases and the breakdown's components come from:
  /// "tensor schedule" (the training setups sched::step_setup covers, where the engine agrees within
  /// 2 %), "tensor schedule and engine disagree by X %: the larger (...)", or "engine (...)" (the
  /// sum-based engine of activations.cpp: every setup the schedule does not describe).
  std::string allocated_method;
};

/// Which model gives the allocated figure: the tensor schedule where it covers the run (the
/// estimate), or the sum-based engine alone (for comparing the two: tests, tables).
enum class AllocatedFrom { ScheduleWhereCovered, Engine };

/// The estimate for one GPU (the busiest rank for distributed setups). Throws Error for
/// requests that cannot be estimated (e.g. a LoRA target the model does not have).
[[nodiscard]] Estimate estimate(const Request& request);
/// The same with the allocated figure from the model named (estimate(r) is
/// estimate_from(r, AllocatedFrom::ScheduleWhereCovered)).
[[nodiscard]] Estimate estimate_from(const Request& request, AllocatedFrom from);

}  // namespace memfit
