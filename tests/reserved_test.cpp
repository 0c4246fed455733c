// Reserved memory in the estimate: the tensor schedule replayed through the caching-allocator
// simulation where sched::step_setup covers the request (reserved.hpp), the old rule elsewhere,
// and the simulation against the reserved of the real CPU allocation traces
// (data/measurements/cpu-traces.jsonl replayed through the same simulation).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "memfit/allocator.hpp"
#include "memfit/api.hpp"
#include "memfit/error.hpp"
#include "memfit/estimate.hpp"
#include "memfit/library.hpp"
#include "memfit/request.hpp"
#include "records.hpp"
#include "reserved.hpp"
#include "schedule.hpp"

using nlohmann::json;
using namespace memfit;

namespace {

constexpr u64 MiB = u64{1} << 20;
constexpr const char* kSimulated = "simulated allocator over the tensor schedule";

json llama_lora() {
  return {{"model", {{"id", "meta-llama/Llama-2-7b-hf"}}}, {"task", "lora"}, {"precision", "bf16"},
          {"micro_batch_size", 2}, {"sequence_length", 1024}, {"gradient_checkpointing", true}};
}

u64 part(const Estimate& e, const std::string& name) {
  for (const Component& c : e.breakdown)
    if (c.name == name) return c.bytes;
  return 0;
}

bool lookup(const std::string& id, json& c) { return bundled_config(id, c); }

/// The request of a measured case, as the estimator reads it.
Request request_of(const json& req) { return testing::estimator_request(req); }

/// The case lines that carry a CPU allocation trace: cpu-traces.jsonl (every family's full
/// fp32 / bf16 cases and llama's variants) and cpu-traces-schedule.jsonl (every other one-shape
/// suite case the schedule covers).
std::map<std::string, std::pair<json, std::vector<std::int64_t>>> traced_cases() {
  std::map<std::string, std::pair<json, std::vector<std::int64_t>>> out;
  for (const char* file : {"cpu-traces.jsonl", "cpu-traces-schedule.jsonl"})
    for (const testing::RecordLine& l : testing::record_lines(file))
      if (!l.measured.is_null() && l.measured.contains("allocation_trace"))
        out[l.name] = {l.request, l.measured["allocation_trace"].get<std::vector<std::int64_t>>()};
  return out;
}

/// The traced cases step_setup covers, each with its real trace and the schedule's trace (and the
/// names of its allocations), whose name contains `pick` (all when null): what the diagnostics read.
struct CoveredTrace {
  std::string name;
  const std::vector<std::int64_t>& real;
  std::vector<std::int64_t> schedule;
  std::vector<std::string> names;
};
template <class Visit> void for_each_covered_trace(const char* pick, Visit&& visit) {
  for (const auto& [name, c] : traced_cases()) {
    if (pick && name.find(pick) == std::string::npos) continue;
    const auto s = sched::step_setup(request_of(c.first));
    if (!s) continue;
    CoveredTrace t{name, c.second, {}, {}};
    t.schedule = sched::step_trace(*s, &t.names);
    visit(t);
  }
}

/// The trace without its allocations of at most `bytes` (and their frees): the scalars (losses,
/// AdamW step counters, flags), for the allocator's sensitivity to tensors of a single block.
std::vector<std::int64_t> without_small(const std::vector<std::int64_t>& trace, std::int64_t bytes) {
  std::vector<std::int64_t> out, id;  // id: new number of each allocation, -1 if dropped
  std::int64_t next = 0;
  for (std::int64_t e : trace) {
    if (e > 0) {
      id.push_back(e > bytes ? next++ : -1);
      if (e > bytes) out.push_back(e);
    } else if (e < 0 && id.at(static_cast<size_t>(-e - 1)) >= 0) {
      out.push_back(-id[static_cast<size_t>(-e - 1)] - 1);
    }
  }
  return out;
}

/// The allocations of one pool (small: <= 1 MiB) and their frees. Without a device limit no segment
/// is released, so a trace's peak reserved is the sum of its two pools' (they share nothing).
std::vector<std::int64_t> pool_only(const std::vector<std::int64_t>& trace, bool small) {
  std::vector<std::int64_t> out, id;
  std::int64_t next = 0;
  for (std::int64_t e : trace) {
    if (e > 0) {
      const bool keep = (static_cast<u64>(e) <= alloc::kSmallSize) == small;
      id.push_back(keep ? next++ : -1);
      if (keep) out.push_back(e);
    } else if (e < 0 && id.at(static_cast<size_t>(-e - 1)) >= 0) {
      out.push_back(-id[static_cast<size_t>(-e - 1)] - 1);
    }
  }
  return out;
}

/// One trace's small pool, for the diagnosis: its allocations (sizes, names), the peak of live
/// blocks and which are live then, and at which allocation each segment appears.
struct SmallPool {
  std::vector<std::int64_t> sizes;
  std::vector<std::string> names;
  u64 peak_live = 0, segments = 0;
  size_t peak_at = 0;
  std::vector<size_t> live_at_peak, segment_at;
};

/// `where`: also find the allocation each segment appears at (a few simulations per segment).
SmallPool small_pool(const std::vector<std::int64_t>& trace, const std::vector<std::string>& names, bool where = true) {
  SmallPool p;
  const std::vector<std::int64_t> small = pool_only(trace, true);
  size_t n = 0;
  for (std::int64_t e : trace)
    if (e > 0 && static_cast<u64>(e) <= alloc::kSmallSize) {
      p.sizes.push_back(e);
      if (!names.empty()) p.names.push_back(names.at(n));
      ++n;
    } else if (e > 0) {
      ++n;
    }
  u64 bytes = 0;
  std::vector<bool> alive(p.sizes.size(), false);
  size_t allocs = 0;
  for (std::int64_t e : small) {
    const size_t a = e > 0 ? allocs++ : static_cast<size_t>(-e - 1);
    const u64 b = alloc::rounded_size(static_cast<u64>(p.sizes[a]), alloc::Config{});
    alive[a] = e > 0;
    bytes = e > 0 ? bytes + b : bytes - b;
    if (e > 0 && bytes > p.peak_live) {
      p.peak_live = bytes;
      p.peak_at = a;
      p.live_at_peak.clear();
      for (size_t k = 0; where && k <= a; ++k)
        if (alive[k]) p.live_at_peak.push_back(k);
    }
  }
  // segment k appears at the first allocation whose prefix of the trace needs k segments
  // (the peak count of a prefix grows with its length: a binary search per segment)
  auto segments_of = [&](size_t events) {
    return alloc::simulate(alloc::events_from_signed({small.begin(), small.begin() + static_cast<std::ptrdiff_t>(events)}))
        .stats.peak_segments;
  };
  p.segments = segments_of(small.size());
  for (u64 k = 1; where && k <= p.segments; ++k) {
    size_t lo = 1, hi = small.size();
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (segments_of(mid) >= k) hi = mid;
      else lo = mid + 1;
    }
    size_t a = 0;  // the allocation number of event lo - 1
    for (size_t i = 0; i + 1 < lo; ++i) a += small[i] > 0;
    p.segment_at.push_back(a);
  }
  return p;
}

