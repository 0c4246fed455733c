// Speed figures for the benchmark script (scripts/bench.sh): one estimate, 10,000 estimates,
// a full plan for 8 GPUs, and one caching-allocator replay of a training step, natively.
// Prints figures; asserts nothing. `memfit_bench N` divides every repetition count by N (a quick
// look on a busy machine; compare figures only between runs with the same N).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include <cstdint>
#include <vector>

#include "memfit/allocator.hpp"
#include "memfit/api.hpp"
#include "memfit/planner.hpp"
#include "reserved.hpp"
#include "schedule.hpp"

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
/// A step-shaped trace: 32 layers of weights, then a forward that keeps 12 tensors per layer
/// and frees 4 temporaries, a backward that frees them in reverse with 3 temporaries each.
std::vector<memfit::alloc::Event> step_trace() {
  std::vector<std::int64_t> t;
  std::int64_t n = 0;
  auto alloc = [&](std::int64_t bytes) { t.push_back(bytes); return n++; };
  auto release = [&](std::int64_t k) { t.push_back(-k - 1); };
  for (int l = 0; l < 32 * 9; ++l) alloc(64 << 20);
  std::vector<std::int64_t> kept;
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 12; ++i) kept.push_back(alloc((i % 3 + 1) * (16 << 20)));
    for (int i = 0; i < 4; ++i) release(alloc(48 << 20));
  }
  for (int l = 31; l >= 0; --l) {
    std::int64_t tmp[3];
    for (std::int64_t& x : tmp) x = alloc(32 << 20);
    for (int i = 11; i >= 0; --i) release(kept[static_cast<size_t>(l * 12 + i)]);
    for (std::int64_t x : tmp) release(x);
  }
  return memfit::alloc::events_from_signed(t);
}

}  // namespace

