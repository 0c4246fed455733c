// `memfit validate`: the outputs (validate_report.hpp).
#include "validate_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "validate_allocator.hpp"
#include "validate_compare.hpp"
#include "validate_tensors.hpp"

namespace memfit::cli::validate {

namespace {

struct Unit {
  double div;
  const char* name;
};
Unit unit_for(const std::vector<Report>& reps) {
  double mx = 0;
  for (const Report& r : reps)
    for (const Row& row : r.rows)
      if (row.numeric) mx = std::max({mx, row.estimate, row.measured});
  if (mx >= 10.0 * 1073741824.0) return {1073741824.0, "GiB"};
  return {1048576.0, "MiB"};
}

std::string fmt(double v, const char* f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string bytes_in(double b, const Unit& u) { return fmt(b / u.div, "%.3f"); }
std::string signed_bytes(double b, const Unit& u) { return fmt(b / u.div, "%+.3f"); }

std::string gap_text(const Row& row, const Unit& u) {
  if (!row.has_gap) return row.note;
  if (row.gap.estimate == row.gap.measured) return "none: every component matches";
  const double d = row.gap.estimate - row.gap.measured;
  const std::string diff = std::fabs(d) < 0.0005 * u.div ? fmt(d, "%+.0f") + " B" : signed_bytes(d, u) + " " + u.name;
  return row.gap.name + " " + diff + " (" +
         bytes_in(row.gap.estimate, u) + " vs " + bytes_in(row.gap.measured, u) + ")";
}

std::string header_line(const std::vector<Case>& cases, const Options& o, const std::string& source) {
  std::set<std::string> envs;
  for (const Case& k : cases)
    for (const json& r : k.results)
      if (r.contains("environment") && r["environment"].is_object()) {
        const json& e = r["environment"];
        std::string s = str(e, "device", "?") + ": torch " + str(e, "torch", "?") + ", transformers " + str(e, "transformers", "?");
        if (e.contains("peft") && e["peft"].is_string()) s += ", peft " + e["peft"].get<std::string>();
        if (e.contains("gpu_name")) s += ", " + str(e, "gpu_name") + " (" + gib_text(num(e, "gpu_total_bytes")) + ")";
        envs.insert(s);
      }
  std::string h = "memfit validate (" + source + "): " + std::to_string(cases.size()) + " case" + (cases.size() == 1 ? "" : "s");
  for (const std::string& e : envs) h += "; " + e;
  return h + "; tolerance " + fmt(o.tolerance, "%g") + " %";
}

void print_table(const std::vector<Report>& reps, const Summary& s, const Options& o, const std::string& header) {
  const Unit u = unit_for(reps);
  size_t w = 4;
  for (const Report& r : reps) w = std::max(w, r.c->name.size());
  std::printf("%s\n\n", header.c_str());
  std::printf("%-*s  %-14s %12s %12s %9s  %s\n", static_cast<int>(w), "case", "metric", (std::string("estimate ") + u.name).c_str(),
              (std::string("measured ") + u.name).c_str(), "error %", "largest gap: component, estimate - measured (estimate vs measured)");
  for (const Report& r : reps) {
    const char* name = r.c->name.c_str();
    if (r.rows.empty()) {
      std::printf("%-*s  %-14s %12s %12s %9s  %s\n", static_cast<int>(w), name, "-", "-", r.status.c_str(), "-",
                  first_line(r.note, 140).c_str());
      continue;
    }
    for (const Row& row : r.rows) {
      if (row.numeric)
        std::printf("%-*s  %-14s %12s %12s %8s%s  %s\n", static_cast<int>(w), name, row.metric.c_str(), bytes_in(row.estimate, u).c_str(),
                    bytes_in(row.measured, u).c_str(), fmt(row.error_pct, "%+.2f").c_str(), row.over ? "!" : " ",
                    gap_text(row, u).c_str());
      else
        std::printf("%-*s  %-14s %12s %12s %9s  %s\n", static_cast<int>(w), name, row.metric.c_str(), bytes_in(row.estimate, u).c_str(),
                    row.measured_text.c_str(), "-", first_line(row.note, 140).c_str());
    }
  }
  bool first = true;
  for (const Report& r : reps)
    if (r.status == "error" && r.note.find('\n') != std::string::npos) {
      if (first) std::printf("\nerrors:\n");
      first = false;
      std::string note = r.note;
      for (size_t p = 0; (p = note.find('\n', p)) != std::string::npos; p += 5) note.replace(p, 1, "\n    ");
      std::printf("  %s: %s\n", r.c->name.c_str(), note.c_str());
    }
  std::printf("\nerror %% = (estimate - measured) / measured; ! = over the %g %% tolerance. CPU: peak allocated = the "
              "live-tensor peak; CUDA: torch.cuda max_memory_allocated / max_memory_reserved / NVML device used.\n",
              o.tolerance);
  std::printf("\n%zu cases: %zu compared, %zu unsupported, %zu OOM (%zu as estimated, %zu not), %zu errors", s.cases, s.ok,
              s.unsupported, s.oom_agree + s.oom_wrong, s.oom_agree, s.oom_wrong, s.errors);
  if (s.refused_agree) std::printf(", %zu refused by memfit and failed when run", s.refused_agree);
  std::printf("\n");
  for (const auto& [reason, n] : s.unsupported_reasons) std::printf("  unsupported (%zu): %s\n", n, reason.c_str());
  if (s.all.rows)
    std::printf("|error|: max %.2f %% (%s, %s), median %.2f %%; %zu of %zu figures (%zu of %zu cases) over the %g %% tolerance\n",
                s.all.max, s.all.max_case.c_str(), s.all.max_metric.c_str(), s.all.median, s.all.over, s.all.rows, s.cases_over,
                s.ok, o.tolerance);
  for (const auto& [mname, st] : s.by_metric)
    std::printf("  %-14s max %.2f %% (%s), median %.2f %%, %zu over\n", mname.c_str(), st.max, st.max_case.c_str(), st.median, st.over);
  const bool families = std::any_of(s.by_family.begin(), s.by_family.end(), [](const auto& f) { return f.second.rows > 1; });
  if (s.by_family.size() > 1 && families) {
    std::printf("\n%-16s %7s %9s %9s %6s\n", "family", "figures", "max %", "median %", "over");
    for (const auto& [f, st] : s.by_family)
      if (st.rows) std::printf("%-16s %7zu %9.2f %9.2f %6zu\n", f.c_str(), st.rows, st.max, st.median, st.over);
  }
  std::printf("\n%s\n", s.exit_code == kPass ? "PASS" : "FAIL");
}

std::string md_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '|') o += "\\|";
    else if (c == '\n') o += ' ';
    else o += c;
  }
  return o;
}

