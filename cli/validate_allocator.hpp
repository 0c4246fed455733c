// `memfit validate`: the allocation traces the workload recorded (measure.trace, --trace),
// replayed through the core's simulation of PyTorch's CUDA caching allocator
// (memfit/allocator.hpp). A CPU trace gives, without a GPU, the reserved peak CUDA would reach
// for that sequence of allocations; the estimate's reserved figure is compared with it. A CUDA
// trace (torch.cuda.memory._record_memory_history) is compared with max_memory_reserved, which
// checks the simulation itself.
#pragma once

#include <string>
#include <vector>

#include "validate_common.hpp"

namespace memfit::cli::validate {

struct TraceReplay {
  const Case* c = nullptr;
  std::string source;              ///< "cpu tracker" or "cuda history"
  size_t events = 0;
  double live_peak = 0;            ///< the trace's own peak of live bytes (no rounding)
  double replay_allocated = 0;     ///< simulated max_memory_allocated (512 B rounding, unsplit tails)
  double replay_reserved = 0;      ///< simulated max_memory_reserved
  double fragmentation = 0;        ///< reserved - allocated when the reserved peak was reached
  double estimate_reserved = 0;    ///< the estimate's reserved figure for this trace (see .cpp)
  double measured_reserved = -1;   ///< CUDA history only: max_memory_reserved of the run
  double error_pct = 0;            ///< estimate (or, for CUDA, the replay) vs the reference
};

/// One row per case that carries a trace (none when no result has one).
std::vector<TraceReplay> replay_traces(const std::vector<Case>& cases);
/// The table (text or Markdown, after the main report); returns how many rows exceed `tolerance`.
size_t print_trace_replays(const std::vector<TraceReplay>& rows, bool markdown, double tolerance);

}  // namespace memfit::cli::validate
