// Shared by the `memfit validate` files: options, one case, the exit codes, small JSON and
// text helpers. The command is split by concern: validate_cases (reading and completing the
// cases), validate_runner (finding Python, running the workload), validate_compare (estimate
// vs measurement), validate_report (the table, Markdown and JSON outputs, the dry run).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace memfit::cli::validate {

using nlohmann::json;

constexpr int kPass = 0;
constexpr int kFail = 1;
constexpr int kBadInput = 2;
constexpr int kUsage = 64;

/// A problem that stops the command: the message says what to fix.
struct Fatal : std::runtime_error {
  int code;
  Fatal(const std::string& m, int c = kBadInput) : std::runtime_error(m), code(c) {}
};

enum class Format { Table, Json, Markdown };

struct Options {
  std::string cases_path, replay_path, device, launcher, python, record_path, workload, gpu, work_dir;
  std::vector<std::string> filters;
  double tolerance = 2.0;
  double reserved_tolerance = 3.0;  // trace replays (reported, not gated)
  Format format = Format::Table;
  bool dry_run = false, verbose = false, quiet = false;
  bool trace = false;       // --trace: the workload records allocation traces (measure.trace)
  bool tensors = false;     // --tensors: per-tensor rows (measure.tensors) compared with the core's lists
  std::string known_path;   // --known: mismatches of --tensors that are understood
  int jobs = 0;             // 0: from the core count (CPU), 1 on CUDA
  double timeout_s = 3600;  // per workload process
};

struct Case {
  size_t index = 0;  ///< 1-based position in the case file (or record)
  std::string name, family;
  json workload;     ///< what validate/workload.py receives (config inline, workload defaults filled)
  json request;      ///< what the core estimates
  json estimate;     ///< the core's answer (null when it refuses the run)
  std::string refused;  ///< the core's refusal of a run the framework rejects (memfit::Rejected)
  int nproc = 1;     ///< ranks (1: a plain process)
  std::vector<json> results;  ///< workload lines, one per rank
  std::string run_error;      ///< the process died or timed out before answering
};

// ------------------------------------------------------------------------------- helpers

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& text);
std::vector<json> read_json_lines(const std::string& path);
std::string tail_lines(const std::string& text, size_t n);
std::string first_line(const std::string& s, size_t max_len = 160);
double num(const json& j, const char* key, double fallback = 0);
std::string str(const json& j, const char* key, const std::string& fallback = "");
/// defaults, then the case on top (objects merged key by key).
json deep_merge(const json& base, const json& over);
std::string family_of(const std::string& name);
std::string gib_text(double b);

}  // namespace memfit::cli::validate