/// Why a case's reserved figures differ, from the two small pools (the large pools agree on every
/// case): the live peaks need different numbers of 2 MiB segments, or one trace's history leaves
/// its live peak in one segment more than it needs (fragmentation by the order and lifetimes of
/// the small tensors) while the other's fits in the fewest.
std::string miss_kind(const std::vector<std::int64_t>& real_trace, const std::vector<std::int64_t>& schedule_trace) {
  const SmallPool real = small_pool(real_trace, {}, false), mine = small_pool(schedule_trace, {}, false);
  auto fewest = [](const SmallPool& p) { return (p.peak_live + alloc::kSmallBuffer - 1) / alloc::kSmallBuffer; };
  if (fewest(real) != fewest(mine)) return "where the small pools' live peaks need different segment counts";
  if (real.segments == mine.segments) return "with equal small pools (the large pool differs)";
  return real.segments > mine.segments
             ? "where the real trace's small pool needs one segment more than its live peak (fragmentation), the schedule's none"
             : "where the schedule's small pool needs one segment more than its live peak (fragmentation), the real trace's none";
}

u64 replayed_reserved(const std::vector<std::int64_t>& trace) {
  return alloc::simulate(alloc::events_from_signed(trace)).stats.peak_reserved;
}

}  // namespace

TEST_CASE("a covered CUDA training request takes its reserved from the allocator simulation", "[reserved]") {
  const Request r = request_from_json(llama_lora());
  REQUIRE(sched::step_setup(r));
  const Estimate e = estimate(r);
  CHECK(e.reserved_method == kSimulated);
  // Reserved counts whole segments: at least the allocated peak, and the component in between
  // is the fragmentation the simulation found.
  CHECK(e.reserved_peak_bytes >= e.allocated_peak_bytes);
  CHECK(part(e, "allocator_overhead") == e.reserved_peak_bytes - e.allocated_peak_bytes);
  u64 sum = 0;
  for (const Component& c : e.breakdown) sum += c.bytes;
  CHECK(sum == e.device_total_bytes);
  CHECK(e.fits == (e.device_total_bytes <= e.gpu_memory_bytes));
  // The segments of a real model: whole 2 MiB multiples, far below the old rule's 20 MiB floor
  // plus a quarter of the activations for this request.
  CHECK(e.reserved_peak_bytes % (2 * MiB) == 0);
}