int main(int argc, char** argv) {
  using clock = std::chrono::steady_clock;
  const int divisor = argc > 1 ? std::max(1, std::atoi(argv[1])) : 1;
  auto runs_of = [&](int n) { return std::max(1, n / divisor); };
  const std::string text = R"({"model": {"id": "meta-llama/Meta-Llama-3-8B"}, "task": "lora", "precision": "bf16",
                               "micro_batch_size": 4, "sequence_length": 4096, "gradient_checkpointing": true})";
  const memfit::Request request = memfit::request_from_json(nlohmann::json::parse(text));

  // JSON in -> JSON out, as the CLI and the page call it (includes parsing the config).
  auto t0 = clock::now();
  const std::string once = memfit::estimate_json(text);
  const double first = seconds_since(t0);
  t0 = clock::now();
  const int json_runs = runs_of(1000);
  for (int i = 0; i < json_runs; ++i) (void)memfit::estimate_json(text);
  const double per_json = seconds_since(t0) / json_runs;

  // The estimator alone over a parsed request, 10,000 times with varying batch sizes.
  t0 = clock::now();
  unsigned long long checksum = 0;
  memfit::Request r = request;
  const int estimate_runs = runs_of(10000);
  for (int i = 0; i < estimate_runs; ++i) {
    r.micro_batch_size = 1 + (i % 16);
    checksum += memfit::estimate(r).allocated_peak_bytes % 1000003;
  }
  const double per_estimate = seconds_since(t0) / estimate_runs;

  // A whole plan for 8 GPUs (every layout x micro-batch search x grid).
  memfit::Request pr = memfit::request_from_json(nlohmann::json::parse(
      R"({"model": {"id": "meta-llama/Llama-3.1-70B"}, "task": "lora", "precision": "bf16", "sequence_length": 4096,
          "gradient_checkpointing": true, "cluster": {"gpu": {"name": "H100-SXM-80GB"}, "num_gpus": 8}})"));
  (void)memfit::plan(pr);  // warm
  t0 = clock::now();
  const int plan_runs = runs_of(20);
  size_t candidates = 0;
  for (int i = 0; i < plan_runs; ++i) candidates = memfit::plan(pr).candidates.size();
  const double per_plan = seconds_since(t0) / plan_runs;

  // A 1-GPU plan of the estimate's request: its single-GPU cells are training steps the tensor
  // schedule covers, so each one replays the caching-allocator simulation for its reserved figure.
  memfit::Request pr1 = request;
  pr1.num_gpus = 1;
  (void)memfit::plan(pr1);
  t0 = clock::now();
  const int plan1_runs = std::max(2, runs_of(20));
  size_t candidates1 = 0;
  for (int i = 0; i < plan1_runs; ++i) candidates1 = memfit::plan(pr1).candidates.size();
  const double per_plan1 = seconds_since(t0) / plan1_runs;

  // The same estimates as a CPU request: no caching allocator, so no simulation.
  memfit::Request rc = request;
  rc.device = memfit::Device::Cpu;
  t0 = clock::now();
  for (int i = 0; i < estimate_runs; ++i) {
    rc.micro_batch_size = 1 + (i % 16);
    checksum += memfit::estimate(rc).allocated_peak_bytes % 1000003;
  }
  const double per_cpu_estimate = seconds_since(t0) / estimate_runs;

  const std::vector<memfit::alloc::Event> trace = step_trace();
  t0 = clock::now();
  const int sim_runs = runs_of(200);
  unsigned long long reserved = 0;
  for (int i = 0; i < sim_runs; ++i) reserved += memfit::alloc::simulate(trace).stats.peak_reserved % 1000003;
  const double per_sim = seconds_since(t0) / sim_runs;

  // The tensor schedule (core/src/schedule.hpp) of the estimate's request: the allocated peak by the
  // periodic shortcut, and the whole trace replayed through the allocator simulation.
  const auto setup = memfit::sched::step_setup(request);
  double per_schedule = 0, per_schedule_sim = 0, per_trace = 0, per_reserved = 0;
  size_t schedule_events = 0;
  if (setup) {
    memfit::sched::StepSetup s = *setup;
    t0 = clock::now();
    const int peak_runs = runs_of(10000);
    for (int i = 0; i < peak_runs; ++i) {
      s.dims.b = 1 + (i % 16);
      checksum += memfit::sched::peak_allocated(s) % 1000003;
    }
    per_schedule = seconds_since(t0) / peak_runs;
    t0 = clock::now();
    const int runs = std::max(5, runs_of(100));
    for (int i = 0; i < runs; ++i) {
      const auto t = memfit::sched::step_trace(*setup);
      schedule_events = t.size();
      reserved += memfit::alloc::simulate(memfit::alloc::events_from_signed(t)).stats.peak_reserved % 1000003;
    }
    per_schedule_sim = seconds_since(t0) / runs;
    t0 = clock::now();
    for (int i = 0; i < runs; ++i) reserved += memfit::sched::step_trace(*setup).size();
    per_trace = seconds_since(t0) / runs;
    // What the estimator calls: sched::simulated_reserved (schedule + allocator, CUDA rounding).
    s = *setup;
    t0 = clock::now();
    for (int i = 0; i < runs; ++i) {
      s.dims.b = 1 + (i % 16);
      reserved += memfit::sched::simulated_reserved(s, {}) % 1000003;
    }
    per_reserved = seconds_since(t0) / runs;
  }

  std::printf("estimate_json, first call:                 %8.3f ms\n", first * 1e3);
  std::printf("estimate_json (parse config + estimate):   %8.3f ms per call\n", per_json * 1e3);
  std::printf("estimate (parsed request), batch 1..16:     %8.2f us each\n", per_estimate * 1e6);
  std::printf("estimate, same request on CPU (no allocator): %6.2f us each\n", per_cpu_estimate * 1e6);
  std::printf("plan, 8 GPUs (%zu layouts, search + grid): %8.3f ms per plan\n", candidates, per_plan * 1e3);
  std::printf("plan, 1 GPU (%zu layouts, simulated reserved): %6.3f ms per plan\n", candidates1, per_plan1 * 1e3);
  std::printf("allocator replay, %zu-event step trace:  %8.3f us per replay\n", trace.size(), per_sim * 1e6);
  std::printf("schedule peak (periodic shortcut):          %8.3f us each\n", per_schedule * 1e6);
  std::printf("schedule trace + allocator replay (%zu ev): %8.3f us each\n", schedule_events, per_schedule_sim * 1e6);
  std::printf("schedule trace alone:                        %8.3f us each\n", per_trace * 1e6);
  std::printf("simulated_reserved (estimator), batch 1..16: %8.3f us each\n", per_reserved * 1e6);
  std::printf("(checksum %llu, output %zu bytes)\n", checksum + reserved, once.size());
  return 0;
}