void print_markdown(const std::vector<Report>& reps, const Summary& s, const Options& o, const std::string& header) {
  const Unit u = unit_for(reps);
  std::printf("%s\n\n", md_escape(header).c_str());
  std::printf("| case | metric | estimate (%s) | measured (%s) | error %% | largest gap |\n|---|---|---:|---:|---:|---|\n", u.name, u.name);
  for (const Report& r : reps) {
    const std::string name = md_escape(r.c->name);
    if (r.rows.empty()) {
      std::printf("| %s | - | - | %s | - | %s |\n", name.c_str(), r.status.c_str(), md_escape(first_line(r.note, 200)).c_str());
      continue;
    }
    for (const Row& row : r.rows) {
      if (row.numeric)
        std::printf("| %s | %s | %s | %s | %s%s | %s |\n", name.c_str(), row.metric.c_str(), bytes_in(row.estimate, u).c_str(),
                    bytes_in(row.measured, u).c_str(), fmt(row.error_pct, "%+.2f").c_str(), row.over ? " **!**" : "",
                    md_escape(gap_text(row, u)).c_str());
      else
        std::printf("| %s | %s | %s | %s | - | %s |\n", name.c_str(), row.metric.c_str(), bytes_in(row.estimate, u).c_str(),
                    row.measured_text.c_str(), md_escape(first_line(row.note, 200)).c_str());
    }
  }
  std::printf("\nerror %% = (estimate − measured) / measured; **!** = over the %g %% tolerance.\n\n", o.tolerance);
  std::printf("- cases: %zu (%zu compared, %zu unsupported, %zu OOM as estimated, %zu OOM not as estimated, %zu errors", s.cases,
              s.ok, s.unsupported, s.oom_agree, s.oom_wrong, s.errors);
  if (s.refused_agree) std::printf(", %zu refused by memfit and failed when run", s.refused_agree);
  std::printf(")\n");
  if (s.all.rows)
    std::printf("- |error|: max %.2f %% (`%s`, %s), median %.2f %%; %zu of %zu figures (%zu of %zu cases) over the tolerance\n",
                s.all.max, md_escape(s.all.max_case).c_str(), s.all.max_metric.c_str(), s.all.median, s.all.over, s.all.rows,
                s.cases_over, s.ok);
  for (const auto& [mname, st] : s.by_metric)
    std::printf("- %s: max %.2f %%, median %.2f %%, %zu over\n", mname.c_str(), st.max, st.median, st.over);
  if (s.by_family.size() > 1 && std::any_of(s.by_family.begin(), s.by_family.end(), [](const auto& f) { return f.second.rows > 1; })) {
    std::printf("\n| family | figures | max %% | median %% | over |\n|---|---:|---:|---:|---:|\n");
    for (const auto& [f, st] : s.by_family)
      if (st.rows) std::printf("| %s | %zu | %.2f | %.2f | %zu |\n", f.c_str(), st.rows, st.max, st.median, st.over);
  }
  std::printf("\n**%s**\n", s.exit_code == kPass ? "PASS" : "FAIL");
}

