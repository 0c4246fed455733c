// `memfit validate`: allocation traces through the allocator simulation (validate_allocator.hpp).
#include "validate_allocator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "memfit/allocator.hpp"
#include "memfit/api.hpp"
#include "validate_cases.hpp"

namespace memfit::cli::validate {

namespace {

std::vector<std::int64_t> trace_of(const json& m, const char* key) {
  std::vector<std::int64_t> t;
  if (!m.contains(key) || !m[key].is_array()) return t;
  t.reserve(m[key].size());
  for (const json& v : m[key])
    if (v.is_number_integer()) t.push_back(v.get<std::int64_t>());
  return t;
}

double live_peak_of(const std::vector<std::int64_t>& t) {
  std::vector<std::int64_t> sizes;
  double live = 0, peak = 0;
  for (std::int64_t v : t) {
    if (v > 0) {
      sizes.push_back(v);
      live += static_cast<double>(v);
      peak = std::max(peak, live);
    } else if (v < 0 && static_cast<size_t>(-v - 1) < sizes.size()) {
      live -= static_cast<double>(sizes[static_cast<size_t>(-v - 1)]);
    }
  }
  return peak;
}

/// Today's estimate of reserved memory for this workload on CUDA, on the CPU trace's terms: the
/// case's own (CPU) allocated estimate plus the allocator overhead the CUDA estimate of the
/// same request adds. The CUDA-only parts (cuBLAS workspace, context) are not in a CPU trace.
double estimate_reserved(const Case& k) {
  const json e = json::parse(memfit::estimate_json(core_request(k.workload, "cuda", nullptr).dump()));
  double overhead = 0;
  if (e.contains("per_gpu"))
    for (const json& c : e["per_gpu"]["breakdown"])
      if (str(c, "name") == "allocator_overhead") overhead += num(c, "bytes");
  return num(k.estimate["per_gpu"], "allocated_peak_bytes") + overhead;
}

bool replay_one(const Case& k, const json& result, const char* key, TraceReplay& row) {
  if (!result.contains("measured")) return false;
  const std::vector<std::int64_t> t = trace_of(result["measured"], key);
  if (t.empty()) return false;
  const alloc::Result r = alloc::simulate(alloc::events_from_signed(t));
  row.c = &k;
  row.events = t.size();
  row.live_peak = live_peak_of(t);
  row.replay_allocated = static_cast<double>(r.stats.peak_allocated);
  row.replay_reserved = static_cast<double>(r.stats.peak_reserved);
  row.fragmentation = static_cast<double>(alloc::fragmentation_at_peak(r.stats));
  return true;
}

}  // namespace

std::vector<TraceReplay> replay_traces(const std::vector<Case>& cases) {
  std::vector<TraceReplay> rows;
  for (const Case& k : cases) {
    if (k.estimate.is_null()) continue;
    TraceReplay cpu, cuda;  // the busiest rank of each kind
    for (const json& r : k.results) {
      TraceReplay t;
      if (replay_one(k, r, "allocation_trace", t) && t.replay_reserved > cpu.replay_reserved) cpu = t;
      TraceReplay g;
      if (replay_one(k, r, "cuda_allocation_trace", g) && g.replay_reserved > cuda.replay_reserved) {
        g.measured_reserved = num(r["measured"], "cuda_peak_reserved_bytes", -1);
        cuda = g;
      }
    }
    if (cpu.c) {
      cpu.source = "cpu tracker";
      cpu.estimate_reserved = estimate_reserved(k);
      cpu.error_pct = 100.0 * (cpu.estimate_reserved - cpu.replay_reserved) / cpu.replay_reserved;
      rows.push_back(cpu);
    }
    if (cuda.c && cuda.measured_reserved > 0) {
      cuda.source = "cuda history";
      cuda.error_pct = 100.0 * (cuda.replay_reserved - cuda.measured_reserved) / cuda.measured_reserved;
      rows.push_back(cuda);
    }
  }
  return rows;
}

size_t print_trace_replays(const std::vector<TraceReplay>& rows, bool markdown, double tolerance) {
  if (rows.empty()) return 0;
  size_t w = 4, over = 0;
  for (const TraceReplay& r : rows) w = std::max(w, r.c->name.size());
  const double mib = 1048576.0;
  std::vector<double> errs;
  std::printf(markdown ? "\n### Reserved memory: allocation traces replayed through the caching-allocator simulation\n\n"
                       : "\nreserved memory: allocation traces replayed through the caching-allocator simulation (MiB)\n\n");
  if (markdown)
    std::printf("| case | trace | events | live peak | replayed allocated | replayed reserved | fragmentation | reference "
                "| compared | error %% |\n|---|---|---:|---:|---:|---:|---:|---|---:|---:|\n");
  else
    std::printf("%-*s  %-12s %8s %10s %10s %10s %10s  %-9s %10s %9s\n", static_cast<int>(w), "case", "trace", "events",
                "live peak", "replay al", "replay res", "frag", "reference", "compared", "error %");
  for (const TraceReplay& r : rows) {
    const bool cuda = r.measured_reserved > 0;
    const double compared = cuda ? r.measured_reserved : r.estimate_reserved;
    const bool bad = std::fabs(r.error_pct) > tolerance;
    over += bad;
    errs.push_back(std::fabs(r.error_pct));
    const char* ref = cuda ? "measured" : "estimate";
    if (markdown)
      std::printf("| %s | %s | %zu | %.3f | %.3f | %.3f | %.3f | %s | %.3f | %+.2f%s |\n", r.c->name.c_str(), r.source.c_str(),
                  r.events, r.live_peak / mib, r.replay_allocated / mib, r.replay_reserved / mib, r.fragmentation / mib, ref,
                  compared / mib, r.error_pct, bad ? " **!**" : "");
    else
      std::printf("%-*s  %-12s %8zu %10.3f %10.3f %10.3f %10.3f  %-9s %10.3f %+8.2f%s\n", static_cast<int>(w), r.c->name.c_str(),
                  r.source.c_str(), r.events, r.live_peak / mib, r.replay_allocated / mib, r.replay_reserved / mib,
                  r.fragmentation / mib, ref, compared / mib, r.error_pct, bad ? "!" : "");
  }
  std::sort(errs.begin(), errs.end());
  const double median = errs.size() % 2 ? errs[errs.size() / 2] : (errs[errs.size() / 2 - 1] + errs[errs.size() / 2]) / 2;
  std::printf("\n%serror %% = (estimate - replayed reserved) / replayed reserved for CPU traces (estimate: the case's allocated "
              "estimate + the CUDA estimate's allocator_overhead); (replayed - measured) / measured for CUDA traces. "
              "%zu traces, max |error| %.2f %%, median %.2f %%, %zu over %g %% (not part of the PASS/FAIL gate)\n",
              markdown ? "" : "", rows.size(), errs.back(), median, over, tolerance);
  return over;
}

}  // namespace memfit::cli::validate
