// The tensor lists (layer_ops) and the schedule pass (schedule): the lists' structure, the
// periodic shortcut against the full trace, and the allocated / reserved peaks against the CPU
// suite's measurements (data/measurements/cpu-suite-full.jsonl, cpu-traces.jsonl).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "layer_ops.hpp"
#include "memfit/allocator.hpp"
#include "memfit/estimate.hpp"
#include "memfit/library.hpp"
#include "memfit/request.hpp"
#include "records.hpp"
#include "schedule.hpp"

using namespace memfit;
using namespace memfit::sched;
using namespace memfit::testing;

namespace {

Dims tiny_dims() { return {2, 64, 128, 128, 32, 512, 8, 1024, 8, 16}; }

StepSetup tiny_setup(bool full, bool half, bool eager, bool gc, u64 layers) {
  StepSetup s;
  s.layer = {half, eager, true, full, !full, false, false};
  s.dims = tiny_dims();
  s.dtypes = {half ? 2u : 4u, 4};
  s.layers = layers;
  s.checkpointing = gc;
  s.tied_embeddings = true;
  return s;
}

struct Record {
  std::string name;
  nlohmann::json request;
  u64 measured = 0;
  std::vector<std::int64_t> trace;
};

/// The measured cases of data/measurements/`file`.
std::vector<Record> records(const std::string& file) {
  std::vector<Record> out;
  for (const RecordLine& l : record_lines(file)) {
    if (l.measured.is_null()) continue;
    Record r{l.name, l.request, l.measured["peak_allocated_bytes"].get<u64>(), {}};
    if (l.measured.contains("allocation_trace")) r.trace = l.measured["allocation_trace"].get<std::vector<std::int64_t>>();
    out.push_back(std::move(r));
  }
  return out;
}

double pct(double est, double ref) { return 100.0 * (est - ref) / ref; }

/// The shortcut's peak, phase, components and per-phase peaks are the full trace's; the components
/// sum to the peak, the peak is its phase's largest moment and no phase goes above it.
void check_shortcut_parts(const StepSetup& s) {
  const StepPeak fast = step_peak(s), full = trace_step_peak(s);
  CHECK(fast.bytes == full.bytes);
  CHECK(phase_name(fast.phase) == phase_name(full.phase));
  u64 sum = 0;
  for (size_t c = 0; c < kParts; ++c) {
    INFO(part_name(static_cast<Part>(c)));
    CHECK(fast.parts[c] == full.parts[c]);
    sum += fast.parts[c];
  }
  CHECK(sum == fast.bytes);
  for (size_t p = 0; p < kPhases; ++p) {
    INFO(phase_name(static_cast<Phase>(p)));
    CHECK(fast.phase_peaks[p] == full.phase_peaks[p]);
    CHECK(fast.phase_peaks[p] <= fast.bytes);
  }
  CHECK(fast.phase_peaks[static_cast<size_t>(fast.phase)] == fast.bytes);
}


}  // namespace

TEST_CASE("every lifetime in the lists names an entry of its list") {
  for (bool full : {true, false})
    for (bool half : {false, true})
      for (bool eager : {false, true})
        for (bool window : {false, true}) {
          LayerSetup s{half, eager, true, full, !full, false, window && !eager};
          for (const OpList& l : {decoder_layer(s), embedding(s), head_and_loss(s)})
            for (const TensorOp& t : l)
              if (!t.dies_after.empty() && t.dies_after != "layer_out" && t.dies_after != "decoder_end" &&
                  t.dies_after != "backward_end") {
                INFO(t.name << " dies after " << t.dies_after);
                CHECK(find_op(l, t.dies_after) != nullptr);
              }
        }
}

