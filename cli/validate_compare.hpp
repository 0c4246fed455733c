// `memfit validate`: one case's estimate against its measurement (per metric, with the
// component that differs most), and the summary over all cases (the gate's verdict).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "validate_common.hpp"

namespace memfit::cli::validate {

struct Part {
  std::string name;
  double estimate = 0, measured = 0;
};

struct Row {
  std::string metric;
  bool numeric = false;
  double estimate = 0, measured = 0, error_pct = 0;
  bool over = false;
  std::string measured_text;  // "OOM", "unsupported", "error" when not numeric
  std::string note;
  Part gap;  // the part with the largest |estimate - measured|
  bool has_gap = false;
};

struct Report {
  const Case* c = nullptr;
  std::string status;  // ok | oom | unsupported | error
  bool failed = false;
  std::string note;
  std::vector<Row> rows;
  std::vector<Part> parts;  // per group, at the allocated/peak metric
  int rank = -1;            // the rank the figures come from (distributed)
};

/// The rows of one case: peak allocated on CPU; allocated, reserved, device on CUDA.
Report compare(const Case& k, const Options& o);

struct Stats {
  size_t rows = 0, over = 0;
  double max = 0, median = 0;
  std::string max_case, max_metric;
};

struct Summary {
  Stats all;
  std::vector<std::pair<std::string, Stats>> by_family, by_metric;
  size_t cases = 0, ok = 0, unsupported = 0, oom_agree = 0, oom_wrong = 0, errors = 0, cases_over = 0;
  size_t refused_agree = 0;  ///< runs memfit refuses that failed when run (see refused_report)
  std::map<std::string, size_t> unsupported_reasons;
  int exit_code = kPass;
};

/// The statistics over all cases, per family and per metric, and the exit code of the gate.
Summary summarise(const std::vector<Report>& reps);

}  // namespace memfit::cli::validate
