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
// Why a longer period would not help either (measured on Llama-3-8B LoRA 4 x 4096 and Llama-2-7B
// full / LoRA, with and without checkpointing, 12 loops of 32 layers each): the cached free blocks
// of neither pool repeat between any two layer starts of a loop up to 16 layers apart. Each layer
// keeps tensors carved from the next of the older cached blocks (the forward walks through the
// cache the weights and the previous phase left), and the small pool's current 2 MiB segment has
// another tail at every layer start (the adapters' gradients and states are kept). The state
// drifts until the old cache is used up; a shortcut would have to predict that walk, not copy a
// layer. So the estimate's cost is the replay's (~300 instructions an event, spread over the
// free-list search, splits, merges and counters) plus the trace's.
// What a longer shortcut would need (measured on the same Llama-3-8B LoRA forward, layers 10-31):
// the large pool's cached blocks repeat every 3 layers up to two things, the blocks of the newest
// segments moved up by the 3 layers' new segment bytes (460 MiB), and one more 64 MiB remainder per
// 3 layers (beside kept layer inputs). The remainders are all there again at every layer start:
// the loop's requests of 2 to 64 MiB take the lowest-addressed of them first (best fit, then
// address) and give it back. An exact shortcut would compare states up to that translation (the
// small pool's moving tail too), prove such blocks unread, and materialise the skipped layers'
// segments; not done.
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

alloc::Stats simulated_stats(const StepSetup& s, const alloc::Config& c) {
  if (c.device_limit != alloc::kNoLimit) throw Error("simulated_reserved: the peak is simulated without a device limit");
  const Trace t = step_trace_with_loops(s);
  return alloc::periodic_stats(t.events, periods_of(t), c);
}

u64 simulated_reserved(const StepSetup& s, const alloc::Config& c) { return simulated_stats(s, c).peak_reserved; }

}  // namespace memfit::sched