TEST_CASE("edits change the entries they are about") {
  const LayerSetup base{};
  LayerSetup eager = base;
  eager.eager = true;
  eager.gqa = true;
  // eager attention: the fp32 softmax is saved, the flash kernel's lse is gone
  REQUIRE(find_op(decoder_layer(eager), "attn.softmax") != nullptr);
  CHECK(find_op(decoder_layer(eager), "attn.softmax")->saved);
  CHECK(find_op(decoder_layer(eager), "attn.softmax")->dtype == Dt::F32);
  CHECK(find_op(decoder_layer(eager), "attn.lse") == nullptr);
  CHECK(find_op(decoder_layer(base), "attn.lse")->saved);
  // half precision: the norm saves its fp32 upcast, not its input
  LayerSetup half = base;
  half.half = true;
  CHECK(find_op(decoder_layer(half), "norm1.upcast")->saved);
  CHECK_FALSE(find_op(decoder_layer(half), "input")->saved);
  CHECK(find_op(decoder_layer(base), "input")->saved);
  // half eager attention: softmax(dtype=float32) runs on an fp32 copy of the scores and its
  // gradient is fp32; CUDA fp16's _softmax(half_to_float) makes no copy and a half gradient
  // (step_lists applies that edit to every family's decoder list)
  StepSetup half_eager = tiny_setup(true, true, true, false, 2);
  const OpList fp32_softmax = step_lists(half_eager).layers.front().list;
  REQUIRE(find_op(fp32_softmax, "attn.softmax_in") != nullptr);
  CHECK(find_op(fp32_softmax, "attn.softmax_in")->dtype == Dt::F32);
  CHECK(find_op(fp32_softmax, "attn.softmax")->grad_dtype == Dt::F32);
  CHECK(find_op(fp32_softmax, "attn.probs_half")->grad_dtype == Dt::F32);
  half_eager.layer.softmax_half_to_float = true;
  const OpList half_to_float = step_lists(half_eager).layers.front().list;
  CHECK(find_op(half_to_float, "attn.softmax_in") == nullptr);
  CHECK(find_op(half_to_float, "attn.softmax")->grad_dtype == Dt::Model);
  // LoRA on q and v: adapters on those two only, no trained base weight
  LayerSetup qv = base;
  qv.full = false;
  qv.lora_qv = true;
  const OpList l = decoder_layer(qv);
  CHECK(find_op(l, "q.lora_A") != nullptr);
  CHECK(find_op(l, "v.lora_A") != nullptr);
  CHECK(find_op(l, "k.lora_A") == nullptr);
  CHECK(find_op(l, "q_proj.base")->weight.empty);
  CHECK_FALSE(find_op(l, "mlp.mul")->saved);  // down_proj is frozen: nothing keeps its input
}

TEST_CASE("the periodic shortcut equals the full simulation") {
  for (bool full : {true, false})
    for (bool half : {false, true})
      for (bool eager : {false, true})
        for (bool gc : {false, true})
          for (u64 layers : {1u, 2u, 3u, 7u, 32u})
            for (u64 micro : {1u, 2u}) {
              StepSetup s = tiny_setup(full, half, eager, gc, layers);
              s.accumulation = micro;
              for (bool cuda : {false, true}) {
                s.round_512 = cuda;
                INFO("full " << full << " half " << half << " eager " << eager << " gc " << gc << " layers " << layers
                             << " micro-batches " << micro);
                CHECK(peak_allocated(s) == trace_peak(step_trace(s), cuda));
                check_shortcut_parts(s);
              }
            }
}

