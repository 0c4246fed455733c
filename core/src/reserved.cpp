// The reserved peak of training steps (reserved.hpp).
//
// The schedule's trace is replayed through alloc::simulate_periodic, given the trace's per-layer
// loops: where the allocator's state at a layer's start repeats the previous layer's start (and the
// layers' events repeat), the remaining layers are copied, not simulated; the result is the full
// simulation's, bit for bit (the argument is in allocator.cpp, the check over 320 configurations in
// tests/reserved_test.cpp). In most steps the state does not repeat from one layer to the next and
// the layers are simulated one by one: in the forward, kept tensors are carved out of larger cached
// blocks (Llama-3-8B LoRA, micro-batch 4 x 4096: three 128 MiB layer inputs from each 448 MiB
// block, leaving a 64 MiB block behind every three layers), and the backward frees each layer's
// saved tensors at a different address.
#include "reserved.hpp"

#include "memfit/error.hpp"

namespace memfit::sched {

namespace {

std::vector<alloc::Period> periods_of(const Trace& t) {
  std::vector<alloc::Period> periods;
  periods.reserve(t.loops.size());
  for (const Loop& l : t.loops) periods.push_back({l.first, l.length, l.iterations});
  return periods;
}

}  // namespace

alloc::Result simulated_step(const StepSetup& s, const alloc::Config& c) {
  const Trace t = step_trace_with_loops(s);
  return alloc::simulate_periodic(t.events, periods_of(t), c);
}

u64 simulated_reserved(const StepSetup& s, const alloc::Config& c) {
  if (c.device_limit != alloc::kNoLimit) throw Error("simulated_reserved: the peak is simulated without a device limit");
  const Trace t = step_trace_with_loops(s);
  return alloc::periodic_stats(t.events, periods_of(t), c).peak_reserved;
}

}  // namespace memfit::sched
