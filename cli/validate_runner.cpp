// `memfit validate`: the environment and the workload processes (validate_runner.hpp).
#include "validate_runner.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

namespace memfit::cli::validate {

namespace fs = std::filesystem;

std::string find_root(const Options& o) {
  auto has_workload = [](const fs::path& d) {
    std::error_code ec;
    return fs::exists(d / "validate" / "workload.py", ec);
  };
  if (!o.workload.empty()) return fs::absolute(o.workload).parent_path().parent_path().string();
  std::vector<fs::path> starts;
  std::error_code ec;
  starts.push_back(fs::current_path(ec));
  if (const std::string d = proc::self_exe_dir(); !d.empty()) starts.emplace_back(d);
  for (fs::path p : starts)
    for (; !p.empty(); p = p.parent_path()) {
      if (has_workload(p)) return p.string();
      if (p == p.parent_path()) break;
    }
#ifdef MEMFIT_SOURCE_DIR
  if (has_workload(MEMFIT_SOURCE_DIR)) return MEMFIT_SOURCE_DIR;
#endif
  return "";
}

std::string workload_path(const Options& o, const std::string& root) {
  if (!o.workload.empty()) return fs::absolute(o.workload).string();
  return root.empty() ? std::string() : (fs::path(root) / "validate" / "workload.py").string();
}

std::pair<std::string, std::string> find_python(const Options& o) {
  if (!o.python.empty()) {
    auto p = proc::find_executable(o.python);
    return {p ? *p : "", "--python " + o.python};
  }
  if (const char* e = std::getenv("MEMFIT_PYTHON"); e && *e) {
    auto p = proc::find_executable(e);
    return {p ? *p : "", std::string("$MEMFIT_PYTHON=") + e};
  }
  std::string venv;
  if (const char* v = std::getenv("MEMFIT_VENV"); v && *v) venv = v;
  else if (const char* h = std::getenv("HOME"); h && *h) venv = std::string(h) + "/.cache/memfit/venv";
  if (!venv.empty())
    if (auto p = proc::find_executable(venv + "/bin/python")) return {*p, "the venv " + venv};
  if (auto p = proc::find_executable("python3")) return {*p, "python3 on PATH (no venv at " + venv + ")"};
  return {"", "no --python, no $MEMFIT_PYTHON, no venv at " + venv + ", no python3 on PATH"};
}

namespace {

/// torch (imported: its version and CUDA view) and transformers/peft (found, not imported:
/// importing transformers costs seconds; the workload reports a broken import itself).
const char* kPreflight = R"PY(
import importlib.util, json, sys
r = {"python": sys.version.split()[0], "executable": sys.executable, "missing": {}}
try:
    import torch
    r["torch"] = torch.__version__
    r["cuda_available"] = bool(torch.cuda.is_available())
    r["torch_cuda"] = torch.version.cuda
    if r["cuda_available"]:
        r["gpus"] = [{"name": torch.cuda.get_device_name(i),
                      "total_bytes": int(torch.cuda.get_device_properties(i).total_memory)}
                     for i in range(torch.cuda.device_count())]
except Exception as e:
    r["missing"]["torch"] = f"{type(e).__name__}: {e}"
for m in ("transformers", "peft"):
    try:
        if importlib.util.find_spec(m) is None:
            r["missing"][m] = f"No module named '{m}'"
    except Exception as e:
        r["missing"][m] = f"{type(e).__name__}: {e}"
print(json.dumps(r))
)PY";

int default_jobs() {
  const unsigned n = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(n ? n : 1, 1, 8));
}

size_t count_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  size_t n = 0;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    n += static_cast<size_t>(std::count(buf, buf + in.gcount(), '\n'));
    if (!in) break;
  }
  return n;
}

}  // namespace

const char* const kSetupHint =
    "run scripts/setup.sh python (creates the venv with the pins of validate/requirements.txt), or pass "
    "--python with an environment that has torch, transformers and peft";