TEST_CASE("requests the schedule does not cover keep the approximate rule; CPU has no caching allocator", "[reserved]") {
  json qlora = llama_lora();
  qlora["task"] = "qlora";
  REQUIRE_FALSE(sched::step_setup(request_from_json(qlora)));
  CHECK(estimate(request_from_json(qlora)).reserved_method == "approximate rule");
  json cpu = llama_lora();
  cpu["device"] = "cpu";
  const Estimate e = estimate(request_from_json(cpu));
  CHECK(e.reserved_method == "no caching allocator (CPU): reserved = allocated");
  CHECK(e.reserved_peak_bytes == e.allocated_peak_bytes);
}

TEST_CASE("runtime.alloc_conf drives the simulation; a bad option is an error that names it", "[reserved]") {
  const Estimate plain = estimate(request_from_json(llama_lora()));
  json j = llama_lora();
  j["runtime"] = {{"alloc_conf", "expandable_segments:True"}};
  const Estimate expandable = estimate(request_from_json(j));
  CHECK(expandable.reserved_method == kSimulated);
  // One growing segment per pool mapped in 20 MiB pages: no holes left between segments.
  CHECK(expandable.reserved_peak_bytes < plain.reserved_peak_bytes);
  CHECK(expandable.reserved_peak_bytes >= expandable.allocated_peak_bytes);
  j["runtime"] = {{"alloc_conf", "backend:cudaMallocAsync"}};
  CHECK_THROWS_AS(request_from_json(j), Error);
  j["runtime"] = {{"alloc_conf", 3}};
  CHECK_THROWS_AS(request_from_json(j), Error);
}

// The schedule and the engine are two models of one step. Where the schedule covers a request and
// the engine agrees within 2 %, the allocated peak, its phase and components are the schedule's and
// its simulated reserved applies; where they disagree, the larger allocated peak is reported and its
// segments are not trusted: the overhead is the larger of the rule and the simulated fragmentation.
// Over every CPU check case run as a CUDA request (the check set has shapes where the two differ).
TEST_CASE("the schedule sets allocated and reserved where the engine agrees, the larger of the two where not", "[reserved]") {
  int agree = 0, disagree = 0;
  for (const testing::RecordLine& l : testing::record_lines("cpu-check.jsonl")) {
    json req = l.request;
    req["device"] = "cuda";
    req["gpu"] = {{"name", "H100-SXM-80GB"}};
    const Request r = request_of(req);
    auto s = sched::step_setup(r);
    if (!s) continue;
    const Estimate e = estimate(r);
    const u64 engine = estimate_from(r, AllocatedFrom::Engine).allocated_peak_bytes;
    s->workspaces = {32 * MiB, MiB};  // H100: cuBLAS's sm90 workspace + cuBLASLt's
    const alloc::Stats sim = sched::simulated_stats(*s, alloc::Config{});
    const u64 a = e.allocated_peak_bytes;
    // the schedule's peak counts each tensor in 512-byte blocks; the simulation's allocated peak also
    // counts the tail of a cached block handed out whole (too small a remainder to split)
    const u64 sched_peak = sched::step_peak(*s).bytes;
    CHECK(sched_peak <= sim.peak_allocated);
    const u64 gap = std::max(sched_peak, engine) - std::min(sched_peak, engine);
    INFO(l.name << ": schedule " << sched_peak << ", engine " << engine);
    CHECK(e.reserved_peak_bytes >= a);
    if (gap * 50 <= engine) {
      ++agree;
      CHECK(e.allocated_method == "tensor schedule");
      // allocated as PyTorch counts it (allocated_bytes: a block handed out whole at its full size),
      // the tail beyond the tensors' 512-byte sizes a component of its own
      CHECK(a == sim.peak_allocated);
      CHECK(part(e, "allocator_whole_blocks") == sim.peak_allocated - sched_peak);
      CHECK(e.reserved_method == kSimulated);
      CHECK(e.reserved_peak_bytes == std::max(sim.peak_reserved, a));
    } else {
      ++disagree;
      std::printf("  schedule over 2 %% from the engine: %s (%+.2f %%)\n", l.name.c_str(),
                  100.0 * (double(sched_peak) - double(engine)) / double(engine));
      CHECK(a == std::max(sched_peak, engine));
      CHECK(e.allocated_method.starts_with("tensor schedule and engine disagree by "));
      CHECK(e.reserved_method != kSimulated);
      CHECK(part(e, "allocator_overhead") >= sim.peak_reserved - std::min(sim.peak_reserved, sim.peak_allocated));
      CHECK(part(e, "allocator_overhead") >= 20 * MiB);  // the rule's floor
    }
  }
  std::printf("cpu-check as CUDA requests: the schedule agrees with the engine on %d, is over 2 %% off on %d\n", agree,
              disagree);
  CHECK(agree >= 40);
}