json stats_json(const Stats& s) {
  return {{"figures", s.rows}, {"over_tolerance", s.over}, {"max_abs_error_pct", s.max},
          {"median_abs_error_pct", s.median}, {"max_case", s.max_case}};
}

json trace_replays_json(const std::vector<TraceReplay>& rows) {
  json out = json::array();
  for (const TraceReplay& r : rows) {
    json x = {{"case", r.c->name}, {"trace", r.source}, {"events", r.events}, {"live_peak_bytes", r.live_peak},
              {"replayed_allocated_peak_bytes", r.replay_allocated}, {"replayed_reserved_peak_bytes", r.replay_reserved},
              {"fragmentation_at_reserved_peak_bytes", r.fragmentation}, {"error_pct", r.error_pct}};
    if (r.measured_reserved > 0) x["measured_reserved_peak_bytes"] = r.measured_reserved;
    else x["estimate_reserved_bytes"] = r.estimate_reserved;
    out.push_back(x);
  }
  return out;
}

void print_json(const std::vector<Report>& reps, const Summary& s, const Options& o, const std::string& source,
                const std::vector<TraceReplay>& traces) {
  json cases = json::array();
  for (const Report& r : reps) {
    const Case& k = *r.c;
    json c = {{"name", k.name}, {"family", k.family}, {"status", r.status}, {"failed", r.failed}, {"ranks", k.nproc}};
    if (!k.refused.empty()) {
      c["estimate"] = {{"refused", k.refused}};
    } else {
      const json& pg = k.estimate["per_gpu"];
      c["estimate"] = {{"allocated_peak_bytes", pg["allocated_peak_bytes"]},
                       {"reserved_peak_bytes", pg["reserved_peak_bytes"]},
                       {"device_total_bytes", pg["device_total_bytes"]},
                       {"gpu_memory_bytes", pg["gpu_memory_bytes"]},
                       {"fits", k.estimate["fits"]},
                       {"peak_phase", k.estimate["peak_phase"]},
                       {"breakdown", pg["breakdown"]}};
    }
    if (!r.note.empty()) c["note"] = r.note;
    if (r.rank >= 0) c["rank"] = r.rank;
    json rows = json::array();
    for (const Row& row : r.rows) {
      json x = {{"metric", row.metric}, {"estimate_bytes", row.estimate}};
      if (row.numeric) {
        x["measured_bytes"] = row.measured;
        x["error_pct"] = row.error_pct;
        x["within_tolerance"] = !row.over;
      } else {
        x["measured"] = row.measured_text;
      }
      if (row.has_gap)
        x["largest_gap"] = {{"component", row.gap.name}, {"estimate_bytes", row.gap.estimate}, {"measured_bytes", row.gap.measured}};
      if (!row.note.empty()) x["note"] = row.note;
      rows.push_back(x);
    }
    c["rows"] = rows;
    json parts = json::array();
    for (const Part& p : r.parts) parts.push_back({{"component", p.name}, {"estimate_bytes", p.estimate}, {"measured_bytes", p.measured}});
    c["components"] = parts;
    if (!k.results.empty() && k.results.front().contains("environment")) c["environment"] = k.results.front()["environment"];
    cases.push_back(c);
  }
  json fam = json::object();
  for (const auto& [f, st] : s.by_family) fam[f] = stats_json(st);
  json met = json::object();
  for (const auto& [mname, st] : s.by_metric) met[mname] = stats_json(st);
  json j = {{"source", source},
            {"tolerance_pct", o.tolerance},
            {"cases", cases},
            {"summary",
             {{"cases", s.cases},
              {"compared", s.ok},
              {"unsupported", s.unsupported},
              {"oom_as_estimated", s.oom_agree},
              {"oom_not_as_estimated", s.oom_wrong},
              {"errors", s.errors},
              {"refused_as_run", s.refused_agree},
              {"cases_over_tolerance", s.cases_over},
              {"all", stats_json(s.all)},
              {"by_family", fam},
              {"by_metric", met},
              {"pass", s.exit_code == kPass}}}};
  if (!traces.empty()) j["trace_replays"] = trace_replays_json(traces);
  std::printf("%s\n", j.dump(2).c_str());
}

}  // namespace

