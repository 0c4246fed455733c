// `memfit validate`: estimate each case with the core, measure it with the Python workload
// (validate/workload.py: real PyTorch + transformers training steps), compare.
//
//   memfit validate CASES.json --device cpu|cuda [--launcher CMD] [--python PATH] [--json|--markdown]
//                   [--record FILE] [--filter SUBSTRING]... [--tolerance PCT] [--dry-run]
//   memfit validate --replay FILE [--json|--markdown] [--filter SUBSTRING]... [--tolerance PCT]
//                   [--tensors [--known FILE]]
//
// CASES.json is a list of memfit requests, or {"cases": [...], "defaults": {...}} like
// data/validation/cpu_suite.json, with the workload's extensions (name, steps, seed, measure,
// model.config_path / model.source). Exit status: 0 every compared figure within the tolerance
// (and no case failed); 1 otherwise; 2 bad input or environment (the message says what to fix).
#include "validate_command.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "memfit/api.hpp"
#include "validate_cases.hpp"
#include "validate_common.hpp"
#include "validate_process.hpp"
#include "validate_report.hpp"
#include "validate_runner.hpp"

namespace memfit::cli {

namespace {

using namespace validate;
namespace fs = std::filesystem;

int usage() {
  std::fprintf(stderr,
               "usage: memfit validate CASES.json --device cpu|cuda [options]\n"
               "       memfit validate --replay RECORD.jsonl [--json|--markdown] [--filter S] [--tolerance PCT]\n"
               "                       [--tensors [--known FILE]]\n"
               "options:\n"
               "  --device cpu|cuda     where the workload runs (required unless --replay)\n"
               "  --python PATH         Python with torch, transformers, peft (default: $MEMFIT_PYTHON, the venv of\n"
               "                        scripts/setup.sh python at ${MEMFIT_VENV:-~/.cache/memfit/venv}, python3)\n"
               "  --launcher CMD        launcher for distributed cases, e.g. \"torchrun --nproc-per-node 4\";\n"
               "                        {nproc} is replaced by the case's rank count (default: PYTHON -m\n"
               "                        torch.distributed.run --standalone --nproc-per-node N)\n"
               "  --filter S            only cases whose name contains S (repeatable: any of them)\n"
               "  --tolerance PCT       largest |error| that passes (default 2)\n"
               "  --record FILE         append the measurements (JSON lines, with the full case) for --replay\n"
               "  --dry-run             print the commands, cases and estimates; run nothing\n"
               "  --trace               record each case's allocation trace and replay it through the simulated\n"
               "                        CUDA caching allocator (a reserved-memory table after the report)\n"
               "  --tensors             record each layer's tensors and compare them, tensor by tensor, with the core's\n"
               "                        lists (with --replay: the record's tensors; a table after the report)\n"
               "  --known FILE          with --tensors: mismatches that are understood (\"FAMILIES LIST KIND WHAT\" a\n"
               "                        line, FAMILIES * or a,b; # comments); any other mismatch of a family the\n"
               "                        lists cover fails the run\n"
               "  --gpu NAME|GIB        GPU for the fits verdict when the case names none (dry runs; CUDA runs\n"
               "                        otherwise use the GPU the workload reports)\n"
               "  --json | --markdown   output format (default: a text table)\n"
               "  --jobs N              workload processes at once (CPU; default: the core count, at most 8)\n"
               "  --timeout S           seconds per workload process (default 3600)\n"
               "  --work-dir DIR        keep the case batches and raw outputs in DIR (default: a temporary dir)\n"
               "  --workload PATH       validate/workload.py (default: found from the current or memfit's directory)\n"
               "  --verbose | --quiet   copy the workload's log to stderr | no progress lines\n");
  return kUsage;
}

// ------------------------------------------------------------------------------- entry

Options parse_args(const std::vector<std::string>& args) {
  Options o;
  auto value = [&](size_t& i, const std::string& a, const std::string& name) -> std::string {
    if (a.size() > name.size() && a.compare(0, name.size() + 1, name + "=") == 0) return a.substr(name.size() + 1);
    if (i + 1 >= args.size()) throw Fatal(name + " needs a value", kUsage);
    return args[++i];
  };
  auto is = [](const std::string& a, const std::string& name) { return a == name || a.rfind(name + "=", 0) == 0; };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") o.format = Format::Json;
    else if (a == "--markdown") o.format = Format::Markdown;
    else if (a == "--dry-run") o.dry_run = true;
    else if (a == "--trace") o.trace = true;
    else if (a == "--tensors") o.tensors = true;
    else if (is(a, "--known")) o.known_path = value(i, a, "--known");
    else if (a == "--verbose" || a == "-v") o.verbose = true;
    else if (a == "--quiet" || a == "-q") o.quiet = true;
    else if (is(a, "--device")) o.device = value(i, a, "--device");
    else if (is(a, "--launcher")) o.launcher = value(i, a, "--launcher");
    else if (is(a, "--python")) o.python = value(i, a, "--python");
    else if (is(a, "--record")) o.record_path = value(i, a, "--record");
    else if (is(a, "--replay")) o.replay_path = value(i, a, "--replay");
    else if (is(a, "--filter")) o.filters.push_back(value(i, a, "--filter"));
    else if (is(a, "--workload")) o.workload = value(i, a, "--workload");
    else if (is(a, "--gpu")) o.gpu = value(i, a, "--gpu");
    else if (is(a, "--work-dir")) o.work_dir = value(i, a, "--work-dir");
    else if (is(a, "--tolerance") || is(a, "--jobs") || is(a, "--timeout")) {
      const std::string name = a.substr(0, a.find('='));
      const std::string v = value(i, a, name);
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (v.empty() || !end || *end != '\0' || !(d >= 0) || !std::isfinite(d))
        throw Fatal(name + " needs a non-negative number, not \"" + v + "\"", kUsage);
      if (name == "--tolerance") o.tolerance = d;
      else if (name == "--jobs") o.jobs = std::max(1, static_cast<int>(d));
      else o.timeout_s = std::max(1.0, d);
    } else if (a == "-h" || a == "--help") throw Fatal("", kUsage);
    else if (!a.empty() && a[0] == '-' && a != "-") throw Fatal("unknown option \"" + a + "\"", kUsage);
    else if (o.cases_path.empty()) o.cases_path = a;
    else throw Fatal("one CASES.json at a time (got \"" + o.cases_path + "\" and \"" + a + "\")", kUsage);
  }
  if (!o.known_path.empty() && !o.tensors) throw Fatal("--known goes with --tensors", kUsage);
  if (!o.known_path.empty() && !std::ifstream(o.known_path))
    throw Fatal("cannot read " + o.known_path + " (--known): a file of known mismatches, one a line");
  if (o.tensors && o.format == Format::Json)
    throw Fatal("--tensors prints its comparison as a table: use the text output or --markdown", kUsage);
  if (!o.replay_path.empty()) {
    if (!o.cases_path.empty()) throw Fatal("--replay takes the recorded file instead of CASES.json", kUsage);
    if (!o.record_path.empty()) throw Fatal("--record and --replay do not go together", kUsage);
    return o;
  }
  if (o.cases_path.empty()) throw Fatal("", kUsage);
  if (o.device.empty()) throw Fatal("say where the workload runs: --device cpu or --device cuda", kUsage);
  if (o.device != "cpu" && o.device != "cuda") throw Fatal("--device is cpu or cuda, not \"" + o.device + "\"", kUsage);
  return o;
}

void record(const Options& o, const std::vector<Case>& cases) {
  std::ofstream out(o.record_path, std::ios::app | std::ios::binary);
  if (!out) throw Fatal("cannot append to " + o.record_path + " (--record)");
  size_t n = 0;
  for (const Case& k : cases)
    for (const json& r : k.results) {
      json line = r;
      line["request"] = k.workload;
      if (!k.refused.empty()) {
        line["estimate_when_recorded"] = {{"refused", k.refused}};
        out << line.dump() << "\n";
        ++n;
        continue;
      }
      const json& pg = k.estimate["per_gpu"];
      line["estimate_when_recorded"] = {{"version", k.estimate["version"]},
                                        {"allocated_peak_bytes", pg["allocated_peak_bytes"]},
                                        {"reserved_peak_bytes", pg["reserved_peak_bytes"]},
                                        {"device_total_bytes", pg["device_total_bytes"]},
                                        {"fits", k.estimate["fits"]}};
      out << line.dump() << "\n";
      ++n;
    }
  if (!o.quiet) std::fprintf(stderr, "[memfit validate] appended %zu result lines to %s\n", n, o.record_path.c_str());
}

/// `--replay`: estimate the recorded cases again (as CPU requests, retargeted to the recorded
/// GPU) and compare them with the recorded measurements.
int replay(const Options& o) {
  std::vector<Case> cases = load_replay(o);
  Problems problems;
  estimate_all(cases, "cpu", nullptr, problems);
  throw_problems(o.replay_path, problems);
  retarget_gpu(cases, nullptr);
  return report_all(cases, o, "replay of " + o.replay_path);
}

/// The --work-dir, created and made absolute; empty when none was given (a temporary one then).
std::string work_dir_of(const Options& o) {
  std::string dir = o.work_dir;
  if (!dir.empty()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    dir = fs::absolute(dir).string();
  }
  return dir;
}

/// `--dry-run`: the jobs that would run (their case files written when a --work-dir is given),
/// the cases and their estimates.
int print_dry_run(const Options& o, const std::vector<Case>& cases, const std::string& python,
                  const std::string& python_from, const std::string& workload, const std::string& root,
                  const std::string& dir, const json& gpu) {
  const std::string shown = dir.empty() ? "$TMP" : dir;
  std::vector<Job> jobs = plan_jobs(o, cases, python.empty() ? "python3" : python, workload.empty() ? "validate/workload.py" : workload, shown);
  if (!dir.empty())
    for (const Job& j : jobs) {
      json list = json::array();
      for (size_t i : j.cases) list.push_back(cases[i].workload);
      write_file(j.in_path, list.dump(1) + "\n");
    }
  return dry_run(o, cases, jobs, python, python_from, workload, root.empty() ? fs::current_path().string() : root, gpu);
}

void warn_estimates_over_gpu(const std::vector<Case>& cases, const json& env, const json& gpu) {
  // GPU too small: say so up front; the run still goes (an OOM is a result to compare).
  const json& g = env["gpus"][0];
  const json dev_gpu = gpu.is_null() ? gpu_from_device(str(g, "name"), num(g, "total_bytes")) : gpu;
  for (const Case& k : cases) {
    json req = k.workload.contains("gpu") ? k.request : core_request(k.workload, "cuda", dev_gpu);
    const json e = json::parse(memfit::estimate_json(req.dump()));
    if (!e.contains("error") && !e.value("fits", true))
      std::fprintf(stderr,
                   "[memfit validate] %s: the estimate (%s) does not fit the %s (%s): expect an out-of-memory, which "
                   "is reported as a result\n",
                   k.name.c_str(), gib_text(num(e["per_gpu"], "device_total_bytes")).c_str(), str(g, "name").c_str(),
                   gib_text(num(g, "total_bytes")).c_str());
  }
}

/// `--device cuda`: stops when torch sees no GPU; warns about cases that need more GPUs than are
/// visible or more memory than the GPU has.
void check_cuda_environment(const Options& o, const json& env, const std::string& python, const std::vector<Case>& cases,
                            const json& gpu) {
  if (!env.value("cuda_available", false))
    throw Fatal("torch " + str(env, "torch") + " at " + python + " sees no CUDA GPU (" +
                (env["torch_cuda"].is_null() ? std::string("a CPU-only build of torch") : "no driver or no visible device") +
                "): install a CUDA build of torch, check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu");
  const size_t visible = env["gpus"].size();
  if (o.launcher.empty())
    for (const Case& k : cases)
      if (static_cast<size_t>(k.nproc) > visible)
        std::fprintf(stderr,
                     "[memfit validate] %s: needs %d ranks (one GPU each) but torch sees %zu GPU%s: it will fail; "
                     "use --launcher for a multi-node launch\n",
                     k.name.c_str(), k.nproc, visible, visible == 1 ? "" : "s");
  warn_estimates_over_gpu(cases, env, gpu);
}

/// Runs the workload on every case (results attached to the cases) in DIR, or in a temporary
/// directory removed afterwards when DIR is empty.
void measure(const Options& o, std::vector<Case>& cases, const std::string& python, const std::string& workload,
             const std::string& root, std::string dir) {
  const bool temp = dir.empty();
  if (temp) {
    dir = proc::make_temp_dir("memfit-validate-");
    if (dir.empty()) throw Fatal("cannot create a temporary directory (set TMPDIR or pass --work-dir)");
  }
  std::vector<Job> jobs = plan_jobs(o, cases, python, workload, dir);
  const double t0 = proc::now();
  try {
    run_jobs(o, jobs, cases, root);
  } catch (...) {
    if (temp) proc::remove_tree(dir);
    throw;
  }
  if (temp) proc::remove_tree(dir);
  if (!o.quiet) std::fprintf(stderr, "[memfit validate] measured in %.1f s\n", proc::now() - t0);
}

int run(const Options& o) {
  if (!o.replay_path.empty()) return replay(o);
  const std::string root = find_root(o);
  Problems problems;
  std::vector<Case> cases = load_cases(o, root, problems);
  const json gpu = gpu_option(o.gpu);
  if (o.trace)
    for (Case& k : cases) k.workload["measure"]["trace"] = true;
  if (o.tensors)
    for (Case& k : cases) k.workload["measure"]["tensors"] = true;
  estimate_all(cases, o.device, o.device == "cuda" ? gpu : json(), problems);
  throw_problems(o.cases_path, problems);
  const std::string workload = workload_path(o, root);
  const auto [python, python_from] = find_python(o);
  const std::string dir = work_dir_of(o);
  if (o.dry_run) return print_dry_run(o, cases, python, python_from, workload, root, dir, gpu);
  if (workload.empty() || !fs::exists(workload))
    throw Fatal("cannot find validate/workload.py (looked above the current directory and above memfit's own): run from "
                "the memfit checkout or pass --workload PATH");
  if (python.empty()) throw Fatal("Python not found (" + python_from + "): " + kSetupHint);
  const json env = preflight(python, root, cases);
  if (o.device == "cuda") check_cuda_environment(o, env, python, cases, gpu);
  measure(o, cases, python, workload, root, dir);
  if (o.device == "cuda") retarget_gpu(cases, gpu);
  if (!o.record_path.empty()) record(o, cases);
  return report_all(cases, o, "measured on " + o.device);
}

}  // namespace

int run_validate(const std::vector<std::string>& args) {
  try {
    return run(parse_args(args));
  } catch (const Fatal& f) {
    if (f.code == kUsage) {
      if (*f.what()) std::fprintf(stderr, "memfit validate: %s\n", f.what());
      return usage();
    }
    std::fprintf(stderr, "memfit validate: %s\n", f.what());
    return f.code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memfit validate: internal error: %s\n", e.what());
    return kBadInput;
  }
}

}  // namespace memfit::cli
