// The reserved peak of training steps: the schedule's allocations (schedule.hpp) replayed through
// the caching-allocator simulation (allocator.hpp), what torch.cuda.max_memory_reserved reports.
#pragma once

#include "memfit/allocator.hpp"
#include "schedule.hpp"

namespace memfit::sched {

/// Peak reserved bytes of the run. `c.device_limit` must be unset: the estimate asks for the
/// unconstrained peak and compares it with the GPU afterwards (with no limit the allocator never
/// releases a segment, so the peak is what it holds at the end).
[[nodiscard]] u64 simulated_reserved(const StepSetup& s, const alloc::Config& c);

/// The statistics of the run's allocator simulation (peak reserved and allocated, ...), as
/// simulated_reserved computes them. `c.device_limit` must be unset.
[[nodiscard]] alloc::Stats simulated_stats(const StepSetup& s, const alloc::Config& c);

/// The run's allocator simulation (alloc::simulate_periodic over the per-layer loops of the trace):
/// the same Result as alloc::simulate of step_trace(s).
[[nodiscard]] alloc::Result simulated_step(const StepSetup& s, const alloc::Config& c);

}  // namespace memfit::sched