json preflight(const std::string& python, const std::string& root, const std::vector<Case>& cases) {
  std::string out;
  const int rc = proc::run_capture({python, "-c", kPreflight}, root, out, 300);
  json j;
  const std::string last = tail_lines(out, 1);
  if (rc == 0) j = json::parse(last, nullptr, false);
  if (rc != 0 || j.is_discarded() || !j.is_object())
    throw Fatal("the Python at " + python + " does not run a simple check (exit " + std::to_string(rc) + "): " +
                first_line(out) + "; " + kSetupHint);
  const json& miss = j["missing"];
  const bool lora = std::any_of(cases.begin(), cases.end(), [](const Case& k) { return k.workload.value("task", "") == "lora"; });
  for (const char* m : {"torch", "transformers"})
    if (miss.contains(m))
      throw Fatal("the Python at " + python + " lacks " + m + " (" + miss[m].get<std::string>() + "): " + kSetupHint);
  if (miss.contains("peft")) {
    if (lora)
      throw Fatal("the Python at " + python + " lacks peft, which the LoRA cases need (" + miss["peft"].get<std::string>() +
                  "): " + kSetupHint);
  }
  return j;
}

std::string command_line(const Job& j) {
  std::string s;
  for (const auto& [k, v] : j.env) s += k + "=" + proc::shell_quote(v) + " ";
  for (size_t i = 0; i < j.argv.size(); ++i) {
    if (i) s += ' ';
    s += proc::shell_quote(j.argv[i]);
  }
  return s;
}

/// Single-process cases: CPU batches several per process (the Python imports cost ~6 s each),
/// a few batches per concurrent job so they balance; CUDA runs one case per process, so the
/// caching allocator, the peak counters and NVML start clean for every case.
std::vector<Job> plan_jobs(const Options& o, const std::vector<Case>& cases, const std::string& python,
                           const std::string& workload, const std::string& dir) {
  const bool cuda = o.device == "cuda";
  const int jobs = cuda ? 1 : (o.jobs > 0 ? o.jobs : default_jobs());
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<Job> out;
  auto finish = [&](Job& j) {
    j.in_path = dir + "/" + j.tag + ".cases.json";
    j.out_path = dir + "/" + j.tag + ".results.jsonl";
    j.stdout_path = dir + "/" + j.tag + ".stdout";
    j.stderr_path = dir + "/" + j.tag + ".stderr";
    const std::vector<std::string> tail = {workload, j.in_path, "--output", j.out_path, "--device", o.device};
    if (j.nproc == 1) {
      j.argv = {python};
      j.argv.insert(j.argv.end(), tail.begin(), tail.end());
      if (j.threads > 0) {
        j.argv.push_back("--threads");
        j.argv.push_back(std::to_string(j.threads));
      }
    } else if (!o.launcher.empty()) {
      std::string l = o.launcher;
      for (size_t p; (p = l.find("{nproc}")) != std::string::npos;) l.replace(p, 7, std::to_string(j.nproc));
      j.argv = proc::split_words(l);
      j.argv.insert(j.argv.end(), tail.begin(), tail.end());
    } else {
      j.argv = {python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", std::to_string(j.nproc)};
      j.argv.insert(j.argv.end(), tail.begin(), tail.end());
    }
    if (j.threads > 0) j.env.emplace_back("OMP_NUM_THREADS", std::to_string(j.threads));
    j.env.emplace_back("TOKENIZERS_PARALLELISM", "false");
    out.push_back(std::move(j));
  };
  // Distributed cases first (longest), grouped by rank count on CPU, one per process on CUDA.
  std::map<int, std::vector<size_t>> by_n;
  std::vector<size_t> single;
  for (size_t i = 0; i < cases.size(); ++i) (cases[i].nproc > 1 ? by_n[cases[i].nproc] : single).push_back(i);
  for (const auto& [n, idx] : by_n) {
    if (cuda) {
      for (size_t i : idx) {
        Job j;
        j.tag = "dist" + std::to_string(n) + "-" + std::to_string(out.size() + 1);
        j.cases = {i};
        j.nproc = n;
        finish(j);
      }
    } else {
      Job j;
      j.tag = "dist" + std::to_string(n);
      j.cases = idx;
      j.nproc = n;
      j.threads = std::max(1, cores / n);
      finish(j);
    }
  }
  if (cuda) {
    for (size_t i : single) {
      Job j;
      j.tag = "case" + std::to_string(cases[i].index);
      j.cases = {i};
      finish(j);
    }
  } else if (!single.empty()) {
    // Contiguous runs of families, about the same number of cases per batch.
    const size_t batches = std::min<size_t>(single.size(), jobs == 1 ? 1 : static_cast<size_t>(2 * jobs));
    const size_t per = (single.size() + batches - 1) / batches;
    std::vector<size_t> order = single;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cases[a].family < cases[b].family; });
    for (size_t b = 0; b * per < order.size(); ++b) {
      Job j;
      j.tag = "batch" + std::to_string(b + 1);
      j.cases.assign(order.begin() + static_cast<long>(b * per), order.begin() + static_cast<long>(std::min(order.size(), (b + 1) * per)));
      j.threads = std::max(1, cores / jobs);
      finish(j);
    }
  }
  return out;
}