// Issue 9's comparison as a gate: over every covered case of the traced records, the large pools
// (blocks > 1 MiB) of the real trace and the schedule reserve the same, and the estimator's
// simulated reserved is within 3 % of the replayed real trace or one 2 MiB small-pool segment from
// it. At these toy sizes (4-60 MiB reserved) one small-pool segment is 3-50 %, and where it differs
// the two small pools' live peaks agree and one history fragments one segment more ([.alloc9] and
// [.alloc9-diag] print the cases and why); the count within 3 % is printed, not asserted.
TEST_CASE("simulated reserved matches the replayed real traces up to one small-pool segment", "[reserved]") {
  int covered = 0, within = 0;
  for (const auto& [name, c] : traced_cases()) {
    const auto s = sched::step_setup(request_of(c.first));
    if (!s) continue;
    ++covered;
    const std::vector<std::int64_t> st = sched::step_trace(*s);
    const u64 real = replayed_reserved(c.second), sim = sched::simulated_reserved(*s, alloc::Config{});
    INFO(name << ": replayed " << real << " B, simulated " << sim << " B");
    CHECK(replayed_reserved(pool_only(c.second, false)) == replayed_reserved(pool_only(st, false)));
    CHECK(std::max(sim, real) - std::min(sim, real) <= alloc::kSmallBuffer);
    within += std::max(sim, real) - std::min(sim, real) <= real * 3 / 100;
  }
  std::printf("traced cases covered by the schedule: %d; simulated reserved within 3 %% of the replayed real trace: %d, "
              "the others one 2 MiB small-pool segment off\n", covered, within);
  CHECK(covered > 0);
}