// A grouped decoder (groups of identical layers with their own sizes, lists and parameters, as
// DeepSeek-V3's dense then MoE layers): each group is one periodic loop of the shortcut.
TEST_CASE("the periodic shortcut equals the full simulation on a grouped decoder") {
  for (bool full : {true, false})
    for (bool half : {false, true})
      for (bool gc : {false, true})
        for (u64 first : {1u, 2u, 5u})
          for (u64 second : {1u, 3u})
            for (u64 micro : {1u, 2u}) {
              StepSetup s = tiny_setup(full, half, false, gc, first + second + 3);
              s.accumulation = micro;
              Dims wide = s.dims;
              wide.i = 3 * s.dims.i;  // the second group's MLP is wider, its parameters larger
              LayerSetup eager = s.layer;
              eager.eager = true;  // and its list differs
              // interleaved as Llama 4's dense and MoE layers: a group may come back after another
              s.groups = {{"dense_layer", first, s.layer, s.dims, {}, 0}, {"wide_layer", second, eager, wide, {}, 0},
                          {"dense_layer", 2, s.layer, s.dims, {}, 0}, {"wide_layer", 1, eager, wide, {}, 0}};
              s.layers = first + second + 3;
              for (bool cuda : {false, true}) {
                s.round_512 = cuda;
                INFO("full " << full << " half " << half << " gc " << gc << " groups " << first << " + " << second
                             << " micro-batches " << micro);
                CHECK(peak_allocated(s) == trace_peak(step_trace(s), cuda));
              }
            }
}

// Groups of one kind repeated in a pattern (Llama 4's RoPE and NoPE layers): the peak sink runs the
// pattern once and extrapolates it, the trace walks every layer
TEST_CASE("the periodic shortcut equals the full simulation on a repeated pattern of layer groups") {
  for (bool full : {true, false})
    for (bool gc : {false, true})
      for (u64 reps : {1u, 2u, 3u, 12u})
        for (u64 first : {1u, 3u}) {
          StepSetup s = tiny_setup(full, true, false, gc, reps * (first + 1));
          Dims wide = s.dims;
          wide.i = 3 * s.dims.i;
          LayerSetup eager = s.layer;
          eager.eager = true;
          for (u64 k = 0; k < reps; ++k) {
            s.groups.push_back({"rope_layer", first, s.layer, s.dims, {}, 0, 0});
            s.groups.push_back({"nope_layer", 1, eager, wide, {}, 0, 1});
          }
          INFO("full " << full << " gc " << gc << " pattern (" << first << " + 1) x " << reps);
          CHECK(peak_allocated(s) == trace_peak(step_trace(s), false));
        }
}

TEST_CASE("a grouped decoder's tables name each group's list and the layers it describes") {
  StepSetup s = tiny_setup(false, false, false, false, 4);
  Dims wide = s.dims;
  wide.i = 3 * s.dims.i;
  s.groups = {{"dense_layer", 1, s.layer, s.dims, {}, 0}, {"wide_layer", 3, s.layer, wide, {}, 0}};
  const std::vector<ListTable> t = tensor_tables(s);
  REQUIRE(t.size() == 4);  // embedding, first_layer (LoRA without checkpointing), wide_layer, head
  CHECK(t[1].list == "first_layer");
  CHECK((t[1].first == 0 && t[1].count == 1));
  CHECK(t[2].list == "wide_layer");
  CHECK((t[2].first == 1 && t[2].count == 3));
  // the wide group's gate projection is three times the dense group's
  auto bytes_of = [](const ListTable& l, std::string_view n) {
    for (const TensorRow& r : l.forward)
      if (r.name == n) return r.bytes;
    return u64{0};
  };
  CHECK(bytes_of(t[2], "gate_proj.out") == 3 * bytes_of(t[1], "gate_proj.out"));
  // a grouped step is not the one-group step of its first group's sizes
  StepSetup one = tiny_setup(false, false, false, false, 4);
  CHECK(peak_allocated(s) != peak_allocated(one));
}

// A later micro-batch adds each new weight gradient into the kept .grad (AccumulateGrad): it allocates
// one more tensor per trained weight of the first micro-batch's size, and frees all of them.
TEST_CASE("a later micro-batch's weight gradients are made and freed, the first's kept") {
  StepSetup s = tiny_setup(true, false, false, false, 2);
  s.accumulation = 2;
  s.steps = 1;
  std::vector<std::string> names;
  const auto t = step_trace(s, &names);
  size_t kept = 0, added = 0;
  for (const std::string& n : names) kept += n.starts_with("weight_grad:"), added += n.starts_with("weight_grad_new:");
  CHECK(kept > 0);
  // kept: the first micro-batch's, and the second's tied head gradient, which waits for the
  // embedding's to be summed with it; added: every other gradient of the second
  CHECK(added + 2 == kept);
}

