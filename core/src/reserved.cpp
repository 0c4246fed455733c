// The reserved peak of training steps (reserved.hpp).
//
// Every event of the schedule is replayed (about 550 per decoder layer for two steps: 1-4 ms for
// a 32-layer model). A periodic shortcut (simulate a few layer counts, extrapolate when the
// segments added per layer repeat) was tried and dropped: the large pool settles (Llama-3-8B
// LoRA: the same segments every 3 layers) but the small pool, where LoRA adapters, norm weights
// and their gradients and optimizer states are packed into 2 MiB segments, does not settle within
// a few layers, and pools cannot be replayed apart without generating every event anyway.
#include "reserved.hpp"

#include "memfit/error.hpp"

namespace memfit::sched {

u64 simulated_reserved(const StepSetup& s, const alloc::Config& c) {
  if (c.device_limit != alloc::kNoLimit) throw Error("simulated_reserved: the peak is simulated without a device limit");
  return alloc::simulate(alloc::events_from_signed(step_trace(s)), c).stats.peak_reserved;
}

}  // namespace memfit::sched