namespace {

/// Writes each job's case list (its input file) and removes an old output file.
void write_job_inputs(std::vector<Job>& jobs, const std::vector<Case>& cases) {
  for (Job& j : jobs) {
    json list = json::array();
    for (size_t i : j.cases) list.push_back(cases[i].workload);
    write_file(j.in_path, list.dump(1) + "\n");
    std::error_code ec;
    fs::remove(j.out_path, ec);
  }
}

void stop_running_jobs(std::vector<Job>& jobs) {
  for (Job& j : jobs)
    if (j.started && !j.done) {
      proc::stop(j.child);
      j.done = true;
    }
}

/// Starts the waiting jobs in order while their ranks fit in the free slots (`used` counts the
/// busy ones); a job that does not fit waits, and so do the ones after it.
void start_jobs_that_fit(const Options& o, std::vector<Job>& jobs, const std::string& root, int slots, int& used) {
  for (Job& j : jobs) {
    if (j.started) continue;
    const int need = std::min(j.nproc, slots);
    if (used > 0 && used + need > slots) break;  // keep the order: no overtaking
    std::string err;
    auto child = proc::spawn(j.argv, j.env, root, j.stdout_path, j.stderr_path, err);
    if (!child) {
      stop_running_jobs(jobs);
      throw Fatal("cannot start " + j.argv[0] + ": " + err +
                  (j.nproc > 1 && !o.launcher.empty() ? " (from --launcher)" : ""));
    }
    if (!o.quiet)
      std::fprintf(stderr, "[memfit validate] %s: %zu case%s: %s\n", j.tag.c_str(), j.cases.size(),
                   j.cases.size() == 1 ? "" : "s", command_line(j).c_str());
    j.child = *child;
    j.started = true;
    used += need;
  }
}

/// True when the running job has just ended: it exited, or ran past --timeout and was stopped.
bool has_just_ended(const Options& o, Job& j) {
  int status = 0;
  if (proc::finished(j.child, status)) {
    j.done = true;
    j.status = status;
  } else if (proc::now() - j.child.started > o.timeout_s) {
    proc::stop(j.child);
    j.done = true;
    j.timed_out = true;
    j.status = 124;
  } else {
    return false;
  }
  return true;
}

/// The JSON objects among the lines of TEXT (other lines skipped).
std::vector<json> json_object_lines(const std::string& text) {
  std::vector<json> v;
  std::istringstream ss(text);
  for (std::string l; std::getline(ss, l);) {
    json x = json::parse(l, nullptr, false);
    if (x.is_object()) v.push_back(x);
  }
  return v;
}

/// Attaches the ended job's result lines to their cases, and to each case left unanswered the
/// reason with the process's last log lines.
void collect_results(const Options& o, std::vector<Job>& jobs, const Job& j, std::vector<Case>& cases,
                     const std::map<std::string, size_t>& by_name) {
  const std::string out = read_file(j.stdout_path);
  const std::string err = read_file(j.stderr_path);
  if (o.verbose) std::fprintf(stderr, "%s", err.c_str());
  // workload.py: {"error", "missing_dependency"} on stdout and exit 3 when an import fails.
  for (const json& line : json_object_lines(out))
    if (line.contains("missing_dependency")) {
      stop_running_jobs(jobs);
      throw Fatal(str(line, "error", "a Python package is missing"));
    }
  size_t answered = 0;
  if (fs::exists(j.out_path))
    for (json& r : read_json_lines(j.out_path)) {
      auto it = by_name.find(str(r, "name"));
      if (it == by_name.end()) continue;
      cases[it->second].results.push_back(std::move(r));
      ++answered;
    }
  const std::string why = j.timed_out ? "timed out after " + std::to_string(static_cast<int>(o.timeout_s)) + " s (--timeout)"
                                      : "exited with status " + std::to_string(j.status);
  for (size_t i : j.cases)
    if (cases[i].results.empty())
      cases[i].run_error = "the workload process " + why + " before answering this case; its last log lines:\n" +
                           tail_lines(err + out, 12);
  if (!o.quiet)
    std::fprintf(stderr, "[memfit validate] %s done in %.1f s (%s, %zu result lines)\n", j.tag.c_str(), j.seconds,
                 j.timed_out ? "timed out" : ("exit " + std::to_string(j.status)).c_str(), answered);
}

/// Collects every job that has just ended (freeing its slots); true when all jobs are done.
bool collect_ended_jobs(const Options& o, std::vector<Job>& jobs, std::vector<Case>& cases,
                        const std::map<std::string, size_t>& by_name, int slots, int& used) {
  bool all_done = true;
  for (Job& j : jobs) {
    if (!j.started || j.done) {
      all_done = all_done && j.done;
      continue;
    }
    all_done = false;
    if (!has_just_ended(o, j)) continue;
    j.seconds = proc::now() - j.child.started;
    used -= std::min(j.nproc, slots);
    collect_results(o, jobs, j, cases, by_name);
  }
  return all_done;
}

void print_progress(const std::vector<Job>& jobs, double t0, size_t total_lines_expected) {
  size_t lines = 0;
  for (const Job& j : jobs)
    if (j.started) lines += count_lines(j.out_path);
  std::fprintf(stderr, "[memfit validate] %.0f s: %zu of %zu result lines written\n", proc::now() - t0, lines,
               total_lines_expected);
}

}  // namespace

void run_jobs(const Options& o, std::vector<Job>& jobs, std::vector<Case>& cases, const std::string& root) {
  const int slots = o.device == "cuda" ? 1 : (o.jobs > 0 ? o.jobs : default_jobs());
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < cases.size(); ++i) by_name[cases[i].name] = i;
  write_job_inputs(jobs, cases);
  proc::install_interrupt_handler();
  const double t0 = proc::now();
  double last_progress = t0;
  int used = 0;
  size_t total_lines_expected = 0;
  for (const Job& j : jobs) total_lines_expected += j.cases.size() * static_cast<size_t>(j.nproc);
  for (;;) {
    // start what fits
    start_jobs_that_fit(o, jobs, root, slots, used);
    if (collect_ended_jobs(o, jobs, cases, by_name, slots, used)) break;
    if (proc::interrupted()) {
      stop_running_jobs(jobs);
      throw Fatal("interrupted: the workload processes were stopped", 130);
    }
    if (!o.quiet && proc::now() - last_progress > 30) {
      last_progress = proc::now();
      print_progress(jobs, t0, total_lines_expected);
    }
    proc::sleep_s(0.1);
  }
}

}  // namespace memfit::cli::validate