TEST_CASE("the trace frees only what it allocated, and everything but the weights and state") {
  StepSetup s = tiny_setup(true, false, false, false, 2);
  s.accumulation = GENERATE(1u, 2u);
  const auto t = step_trace(s);
  std::vector<bool> live;
  for (std::int64_t e : t) {
    if (e > 0) live.push_back(true);
    else {
      REQUIRE(static_cast<size_t>(-e - 1) < live.size());
      REQUIRE(live[static_cast<size_t>(-e - 1)]);
      live[static_cast<size_t>(-e - 1)] = false;
    }
  }
}

namespace {

/// The request of a measured record, as the estimator reads it.
Request request_of(const Record& r) { return estimator_request(r.request); }

/// The suite's cases the lists cover, with their setups: cpu-suite-full.jsonl and the families
/// measured apart (gpt-oss, Llama 4 text; Gemma3, SmolLM3, OLMo-2).
std::vector<std::pair<Record, StepSetup>> covered_suite_records() {
  std::vector<std::pair<Record, StepSetup>> out;
  for (const char* file : {"cpu-suite-full.jsonl", "cpu-suite-families.jsonl"})
    for (Record& r : records(file))
      if (const auto s = step_setup(request_of(r))) out.emplace_back(std::move(r), *s);
  return out;
}

}  // namespace

// The gate: the schedule's peak within 2 % of every CPU measurement it covers
// (nothing here was fitted on these records: the lists follow derivatives.yaml and the modeling files).
TEST_CASE("the schedule's allocated peak is within 2 % of every covered CPU suite measurement") {
  const auto covered = covered_suite_records();
  for (const auto& [r, s] : covered) {
    INFO(r.name << ": measured " << r.measured << ", schedule " << peak_allocated(s));
    CHECK(std::abs(pct(double(peak_allocated(s)), double(r.measured))) <= 2.0);
  }
  CHECK(covered.size() >= 300);
}

// The peak sink's per-layer extrapolation against the full trace, on every covered suite case (every
// family's lists, as the suite's configs reach them): the peak, and the phase and components there
TEST_CASE("the periodic shortcut equals the full trace on every covered suite case") {
  const auto covered = covered_suite_records();
  for (const auto& [r, s] : covered) {
    INFO(r.name);
    CHECK(peak_allocated(s) == trace_peak(step_trace(s), s.round_512));
    check_shortcut_parts(s);
    StepSetup cuda = s;  // the same run with CUDA's 512-byte blocks and the cuBLAS workspaces
    cuda.round_512 = true;
    cuda.workspaces = {8 * 1048576 + 131072, 1048576};
    check_shortcut_parts(cuda);
  }
  CHECK(covered.size() >= 300);
}

// Reserved: the schedule replayed through the caching-allocator simulation against the tracker's
// real allocation trace replayed through the same simulation. On these tiny models reserved is a
// count of 2 MiB segments; the schedule is within one segment on every covered trace.
TEST_CASE("the schedule's simulated reserved is within one segment of the replayed real trace") {
  std::map<std::string, std::vector<std::int64_t>> traces;
  for (const char* f : {"cpu-traces.jsonl", "cpu-traces-schedule.jsonl"})
    for (Record& r : records(f)) traces[r.name] = std::move(r.trace);
  int compared = 0;
  for (const Record& r : records("cpu-suite-full.jsonl")) {
    const auto s = step_setup(request_of(r));
    auto it = traces.find(r.name);
    if (!s || it == traces.end()) continue;
    ++compared;
    const auto real = alloc::simulate(alloc::events_from_signed(it->second)).stats.peak_reserved;
    const auto sim = alloc::simulate(alloc::events_from_signed(step_trace(*s))).stats.peak_reserved;
    INFO(r.name << ": replayed trace " << real << ", schedule " << sim);
    CHECK(std::max(real, sim) - std::min(real, sim) <= alloc::kSmallBuffer);
  }
  CHECK(compared >= 250);
}