int report_all(const std::vector<Case>& cases, const Options& o, const std::string& source) {
  std::vector<Report> reps;
  reps.reserve(cases.size());
  for (const Case& k : cases) reps.push_back(compare(k, o));
  const Summary s = summarise(reps);
  const std::vector<TraceReplay> traces = replay_traces(cases);
  if (o.format == Format::Json) print_json(reps, s, o, source, traces);
  else if (o.format == Format::Markdown) print_markdown(reps, s, o, header_line(cases, o, source));
  else print_table(reps, s, o, header_line(cases, o, source));
  if (o.format != Format::Json) print_trace_replays(traces, o.format == Format::Markdown, o.reserved_tolerance);
  // --tensors: a covered family's mismatch that the --known file does not explain fails the run
  const bool tensors_fail = o.tensors && o.format != Format::Json &&
                            print_tensor_report(compare_tensors(cases), o.known_path, o.format == Format::Markdown) > 0;
  std::fflush(stdout);
  return tensors_fail ? std::max(s.exit_code, kFail) : s.exit_code;
}

int dry_run(const Options& o, const std::vector<Case>& cases, const std::vector<Job>& jobs, const std::string& python,
            const std::string& python_from, const std::string& workload, const std::string& root, const json& gpu) {
  if (o.format == Format::Json) {
    json j = {{"device", o.device}, {"python", python}, {"python_from", python_from}, {"workload", workload}, {"cwd", root}};
    json cmds = json::array();
    for (const Job& job : jobs) {
      json names = json::array();
      json body = json::array();
      for (size_t i : job.cases) {
        names.push_back(cases[i].name);
        body.push_back(cases[i].workload);
      }
      cmds.push_back({{"tag", job.tag}, {"argv", job.argv}, {"command", command_line(job)}, {"ranks", job.nproc},
                      {"cases_file", job.in_path}, {"cases", names}, {"cases_file_content", body}});
    }
    j["commands"] = cmds;
    json cs = json::array();
    for (const Case& k : cases)
      cs.push_back({{"name", k.name}, {"ranks", k.nproc}, {"request", k.request},
                    {"estimate", k.refused.empty() ? k.estimate : json{{"refused", k.refused}}}});
    j["cases"] = cs;
    std::printf("%s\n", j.dump(2).c_str());
    return kPass;
  }
  std::printf("memfit validate --dry-run: nothing runs. %zu case%s on %s.\n", cases.size(), cases.size() == 1 ? "" : "s",
              o.device.c_str());
  std::printf("python:   %s (%s)\n", python.empty() ? "NOT FOUND" : python.c_str(), python_from.c_str());
  std::printf("workload: %s\n", workload.empty() ? "NOT FOUND" : workload.c_str());
  if (o.device == "cuda") {
    if (gpu.is_null())
      std::printf("GPU for the fits verdict: each case's \"gpu\", else %s (the core's default); a real run uses the GPU "
                  "the workload reports. Pass --gpu NAME|GIB to check another.\n",
                  "A100-80GB");
    else std::printf("GPU for the fits verdict: %s (--gpu)\n", gpu.contains("name") ? gpu["name"].get<std::string>().c_str()
                                                                                  : gib_text(num(gpu, "memory_gib") * 1073741824.0).c_str());
  }
  std::printf("\ncommands, run from %s (case files are written to %s):\n", root.c_str(),
              o.work_dir.empty() ? "a temporary directory, shown as $TMP" : o.work_dir.c_str());
  for (const Job& job : jobs) {
    std::string names;
    for (size_t n = 0; n < job.cases.size() && n < 3; ++n) names += (n ? ", " : "") + cases[job.cases[n]].name;
    if (job.cases.size() > 3) names += ", ... (" + std::to_string(job.cases.size()) + " cases)";
    std::printf("  %s\n      # %s\n", command_line(job).c_str(), names.c_str());
  }
  size_t w = 4;
  for (const Case& k : cases) w = std::max(w, k.name.size());
  const bool cuda = o.device == "cuda";
  double mx = 0;
  for (const Case& k : cases)
    if (k.refused.empty()) mx = std::max(mx, num(k.estimate["per_gpu"], "device_total_bytes"));
  const Unit u = mx >= 10.0 * 1073741824.0 ? Unit{1073741824.0, "GiB"} : Unit{1048576.0, "MiB"};
  std::printf("\n%-*s %5s %14s %14s %14s  %-14s %s\n", static_cast<int>(w), "case", "ranks",
              (std::string("allocated ") + u.name).c_str(), (std::string("reserved ") + u.name).c_str(),
              (std::string("device ") + u.name).c_str(), "peak phase", cuda ? "fits" : "");
  for (const Case& k : cases) {
    if (!k.refused.empty()) {
      std::printf("%-*s %5d  refused: %s\n", static_cast<int>(w), k.name.c_str(), k.nproc, first_line(k.refused, 120).c_str());
      continue;
    }
    const json& pg = k.estimate["per_gpu"];
    std::string fits;
    if (cuda)
      fits = std::string(k.estimate.value("fits", false) ? "fits" : "DOES NOT FIT") + " (" +
             gib_text(num(pg, "gpu_memory_bytes")) + ")";
    std::printf("%-*s %5d %14.3f %14.3f %14.3f  %-14s %s\n", static_cast<int>(w), k.name.c_str(), k.nproc,
                num(pg, "allocated_peak_bytes") / u.div, num(pg, "reserved_peak_bytes") / u.div,
                num(pg, "device_total_bytes") / u.div, str(k.estimate, "peak_phase").c_str(), fits.c_str());
  }
  if (!cuda) std::printf("\n(CPU estimates: no CUDA context, workspace or caching-allocator overhead, so reserved = device = allocated)\n");
  if (python.empty()) std::printf("\nnote: no Python found; %s\n", kSetupHint);
  return kPass;
}

}  // namespace memfit::cli::validate