// The evidence table of issue 9 (the estimator's simulated reserved vs the reserved replayed
// from the real traces), printed by: build/native/tests/memfit_tests "[.alloc9]"
TEST_CASE("[.alloc9] simulated reserved vs replayed real traces", "[.alloc9]") {
  // last column: the real trace replayed without its allocations of <= 8 B (the scalars: losses,
  // AdamW's step counters, flags; one 512 B block each): how much the segment count of these small
  // runs depends on single blocks
  // small / large pool: each trace's reserved split by pool (trace / schedule)
  std::printf("| case | events (trace) | events (schedule) | replayed trace reserved MiB | estimator simulated reserved MiB | error %% | trace without scalars MiB | small pool MiB | large pool MiB |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  int covered = 0, within = 0, one_segment = 0, sensitive = 0, large_equal = 0;
  std::map<std::string, std::vector<std::string>> misses;  // kind -> cases
  double fewest_more = 1e9, most_more = 0, sum_more = 0;  // small allocations: real / schedule
  int live_off = 0;  // cases whose small-pool live peaks differ by over 1 %
  for (const auto& [name, c] : traced_cases()) {
    const auto s = sched::step_setup(request_of(c.first));
    if (!s) continue;
    ++covered;
    const u64 real = replayed_reserved(c.second);
    const u64 bare = replayed_reserved(without_small(c.second, 8));
    const u64 sim = sched::simulated_reserved(*s, alloc::Config{});
    const double err = 100.0 * (double(sim) - double(real)) / double(real);
    within += std::abs(err) <= 3.0;
    one_segment += std::max(sim, real) - std::min(sim, real) <= alloc::kSmallBuffer;
    sensitive += bare != real;
    const std::vector<std::int64_t> st = sched::step_trace(*s);
    const u64 large_real = replayed_reserved(pool_only(c.second, false)), large_sim = replayed_reserved(pool_only(st, false));
    large_equal += large_real == large_sim;
    if (std::abs(err) > 3.0) misses[miss_kind(c.second, st)].push_back(name);
    const SmallPool small_real = small_pool(c.second, {}, false), small_sim = small_pool(st, {}, false);
    const double more = double(small_real.sizes.size()) / double(small_sim.sizes.size());
    live_off += std::max(small_real.peak_live, small_sim.peak_live) - std::min(small_real.peak_live, small_sim.peak_live) >
                small_real.peak_live / 100;
    fewest_more = std::min(fewest_more, more), most_more = std::max(most_more, more), sum_more += more;
    std::printf("| %s | %zu | %zu | %.3f | %.3f | %+.2f%s | %.3f | %.0f / %.0f | %.0f / %.0f |\n", name.c_str(),
                c.second.size(), st.size(), double(real) / MiB, double(sim) / MiB, err, std::abs(err) > 3.0 ? " **!**" : "",
                double(bare) / MiB, double(replayed_reserved(pool_only(c.second, true))) / MiB,
                double(replayed_reserved(pool_only(st, true))) / MiB, double(large_real) / MiB, double(large_sim) / MiB);
  }
  std::printf("\n%d traced cases covered by step_setup, %d within 3 %%, %d within one 2 MiB segment, %d with the large "
              "pool's reserved equal; %d of the real traces change their reserved when their scalars are dropped\n",
              covered, within, one_segment, large_equal, sensitive);
  std::printf("\nThe cases over 3 %%, by what their small pools show ([.alloc9-diag] prints the details):\n");
  for (const auto& [kind, names] : misses) {
    std::printf("- %zu %s:", names.size(), kind.c_str());
    for (const std::string& n : names) std::printf(" %s;", n.c_str());
    std::printf("\n");
  }
  std::printf("Not a cause: the real traces' AdamW step counters (4 B each, one per parameter, in the first\n"
              "optimizer step) and the 4 B `torch.tensor(1.0)` of each step are CPU-only here: foreach AdamW\n"
              "keeps them on the host under CUDA (torch/optim/adam.py _init_group, _multi_tensor_adam);\n"
              "dropping every never-freed allocation of <= 8 B from the real traces changes no case's segments.\n"
              "Found with [.alloc9-diag] and now in the lists: ForCausalLMLoss's padded labels, nll_loss's\n"
              "loss and total_weight and loss.backward()'s seed (push_loss; the head's tensors then match the\n"
              "recorded ones), and RMSNorm's backward through the variance (mul -> rsqrt -> mean -> pow, its\n"
              "gradients of x summed; the small pools' live peaks of the RMSNorm families now agree within 1 %%).\n"
              "Found with [.alloc9-missing] and now in the lists: the model's set-up after the embedding\n"
              "(position ids, create_causal_mask's packed-sequence check and eager mask, the rotary tables'\n"
              "intermediates: Llama-like, GPT-NeoX / StableLM / Phi, GPT-2 / BigCode, OPT), RMSNorm's\n"
              "variance + eps, rotate_half's -x2, CPU SDPA math's causal mask (the forwards of\n"
              "llama, gpt2 and gpt_neox full/fp32/nogc/sdpa match their traces allocation for allocation).\n"
              "The small pools' live peaks differ by over 1 %% on %d cases (LayerNorm families, eager b4s512).\n"
              "The other misses are the order of the small allocations: the real traces hold %.0f-%.0f %% more\n"
              "of them than the lists (%.0f %% on average: the backward's temporaries (rotate_half's slice\n"
              "and neg gradients, the gradient sums), the eager mask's set-up, the AdamW step counters),\n"
              "and at 2-20 small segments one\n"
              "block placed elsewhere moves a case by a segment either way.\n",
              live_off, 100 * (fewest_more - 1), 100 * (most_more - 1), 100 * (sum_more / std::max(covered, 1) - 1));
}

namespace {

bool same_stats(const alloc::Stats& a, const alloc::Stats& b) {
  return a.allocated == b.allocated && a.peak_allocated == b.peak_allocated && a.requested == b.requested &&
         a.peak_requested == b.peak_requested && a.reserved == b.reserved && a.peak_reserved == b.peak_reserved &&
         a.allocated_at_peak_reserved == b.allocated_at_peak_reserved && a.segments == b.segments &&
         a.peak_segments == b.peak_segments && a.device_allocs == b.device_allocs && a.device_frees == b.device_frees &&
         a.retries == b.retries && a.oom == b.oom && a.oom_event == b.oom_event && a.oom_bytes == b.oom_bytes;
}

bool same_segments(const std::vector<alloc::SegmentView>& a, const std::vector<alloc::SegmentView>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const alloc::SegmentView& x, const alloc::SegmentView& y) {
    return x.small_pool == y.small_pool &&
           std::equal(x.blocks.begin(), x.blocks.end(), y.blocks.begin(), y.blocks.end(), [](const auto& p, const auto& q) {
             return p.size == q.size && p.allocated == q.allocated && p.mapped == q.mapped;
           });
  });
}

}  // namespace