// Every suite case the schedule covers (every family of step_setup's table), then per family the
// largest and the median |error| of the allocated peak.
TEST_CASE("[.table] schedule vs measured", "[.table]") {
  std::map<std::string, std::vector<std::int64_t>> traces;
  for (Record& r : records("cpu-traces.jsonl")) traces[r.name] = std::move(r.trace);
  std::map<std::string, std::vector<double>> errors;  // family -> |error %| of the allocated peak
  std::printf("| case | measured | engine | error %% | schedule | error %% | replayed trace reserved MiB | schedule reserved MiB | error %% |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Record& r : records("cpu-suite-full.jsonl")) {
    const auto s = step_setup(request_of(r));
    if (!s) continue;
    const u64 est = peak_allocated(*s);
    const u64 today = estimate_from(request_of(r), AllocatedFrom::Engine).allocated_peak_bytes;
    errors[r.name.substr(0, r.name.find('/'))].push_back(std::abs(pct(double(est), double(r.measured))));
    std::printf("| %s | %llu | %llu | %+.2f | %llu | %+.2f |", r.name.c_str(), (unsigned long long)r.measured,
                (unsigned long long)today, pct(double(today), double(r.measured)), (unsigned long long)est,
                pct(double(est), double(r.measured)));
    auto it = traces.find(r.name);
    if (it != traces.end()) {
      const auto real = alloc::simulate(alloc::events_from_signed(it->second)).stats.peak_reserved;
      const auto sim = alloc::simulate(alloc::events_from_signed(step_trace(*s))).stats.peak_reserved;
      std::printf(" %.3f | %.3f | %+.2f |\n", real / 1048576.0, sim / 1048576.0, pct(double(sim), double(real)));
    } else {
      std::printf(" | | |\n");
    }
  }
  std::printf("\n| family | cases | max abs error %% | median abs error %% |\n|---|---:|---:|---:|\n");
  for (auto& [family, e] : errors) {
    std::sort(e.begin(), e.end());
    const double median = e.size() % 2 ? e[e.size() / 2] : (e[e.size() / 2 - 1] + e[e.size() / 2]) / 2;
    std::printf("| %s | %zu | %.2f | %.2f |\n", family.c_str(), e.size(), e.back(), median);
  }
}

namespace {

/// Per record file: the cases step_setup covers, those whose schedule peak is over 2 % from the
/// measurement (listed with the engine's beside), and the largest |error|.
void print_schedule_vs_records(std::initializer_list<const char*> files) {
  std::printf("| record | covered | over 2 %% | max |error| %% |\n|---|---:|---:|---:|\n");
  std::string misses;
  // MEMFIT_SCHED_SHOW=S also lists the covered cases whose name contains S (a family's figures)
  const char* show = std::getenv("MEMFIT_SCHED_SHOW");
  for (const char* f : files) {
    int covered = 0, over = 0;
    double largest = 0;
    for (const Record& r : records(f)) {
      const Request q = request_of(r);
      const auto s = step_setup(q);
      if (!s) continue;
      ++covered;
      const double e = pct(double(peak_allocated(*s)), double(r.measured));
      largest = std::max(largest, std::abs(e));
      const bool shown = show && r.name.find(show) != std::string::npos;  // listed whatever its error
      if (std::abs(e) > 2.0) ++over;
      else if (!shown) continue;
      char line[512];
      std::snprintf(line, sizeof line, "- %s %s: schedule %+.2f %%, engine %+.2f %%\n", f, r.name.c_str(), e,
                    pct(double(estimate_from(q, AllocatedFrom::Engine).allocated_peak_bytes), double(r.measured)));
      misses += line;
    }
    std::printf("| %s | %d | %d | %.2f |\n", f, covered, over, largest);
  }
  std::printf("\n%s", misses.c_str());
}

}  // namespace

