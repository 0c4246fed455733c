// `memfit validate`: comparison and summary (validate_compare.hpp).
#include "validate_compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

namespace memfit::cli::validate {

namespace {

// How the estimate's components map onto the workload's measured categories.
//
// The workload's tracker (validate/tracker.py) tags a tensor by its role once it has one
// (parameter, buffer, gradient, optimizer_state, kv_cache, input) and otherwise by the phase
// that allocated it: forward -> activation, backward -> backward_temp (checkpointing's
// recomputation included), optimizer step -> optimizer_temp, elsewhere -> other. The estimate
// names a component by what it is, whichever phase allocated it: the saved log-softmax output
// is "logits_loss" in the estimate and "activation" in the tracker, the loss gradients are
// "logits_loss" / "backward_temp", autocast's weight casts "autocast_weight_copies" /
// "activation", DDP's gradient bucket "communication_buffers" / "activation" (it is allocated
// lazily during the first backward/forward), FSDP's gathered units "communication_buffers" /
// "activation" or "backward_temp". So the role-tagged figures compare one to one and every
// phase-tagged one compares as one group. A component not listed here shows up on its own
// ("unmapped: NAME"), so a new name in either side is never silently dropped.
struct Group {
  const char* name;
  std::vector<const char*> estimate;  // estimate per_gpu.breakdown names
  std::vector<const char*> measured;  // workload peak_breakdown categories
};
const std::vector<Group>& groups() {
  static const std::vector<Group> g = {
      {"weights", {"weights", "master_weights"}, {"parameter", "buffer"}},
      {"gradients", {"gradients"}, {"gradient"}},
      {"optimizer_states", {"optimizer_states"}, {"optimizer_state"}},
      {"kv_cache", {"kv_cache"}, {"kv_cache"}},
      {"activations+temporaries",
       {"activations", "autocast_weight_copies", "logits_loss", "temporary_buffers", "communication_buffers"},
       {"activation", "input", "backward_temp", "optimizer_temp", "other"}},
  };
  return g;
}
// CUDA only, outside the tracker's view (each compared on the metric it belongs to):
//   allocated: "cublas_workspace" + "allocator_whole_blocks" <-> torch.cuda peak allocated - tracker peak
//              (workspaces, 512 B rounding, blocks handed out whole)
//   reserved:  "allocator_overhead" <-> max_memory_reserved - max_memory_allocated
//   device:    "cuda_context" + "nccl_buffers" + "paged_optimizer_states" <-> NVML used - reserved

std::vector<Part> compare_parts(const json& breakdown, const json& measured_breakdown) {
  std::map<std::string, double> est, meas;
  for (const json& c : breakdown) est[c.value("name", "")] += num(c, "bytes");
  if (measured_breakdown.is_object())
    for (auto it = measured_breakdown.begin(); it != measured_breakdown.end(); ++it)
      if (it->is_number()) meas[it.key()] += it->get<double>();
  static const std::set<std::string> cuda_only = {"cublas_workspace", "allocator_whole_blocks", "allocator_overhead",
                                                  "cuda_context", "nccl_buffers", "paged_optimizer_states"};
  // The KV cache is written inside the prefill forward, so at a prefill peak the tracker still
  // tags it "activation" (it becomes "kv_cache" after the forward returns): with no "kv_cache"
  // measured at the peak, the estimate's KV cache joins the phase-tagged group.
  if (est.count("kv_cache") && !meas.count("kv_cache")) {
    est["activations"] += est["kv_cache"];
    est.erase("kv_cache");
  }
  std::vector<Part> parts;
  std::set<std::string> used_e, used_m;
  for (const Group& g : groups()) {
    Part p{g.name, 0, 0};
    bool any = false;
    for (const char* n : g.estimate)
      if (auto it = est.find(n); it != est.end()) {
        p.estimate += it->second;
        used_e.insert(n);
        any = true;
      }
    for (const char* n : g.measured)
      if (auto it = meas.find(n); it != meas.end()) {
        p.measured += it->second;
        used_m.insert(n);
        any = true;
      }
    if (any) parts.push_back(p);
  }
  for (const auto& [n, v] : est)
    if (!used_e.count(n) && !cuda_only.count(n)) parts.push_back({"unmapped: " + n, v, 0});
  for (const auto& [n, v] : meas)
    if (!used_m.count(n)) parts.push_back({"unmapped: " + n, 0, v});
  return parts;
}

double est_part(const json& breakdown, std::initializer_list<const char*> names) {
  double s = 0;
  for (const json& c : breakdown)
    for (const char* n : names)
      if (c.value("name", "") == n) s += num(c, "bytes");
  return s;
}

/// The measured categories at the peak, taken from the last top-level phase (step2 rather
/// than step1) that reaches the overall peak: on the first step the optimizer states are born
/// inside step() and still carry the "optimizer_temp" tag, while the estimate describes the
/// steady state, where they are "optimizer_state". Same bytes, truer split.
json steady_breakdown(const json& m) {
  json best = m.contains("peak_breakdown") ? m["peak_breakdown"] : json::object();
  const double peak = num(m, "tracker_peak_bytes", num(m, "peak_allocated_bytes"));
  if (!m.contains("phases") || !m["phases"].is_object()) return best;
  long best_step = -1;
  for (auto it = m["phases"].begin(); it != m["phases"].end(); ++it) {
    const std::string& k = it.key();
    if (k.rfind("step", 0) != 0 || k.find('.') != std::string::npos || !it->is_object() || !it->contains("peak_breakdown"))
      continue;
    const long step = std::strtol(k.c_str() + 4, nullptr, 10);
    if (num(*it, "peak_bytes", -1) == peak && step > best_step) {
      best_step = step;
      best = (*it)["peak_breakdown"];
    }
  }
  return best;
}

Row numeric_row(const std::string& metric, double est, double meas, double tol, std::vector<Part> parts) {
  Row r;
  r.metric = metric;
  r.numeric = true;
  r.estimate = est;
  r.measured = meas;
  r.error_pct = meas > 0 ? 100.0 * (est - meas) / meas : (est > 0 ? 100.0 : 0.0);
  r.over = std::fabs(r.error_pct) > tol;
  for (const Part& p : parts)
    if (!r.has_gap || std::fabs(p.estimate - p.measured) > std::fabs(r.gap.estimate - r.gap.measured)) {
      r.gap = p;
      r.has_gap = true;
    }
  return r;
}

Stats stats_of(const std::vector<const Report*>& reps) {
  Stats s;
  std::vector<double> errs;
  for (const Report* r : reps)
    for (const Row& row : r->rows) {
      if (!row.numeric) continue;
      const double a = std::fabs(row.error_pct);
      errs.push_back(a);
      if (row.over) ++s.over;
      if (errs.size() == 1 || a > s.max) {
        s.max = a;
        s.max_case = r->c->name;
        s.max_metric = row.metric;
      }
    }
  s.rows = errs.size();
  if (!errs.empty()) {
    std::sort(errs.begin(), errs.end());
    const size_t n = errs.size();
    s.median = n % 2 ? errs[n / 2] : (errs[n / 2 - 1] + errs[n / 2]) / 2;
  }
  return s;
}

/// Fills in the report of a case that ran out of memory: a pass when the estimate said it does
/// not fit, a failure when it said it fits.
void fill_oom(Report& rep, const Case& k, const Options& o, const json& e, const json& pg) {
  rep.status = "oom";
  const bool fits = e.value("fits", true);
  rep.failed = fits;
  const std::string on = gib_text(num(pg, "gpu_memory_bytes"));
  rep.note = fits ? "WRONG: the estimate said it fits (" + gib_text(num(pg, "device_total_bytes")) + " of " + on + ")"
                  : "agrees: the estimate said it does not fit (" + gib_text(num(pg, "device_total_bytes")) + " of " + on + ")";
  Row row;
  row.metric = o.device == "cuda" || k.workload.value("device", "") == "cuda" ? "device (NVML)" : "peak allocated";
  row.measured_text = "OOM";
  row.estimate = num(pg, "device_total_bytes");
  row.note = rep.note;
  rep.rows.push_back(row);
}

/// Fills in the report of a case with nothing to compare (no result line, an unsupported setup,
/// an out-of-memory or an error) and returns true; returns false when the case was measured.
bool fill_unmeasured(Report& rep, const Case& k, const Options& o, const json& e, const json& pg) {
  if (k.results.empty()) {
    rep.status = "error";
    rep.failed = true;
    rep.note = k.run_error.empty() ? "no result line for this case" : k.run_error;
    return true;
  }
  for (const json& r : k.results)
    if (r.value("unsupported", false)) {
      rep.status = "unsupported";
      rep.note = str(r, "error");
      return true;
    }
  for (const json& r : k.results)
    if (r.value("oom", false)) {
      fill_oom(rep, k, o, e, pg);
      return true;
    }
  for (const json& r : k.results)
    if (r.contains("error")) {
      rep.status = "error";
      rep.failed = true;
      rep.note = str(r, "error");
      return true;
    }
  return false;
}

/// A case the core refuses (memfit::Rejected): "refused" when the run failed too (the two agree),
/// a failure when it ran, as there memfit refused a run that works.
Report refused_report(const Case& k) {
  Report rep;
  rep.c = &k;
  rep.status = "error";
  rep.failed = true;
  if (k.results.empty()) {
    rep.note = "memfit refuses it (" + first_line(k.refused, 100) + "); " +
               (k.run_error.empty() ? std::string("no result line for this case") : k.run_error);
    return rep;
  }
  for (const json& r : k.results)
    if (r.value("unsupported", false)) {
      rep.status = "unsupported";
      rep.failed = false;
      rep.note = str(r, "error");
      return rep;
    }
  for (const json& r : k.results)
    if (r.contains("error") || r.value("oom", false)) {
      rep.status = "refused";
      rep.failed = false;
      rep.note = "memfit refuses it, and the run failed: " + first_line(str(r, "error", "out of memory"), 160);
      return rep;
    }
  rep.note = "the run completed, but memfit refuses it: " + first_line(k.refused, 100);
  return rep;
}

// The busiest rank (the estimate describes the busiest one).
const json& busiest_rank(const std::vector<json>& results) {
  const json* top = &results.front();
  for (const json& r : results)
    if (num(r["measured"], "peak_allocated_bytes") > num((*top)["measured"], "peak_allocated_bytes")) top = &r;
  return *top;
}

/// The largest figure KEY that any rank measured, or -1 when none did.
double max_over_ranks(const std::vector<json>& results, const char* key) {
  double v = -1;
  for (const json& r : results)
    if (r.contains("measured") && r["measured"].contains(key) && r["measured"][key].is_number())
      v = std::max(v, r["measured"][key].get<double>());
  return v;
}

/// The CUDA rows (allocated, reserved, device): each metric's parts are the previous metric's
/// plus the component that this metric adds (see the CUDA-only list above `compare_parts`).
void add_cuda_rows(Report& rep, const Case& k, const Options& o, const json& pg, const json& bd, const json& m,
                   const std::vector<Part>& parts) {
  const double alloc = max_over_ranks(k.results, "cuda_peak_allocated_bytes");
  const double reserved = max_over_ranks(k.results, "cuda_peak_reserved_bytes");
  const double nvml = max_over_ranks(k.results, "nvml_peak_used_bytes");
  std::vector<Part> pa = parts;
  if (m.contains("tracker_peak_bytes"))
    pa.push_back({"cublas_workspace+rounding", est_part(bd, {"cublas_workspace", "allocator_whole_blocks"}),
                  alloc - num(m, "tracker_peak_bytes")});
  rep.rows.push_back(numeric_row("allocated", num(pg, "allocated_peak_bytes"), alloc, o.tolerance, pa));
  std::vector<Part> pr = pa;
  pr.push_back({"allocator_overhead", est_part(bd, {"allocator_overhead"}), reserved - alloc});
  rep.rows.push_back(numeric_row("reserved", num(pg, "reserved_peak_bytes"), reserved, o.tolerance, pr));
  if (nvml > 0) {
    std::vector<Part> pd = pr;
    pd.push_back({"outside_allocator", est_part(bd, {"cuda_context", "nccl_buffers", "paged_optimizer_states"}), nvml - reserved});
    rep.rows.push_back(numeric_row("device (NVML)", num(pg, "device_total_bytes"), nvml, o.tolerance, pd));
  } else {
    Row r;
    r.metric = "device (NVML)";
    r.estimate = num(pg, "device_total_bytes");
    r.measured_text = "n/a";
    r.note = "NVML unavailable in the workload's Python (pip install nvidia-ml-py)";
    rep.rows.push_back(r);
  }
}

}  // namespace

Report compare(const Case& k, const Options& o) {
  if (!k.refused.empty()) return refused_report(k);
  Report rep;
  rep.c = &k;
  const json& e = k.estimate;
  const json& pg = e["per_gpu"];
  const json& bd = pg["breakdown"];
  if (fill_unmeasured(rep, k, o, e, pg)) return rep;
  rep.status = "ok";
  const json& top = busiest_rank(k.results);
  if (top.contains("rank")) rep.rank = top["rank"].get<int>();
  const json& m = top["measured"];
  const bool cuda = top.contains("environment") && str(top["environment"], "device") == "cuda";
  std::vector<Part> parts = compare_parts(bd, steady_breakdown(m));
  rep.parts = parts;
  if (!cuda) {
    rep.rows.push_back(numeric_row("peak allocated", num(pg, "allocated_peak_bytes"), num(m, "peak_allocated_bytes"),
                                   o.tolerance, parts));
    return rep;
  }
  add_cuda_rows(rep, k, o, pg, bd, m, parts);
  return rep;
}

Summary summarise(const std::vector<Report>& reps) {
  Summary s;
  s.cases = reps.size();
  std::vector<const Report*> all;
  std::vector<std::string> fams, metrics;
  for (const Report& r : reps) {
    all.push_back(&r);
    if (std::find(fams.begin(), fams.end(), r.c->family) == fams.end()) fams.push_back(r.c->family);
    for (const Row& row : r.rows)
      if (row.numeric && std::find(metrics.begin(), metrics.end(), row.metric) == metrics.end()) metrics.push_back(row.metric);
    if (std::any_of(r.rows.begin(), r.rows.end(), [](const Row& row) { return row.over; })) ++s.cases_over;
    if (r.status == "ok") ++s.ok;
    else if (r.status == "unsupported") {
      ++s.unsupported;
      ++s.unsupported_reasons[first_line(r.note, 100)];
    } else if (r.status == "oom") (r.failed ? s.oom_wrong : s.oom_agree)++;
    else if (r.status == "refused") ++s.refused_agree;
    else ++s.errors;
  }
  s.all = stats_of(all);
  for (const std::string& f : fams) {
    std::vector<const Report*> v;
    for (const Report& r : reps)
      if (r.c->family == f) v.push_back(&r);
    s.by_family.emplace_back(f, stats_of(v));
  }
  if (metrics.size() > 1)
    for (const std::string& mname : metrics) {
      Stats st;
      std::vector<double> errs;
      for (const Report& r : reps)
        for (const Row& row : r.rows)
          if (row.numeric && row.metric == mname) {
            errs.push_back(std::fabs(row.error_pct));
            st.over += row.over;
            if (std::fabs(row.error_pct) >= st.max) {
              st.max = std::fabs(row.error_pct);
              st.max_case = r.c->name;
            }
          }
      std::sort(errs.begin(), errs.end());
      st.rows = errs.size();
      if (!errs.empty()) st.median = errs.size() % 2 ? errs[errs.size() / 2] : (errs[errs.size() / 2 - 1] + errs[errs.size() / 2]) / 2;
      s.by_metric.emplace_back(mname, st);
    }
  const bool failed = std::any_of(reps.begin(), reps.end(), [](const Report& r) { return r.failed; });
  s.exit_code = (s.all.over > 0 || failed || (s.all.rows == 0 && s.refused_agree == 0)) ? kFail : kPass;
  return s;
}

}  // namespace memfit::cli::validate