TEST_CASE("the periodic shortcut gives the full simulation's stats and segments, bit for bit", "[reserved]") {
  // Configurations of every family step_setup covers, 1..80 layers, spread over micro-batch,
  // sequence, LoRA / full, precision, checkpointing, attention, optimizer, accumulation, cuBLAS
  // workspaces and PYTORCH_CUDA_ALLOC_CONF (expandable segments, max_split_size_mb, rounding).
  const std::vector<std::string> models{"meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B", "mistralai/Mistral-7B-v0.1",
                                        "meta-llama/Meta-Llama-3-8B"};
  const std::vector<std::string> confs{"", "expandable_segments:True", "max_split_size_mb:128",
                                       "roundup_power2_divisions:4", "max_split_size_mb:512,expandable_segments:True",
                                       "max_split_size_mb:20,max_non_split_rounding_mb:64"};
  const std::vector<std::pair<u64, u64>> shapes{{1, 128}, {2, 512}, {1, 2048}, {4, 1024}, {8, 256}, {3, 333}};
  size_t cases = 0, extrapolated = 0, simulated = 0, with_shortcut = 0;
  u64 skipped = 0, events = 0;
  std::map<std::string, std::pair<size_t, size_t>> by_conf;  // conf -> (periods extrapolated, simulated)
  for (size_t m = 0; m < models.size(); ++m)
    for (u64 layers : {1, 2, 3, 4, 7, 16, 32, 80})
      for (size_t v = 0; v < 10; ++v) {
        const size_t h = m * 7 + layers * 13 + v * 31;  // a spread of the variants, the same every run
        json j = {{"model", {{"id", models[m]}}},
                  {"task", h % 3 == 0 ? "full" : "lora"},
                  {"precision", h % 4 == 1 ? "fp32" : "bf16"},
                  {"micro_batch_size", shapes[h % shapes.size()].first},
                  {"sequence_length", shapes[h % shapes.size()].second},
                  {"gradient_checkpointing", (h / 2) % 2 == 0},
                  {"attention", h % 5 == 0 ? "eager" : "sdpa"},
                  {"optimizer", h % 7 == 3 ? "adamw_fused" : "adamw"},
                  {"gradient_accumulation_steps", h % 11 == 4 ? 2 : 1},
                  {"runtime", {{"alloc_conf", confs[(h / 3 + v) % confs.size()]}}}};
        if (h % 3 == 2) j["lora"] = {{"targets", "all-linear"}};
        Request r = parse_request(j, &lookup);
        r.model.layers = layers;
        auto s = sched::step_setup(r);
        REQUIRE(s);
        if (v % 2 == 0) s->workspaces = {8 * MiB + MiB / 8, MiB};
        const alloc::Config c = alloc::config_from_alloc_conf(confs[(h / 3 + v) % confs.size()]);
        const std::vector<std::int64_t> trace = sched::step_trace(*s);
        const alloc::Result full = alloc::simulate(alloc::events_from_signed(trace), c);
        const alloc::Result fast = sched::simulated_step(*s, c);
        INFO(j.dump() << " layers " << layers);
        CHECK(same_stats(full.stats, fast.stats));
        CHECK(same_segments(full.segments, fast.segments));
        // what the estimator reads: the stats without the segment views
        const sched::Trace looped = sched::step_trace_with_loops(*s);
        CHECK(looped.events == trace);
        std::vector<alloc::Period> periods;
        for (const sched::Loop& l : looped.loops) periods.push_back({l.first, l.length, l.iterations});
        CHECK(same_stats(full.stats, alloc::periodic_stats(looped.events, periods, c)));
        if (c.device_limit == alloc::kNoLimit) CHECK(sched::simulated_reserved(*s, c) == full.stats.peak_reserved);
        ++cases;
        extrapolated += fast.periods_extrapolated;
        simulated += fast.periods_simulated;
        with_shortcut += fast.periods_extrapolated > 0 ? 1 : 0;
        skipped += fast.events_skipped;
        events += trace.size();
        by_conf[confs[(h / 3 + v) % confs.size()]].first += fast.periods_extrapolated;
        by_conf[confs[(h / 3 + v) % confs.size()]].second += fast.periods_simulated;
      }
  std::printf("periodic shortcut: %zu configurations, %zu with a shortcut; per-layer loops: %zu extrapolated, "
              "%zu simulated in full (fallback); %llu of %llu events not simulated (%.1f %%)\n",
              cases, with_shortcut, extrapolated, simulated, static_cast<unsigned long long>(skipped),
              static_cast<unsigned long long>(events), 100.0 * static_cast<double>(skipped) / static_cast<double>(events));
  for (const auto& [conf, n] : by_conf)
    std::printf("  alloc_conf \"%s\": %zu extrapolated, %zu simulated in full\n", conf.c_str(), n.first, n.second);
  CHECK(extrapolated > 0);  // the shortcut is exercised, not only its fallback
}