// The schedule's allocated peak on every record the lists cover (tuning and check sets; the
// holdouts have their own tag, run by whoever replays them): what stands between the schedule and
// replacing the estimator's engine.
TEST_CASE("[.sched-all] schedule vs every tuning and check record", "[.sched-all]") {
  print_schedule_vs_records({"cpu-suite-full.jsonl", "cpu-suite-generated.jsonl", "cpu-suite-families.jsonl",
                             "cpu-suite-frameworks.jsonl", "cpu-lora-dropout.jsonl", "cpu-tiny-subset.jsonl",
                             "cpu-traces.jsonl", "cpu-check.jsonl"});
}

TEST_CASE("[.sched-holdout] schedule vs the holdout records", "[.sched-holdout]") {
  print_schedule_vs_records({"cpu-holdout.jsonl", "cpu-holdout2.jsonl", "cpu-holdout3.jsonl", "cpu-holdout4.jsonl",
                             "cpu-holdout5.jsonl", "cpu-holdout6.jsonl", "cpu-holdout7.jsonl", "cpu-holdout8.jsonl", "cpu-holdout9.jsonl",
                             "cpu-holdout10.jsonl", "cpu-holdout11.jsonl", "cpu-holdout12.jsonl", "cpu-holdout13.jsonl",
                             "cpu-holdout14.jsonl", "cpu-holdout15.jsonl", "cpu-holdout16.jsonl"});
}

// Diagnosis: the live allocations at the schedule's peak for the record named by $MEMFIT_CASE in
// $MEMFIT_RECORD (default cpu-suite-generated.jsonl); MEMFIT_AS_H100=1 sets the request on an H100,
// where the lists take CUDA's kernels (the measured figure printed is still the CPU record's).
TEST_CASE("[.sched-peak] live allocations at the schedule's peak", "[.sched-peak]") {
  const char* name = std::getenv("MEMFIT_CASE");
  const char* file = std::getenv("MEMFIT_RECORD");
  const bool as_h100 = std::getenv("MEMFIT_AS_H100") != nullptr;
  if (!name) return;
  for (Record r : records(file ? file : "cpu-suite-generated.jsonl")) {
    if (r.name != name) continue;
    if (as_h100) r.request["device"] = "cuda", r.request["gpu"] = {{"name", "H100-SXM-80GB"}};
    const auto s = step_setup(request_of(r));
    REQUIRE(s);
    std::vector<std::string> names;
    const auto t = step_trace(*s, &names);
    std::vector<std::int64_t> live;
    std::int64_t cur = 0, peak = 0;
    size_t at = 0;
    std::vector<std::int64_t> sizes;
    const char* only = std::getenv("MEMFIT_AT");  // the highest moment an allocation of this name makes
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] > 0) sizes.push_back(t[i]), cur += t[i];
      else cur -= sizes[size_t(-t[i] - 1)];
      if (only && (t[i] < 0 || names[sizes.size() - 1] != only)) continue;
      if (cur > peak) peak = cur, at = i;
    }
    std::vector<bool> alive(sizes.size(), false);
    size_t k = 0;
    for (size_t i = 0; i <= at; ++i) {
      if (t[i] > 0) alive[k++] = true;
      else alive[size_t(-t[i] - 1)] = false;
    }
    std::printf("measured %llu schedule %lld (%+.2f %%) at event %zu of %zu\n", (unsigned long long)r.measured,
                (long long)peak, pct(double(peak), double(r.measured)), at, t.size());
    std::map<std::string, std::pair<int, std::int64_t>> by;
    for (size_t i = 0; i < sizes.size(); ++i)
      if (alive[i]) ++by[names[i]].first, by[names[i]].second += sizes[i];
    std::vector<std::pair<std::int64_t, std::string>> rows;
    for (auto& [n, v] : by) rows.push_back({v.second, n + " x" + std::to_string(v.first)});
    std::sort(rows.rbegin(), rows.rend());
    for (auto& [b, n] : rows) std::printf("%12lld %s\n", (long long)b, n.c_str());
    std::printf("last events:");
    size_t idx = 0;
    std::vector<size_t> alloc_of(t.size());
    for (size_t i = 0; i < t.size(); ++i) alloc_of[i] = t[i] > 0 ? idx++ : size_t(-t[i] - 1);
    for (size_t i = at > 40 ? at - 40 : 0; i <= at + 5 && i < t.size(); ++i)
      std::printf(" %s%s(%lld)", t[i] > 0 ? "+" : "-", names[alloc_of[i]].c_str(), (long long)sizes[alloc_of[i]]);
    std::printf("\n");
  }
}

