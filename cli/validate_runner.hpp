// `memfit validate`: finding Python and the workload, and running the workload processes
// (batched on CPU, one case per process on CUDA) with their results attached to the cases.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "validate_common.hpp"
#include "validate_process.hpp"

namespace memfit::cli::validate {

/// What to tell a user whose Python lacks the workload's packages.
extern const char* const kSetupHint;

/// The checkout holding validate/workload.py (above the current directory or memfit's own); "" if none.
std::string find_root(const Options& o);
std::string workload_path(const Options& o, const std::string& root);
/// The Python to run, and where it came from; empty when none is found.
std::pair<std::string, std::string> find_python(const Options& o);
/// Checks that the Python imports torch and finds transformers (and peft for LoRA cases);
/// returns what it reported (versions, CUDA devices). Throws Fatal with the fix otherwise.
json preflight(const std::string& python, const std::string& root, const std::vector<Case>& cases);

struct Job {
  std::string tag;
  std::vector<size_t> cases;  // indexes into the case vector
  int nproc = 1, threads = 0;
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::string in_path, out_path, stdout_path, stderr_path;
  proc::Child child;
  bool started = false, done = false;
  int status = 0;
  double seconds = 0;
  bool timed_out = false;
};

/// The job's command line as a shell would take it (environment first).
std::string command_line(const Job& j);
/// The workload processes for the cases, with their files under `dir`.
std::vector<Job> plan_jobs(const Options& o, const std::vector<Case>& cases, const std::string& python,
                           const std::string& workload, const std::string& dir);
/// Runs the jobs (at most `slots` ranks at once), attaches each result line to its case.
void run_jobs(const Options& o, std::vector<Job>& jobs, std::vector<Case>& cases, const std::string& root);

}  // namespace memfit::cli::validate