// Diagnosis of the cases where the two reserved figures differ: build/native/tests/memfit_tests
// "[.alloc9-diag]" (MEMFIT_ALLOC9_CASE=<substring> picks cases; default: every case whose
// small pool differs). Per case and trace (the real one, the schedule's), the small pool's peak
// of live blocks (512 B rounded), the fewest 2 MiB segments that holds it, the segments the
// simulation needs, the allocation at which each segment appears (with the schedule's name),
// and the blocks live at that peak by size.
TEST_CASE("[.alloc9-diag] where the small pools of the real trace and the schedule part", "[.alloc9-diag]") {
  const char* pick = std::getenv("MEMFIT_ALLOC9_CASE");
  for_each_covered_trace(pick, [&](const CoveredTrace& t) {
    const std::string& name = t.name;
    const SmallPool real = small_pool(t.real, {}), mine = small_pool(t.schedule, t.names);
    if (!pick && real.segments == mine.segments) return;
    std::printf("## %s\n", name.c_str());
    for (const auto& [label, p] : {std::pair<const char*, const SmallPool*>{"real trace", &real},
                                   std::pair<const char*, const SmallPool*>{"schedule", &mine}}) {
      const u64 fewest = (p->peak_live + alloc::kSmallBuffer - 1) / alloc::kSmallBuffer;
      std::printf("  %-10s small pool: %zu allocations, peak live %.1f KiB at allocation %zu; %llu segments "
                  "(%llu hold the peak: %.0f %% filled)\n    segment n appears at allocation:",
                  label, p->sizes.size(), double(p->peak_live) / 1024, p->peak_at,
                  static_cast<unsigned long long>(p->segments), static_cast<unsigned long long>(fewest),
                  100.0 * double(p->peak_live) / double(p->segments * alloc::kSmallBuffer));
      for (size_t a : p->segment_at)
        std::printf(" %zu (%lld B%s%s)", a, static_cast<long long>(p->sizes[a]), p->names.empty() ? "" : " ",
                    p->names.empty() ? "" : p->names[a].c_str());
      std::printf("\n");
    }
    std::map<u64, std::pair<int, int>> by_size;  // rounded size -> live blocks at the peak (real, schedule)
    for (size_t a : real.live_at_peak) ++by_size[alloc::rounded_size(static_cast<u64>(real.sizes[a]), alloc::Config{})].first;
    for (size_t a : mine.live_at_peak) ++by_size[alloc::rounded_size(static_cast<u64>(mine.sizes[a]), alloc::Config{})].second;
    std::printf("  blocks live at the peaks (block size: real / schedule):");
    for (const auto& [size, n] : by_size)
      if (n.first != n.second) std::printf(" %llu: %d / %d;", static_cast<unsigned long long>(size), n.first, n.second);
    std::printf("\n");
  });
}

// For scripts: every covered traced case's real trace and the schedule's (with the names of its
// allocations) as JSON lines in $MEMFIT_ALLOC9_DUMP: build/native/tests/memfit_tests "[.alloc9-dump]"
TEST_CASE("[.alloc9-dump] the traces of the covered traced cases as JSON lines", "[.alloc9-dump]") {
  const char* path = std::getenv("MEMFIT_ALLOC9_DUMP");
  REQUIRE(path);
  std::ofstream out(path);
  for_each_covered_trace(nullptr, [&](const CoveredTrace& t) {
    out << json{{"name", t.name}, {"real", t.real}, {"sched", t.schedule}, {"names", t.names}}.dump() << "\n";
  });
}