// Every covered record whose name contains $MEMFIT_SCHED_FILTER (all when unset), with the
// schedule's and today's estimator's error: for diagnosing one pattern across record files.
TEST_CASE("[.sched-list] schedule vs the records of a filter", "[.sched-list]") {
  const char* env = std::getenv("MEMFIT_SCHED_FILTER");
  const std::string filter = env ? env : "";
  std::vector<std::string> files{"cpu-suite-full.jsonl", "cpu-suite-generated.jsonl", "cpu-suite-frameworks.jsonl",
                                 "cpu-suite-families.jsonl", "cpu-tiny-subset.jsonl", "cpu-traces.jsonl", "cpu-check.jsonl"};
  // MEMFIT_SCHED_RECORD=/abs/path.jsonl: a record of one's own (a diagnosis run, not a tuning record) instead
  if (const char* own = std::getenv("MEMFIT_SCHED_RECORD")) files = {std::string("../../../../../../../..") + own};
  for (const std::string& f : files)
    for (const Record& r : records(f)) {
      if (r.name.find(filter) == std::string::npos) continue;
      const Request q = request_of(r);
      const auto s = step_setup(q);
      if (!s) continue;
      std::printf("%s %s: schedule %+.2f %%, engine %+.2f %%\n", f.c_str(), r.name.c_str(),
                  pct(double(peak_allocated(*s)), double(r.measured)),
                  pct(double(estimate_from(q, AllocatedFrom::Engine).allocated_peak_bytes), double(r.measured)));
    }
}

// Per record file (tuning and check records): how many cases take their allocated figure from the
// tensor schedule, from the engine (not covered), or the larger of the two where they disagree.
TEST_CASE("[.sched-methods] where the estimate's allocated figure comes from", "[.sched-methods]") {
  std::printf("| record | cases | tensor schedule | larger of the two | engine |\n|---|---:|---:|---:|---:|\n");
  for (const char* f : {"cpu-suite-full.jsonl", "cpu-suite-generated.jsonl", "cpu-suite-families.jsonl",
                        "cpu-suite-frameworks.jsonl", "cpu-lora-dropout.jsonl", "cpu-tiny-subset.jsonl",
                        "cpu-traces.jsonl", "cpu-traces-schedule.jsonl", "cpu-tensors.jsonl", "cpu-check.jsonl"}) {
    int cases = 0, schedule = 0, larger = 0, engine = 0;
    for (const Record& r : records(f)) {
      Request q;
      try {
        q = request_of(r);
      } catch (const std::exception&) {
        continue;  // a request the estimator refuses (the replay's "unsupported")
      }
      const std::string m = estimate(q).allocated_method;
      ++cases;
      if (m == "tensor schedule") ++schedule;
      else if (m.starts_with("tensor schedule and engine disagree")) {
        ++larger;
        std::printf("  %s %s: %s\n", f, r.name.c_str(), m.c_str());
      } else ++engine;
    }
    std::printf("| %s | %d | %d | %d | %d |\n", f, cases, schedule, larger, engine);
  }
}

