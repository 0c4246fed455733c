// `memfit validate`: reading the case file (or a recorded file), completing each case with the
// workload's defaults, translating it into the core's request, estimating it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "validate_common.hpp"

namespace memfit::cli::validate {

/// Malformed cases: (position in the file, what is wrong), reported together.
using Problems = std::vector<std::pair<size_t, std::string>>;
/// Throws Fatal listing the problems (sorted by position), if any.
void throw_problems(const std::string& where, Problems p);

/// The workload case -> the core's request (the workload's extensions dropped, fields translated).
json core_request(const json& w, const std::string& device, const json& gpu);
/// Estimates every case; a case the estimator rejects is malformed (the core names the field).
void estimate_all(std::vector<Case>& cases, const std::string& device, const json& gpu_for, Problems& problems);
/// The cases of o.cases_path that pass the filters; malformed ones go to `problems`.
std::vector<Case> load_cases(const Options& o, const std::string& root, Problems& problems);
/// A recorded file: workload lines, each with the full case under "request".
std::vector<Case> load_replay(const Options& o);

/// The catalog GPU for the name torch reports (e.g. "NVIDIA H100 80GB HBM3" -> H100-SXM-80GB),
/// with the memory torch reports; an unknown GPU is {"memory_gib": ...} (a custom GPU).
json gpu_from_device(const std::string& torch_name, double total_bytes);
/// --gpu NAME|GIB as the request's "gpu" field (null when empty).
json gpu_option(const std::string& s);
/// CUDA: the estimate's GPU is the one the workload ran on (unless the case or --gpu names one).
void retarget_gpu(std::vector<Case>& cases, const json& gpu_opt);

}  // namespace memfit::cli::validate