namespace {

/// One small (<= 1 MiB) allocation of a trace: its size, its allocation number among the small
/// ones, how many allocations (of either pool) later it is freed (-1: never), and its name.
struct SmallAlloc {
  std::int64_t bytes = 0;
  size_t at = 0;
  std::int64_t lives = -1;
  std::string name;
};

std::vector<SmallAlloc> small_allocs(const std::vector<std::int64_t>& trace, const std::vector<std::string>& names) {
  std::vector<SmallAlloc> out;
  std::vector<std::int64_t> index;  // allocation number -> index in out (-1: large)
  std::vector<size_t> born;
  size_t n = 0;
  for (std::int64_t e : trace) {
    if (e > 0) {
      const bool small = static_cast<u64>(e) <= alloc::kSmallSize;
      index.push_back(small ? static_cast<std::int64_t>(out.size()) : -1);
      born.push_back(n);
      if (small) out.push_back({e, out.size(), -1, names.empty() ? "" : names.at(n)});
      ++n;
    } else if (e < 0) {
      const size_t a = static_cast<size_t>(-e - 1);
      if (index.at(a) >= 0) out[static_cast<size_t>(index[a])].lives = static_cast<std::int64_t>(n - born[a]);
    }
  }
  return out;
}

}  // namespace

// Which small allocations of a real trace the lists do not have: the two traces' small allocations
// aligned by size in order (a longest common subsequence), and every real one left unmatched
// printed with its size, its place (the schedule allocations matched just before and after it) and
// its lifetime (allocations until its free; "never" for the whole trace), so what is added to the
// lists is what PyTorch really allocates. MEMFIT_ALLOC9_CASE=<substring> (default: the first
// covered case) picks the cases; MEMFIT_ALLOC9_EXTRA=1 also lists the schedule's unmatched ones.
// build/native/tests/memfit_tests "[.alloc9-missing]"
TEST_CASE("[.alloc9-missing] the small allocations of a real trace with no list entry", "[.alloc9-missing]") {
  const char* pick = std::getenv("MEMFIT_ALLOC9_CASE");
  const bool extra = std::getenv("MEMFIT_ALLOC9_EXTRA") != nullptr;
  bool shown = false;
  for_each_covered_trace(pick, [&](const CoveredTrace& t) {
    if (shown && !pick) return;  // default: the first covered case only
    shown = true;
    const std::string& name = t.name;
    const std::vector<SmallAlloc> real = small_allocs(t.real, {}), mine = small_allocs(t.schedule, t.names);
    const size_t n = real.size(), m = mine.size();
    std::vector<std::vector<std::uint16_t>> lcs(n + 1, std::vector<std::uint16_t>(m + 1, 0));
    for (size_t i = n; i-- > 0;)
      for (size_t j = m; j-- > 0;)
        lcs[i][j] = real[i].bytes == mine[j].bytes ? static_cast<std::uint16_t>(lcs[i + 1][j + 1] + 1)
                                                   : std::max(lcs[i + 1][j], lcs[i][j + 1]);
    std::vector<std::int64_t> match(n, -1), matched_by(m, -1);
    for (size_t i = 0, j = 0; i < n && j < m;) {
      if (real[i].bytes == mine[j].bytes && lcs[i][j] == lcs[i + 1][j + 1] + 1) {
        match[i] = static_cast<std::int64_t>(j), matched_by[j] = static_cast<std::int64_t>(i), ++i, ++j;
      } else if (lcs[i + 1][j] >= lcs[i][j + 1]) {
        ++i;
      } else {
        ++j;
      }
    }
    std::printf("## %s: %zu small allocations in the real trace, %zu in the schedule's, %u matched by size in order\n",
                name.c_str(), n, m, static_cast<unsigned>(lcs[0][0]));
    std::int64_t before = -1;
    for (size_t i = 0; i < n; ++i) {
      if (match[i] >= 0) {
        before = match[i];
        continue;
      }
      std::int64_t after = -1;
      for (size_t k = i + 1; k < n && after < 0; ++k) after = match[k];
      std::printf("  real #%zu %lld B lives %s%s  after [%s] before [%s]\n", i, static_cast<long long>(real[i].bytes),
                  real[i].lives < 0 ? "never" : std::to_string(real[i].lives).c_str(), real[i].lives < 0 ? "" : " allocs",
                  before < 0 ? "start" : mine[static_cast<size_t>(before)].name.c_str(),
                  after < 0 ? "end" : mine[static_cast<size_t>(after)].name.c_str());
    }
    for (size_t j = 0; extra && j < m; ++j)
      if (matched_by[j] < 0)
        std::printf("  schedule #%zu %lld B %s lives %lld (no real counterpart)\n", j, static_cast<long long>(mine[j].bytes),
                    mine[j].name.c_str(), static_cast<long long>(mine[j].lives));
  });
}