namespace {

/// A record's measured categories at the peak, as the validator reads them (validate_compare.cpp
/// steady_breakdown: the last top-level step phase that reaches the peak), grouped as the validator
/// maps the estimate's components: weights, gradients, optimizer states, the rest.
std::array<double, 4> measured_groups(const nlohmann::json& m) {
  nlohmann::json best = m.value("peak_breakdown", nlohmann::json::object());
  const double peak = m.value("tracker_peak_bytes", m.value("peak_allocated_bytes", 0.0));
  long best_step = -1;
  if (m.contains("phases") && m["phases"].is_object())
    for (auto it = m["phases"].begin(); it != m["phases"].end(); ++it) {
      const std::string& k = it.key();
      if (k.rfind("step", 0) != 0 || k.find('.') != std::string::npos || !it->contains("peak_breakdown")) continue;
      const long step = std::strtol(k.c_str() + 4, nullptr, 10);
      if (it->value("peak_bytes", -1.0) == peak && step > best_step) best_step = step, best = (*it)["peak_breakdown"];
    }
  std::array<double, 4> g{};
  for (auto it = best.begin(); it != best.end(); ++it) {
    const std::string& k = it.key();
    const size_t at = k == "parameter" || k == "buffer" ? 0 : k == "gradient" ? 1 : k == "optimizer_state" ? 2 : 3;
    g[at] += it->get<double>();
  }
  return g;
}

std::array<double, 4> estimate_groups(const Estimate& e) {
  std::array<double, 4> g{};
  for (const Component& c : e.breakdown) {
    const size_t at = c.name == "weights" || c.name == "master_weights" ? 0
                      : c.name == "gradients"                            ? 1
                      : c.name == "optimizer_states"                     ? 2
                                                                         : 3;
    g[at] += double(c.bytes);
  }
  return g;
}

}  // namespace

// The components at the peak against the tracker's categories there, schedule vs engine, on every
// covered tuning and check record: how many cases have a group (weights, gradients, optimizer
// states, activations + temporaries) more than 2 % of the peak away from the measured one.
TEST_CASE("[.sched-parts] components at the peak, schedule vs engine vs measured", "[.sched-parts]") {
  std::printf("| record | covered | engine: a group off by > 2 %% of the peak | schedule: the same |\n|---|---:|---:|---:|\n");
  for (const char* f : {"cpu-suite-full.jsonl", "cpu-suite-generated.jsonl", "cpu-suite-families.jsonl",
                        "cpu-suite-frameworks.jsonl", "cpu-tiny-subset.jsonl", "cpu-traces.jsonl", "cpu-check.jsonl"}) {
    int covered = 0, engine_off = 0, schedule_off = 0;
    for (const RecordLine& l : record_lines(f)) {
      if (l.measured.is_null()) continue;
      const Record r{l.name, l.request, l.measured["peak_allocated_bytes"].get<u64>(), {}};
      const Request q = request_of(r);
      if (!step_setup(q)) continue;
      ++covered;
      const auto m = measured_groups(l.measured);
      auto off = [&](const Estimate& e) {
        const auto g = estimate_groups(e);
        for (size_t i = 0; i < 4; ++i)
          if (std::abs(g[i] - m[i]) > 0.02 * double(r.measured)) return true;
        return false;
      };
      const bool eo = off(estimate_from(q, AllocatedFrom::Engine)), so = off(estimate(q));
      engine_off += eo, schedule_off += so;
      if (so) {
        const auto g = estimate_groups(estimate(q));
        std::printf("  schedule off: %s %s (%s): weights/gradients/states/rest %+.1f %+.1f %+.1f %+.1f %% of the peak\n", f,
                    r.name.c_str(), estimate(q).peak_phase.c_str(), 100 * (g[0] - m[0]) / double(r.measured),
                    100 * (g[1] - m[1]) / double(r.measured), 100 * (g[2] - m[2]) / double(r.measured),
                    100 * (g[3] - m[3]) / double(r.measured));
      }
    }
    std::printf("| %s | %d | %d | %d |\n", f, covered, engine_off, schedule_off);
  }
}
