// `memfit validate`: the outputs (text table, Markdown, JSON) and the dry run's listing.
#pragma once

#include <string>
#include <vector>

#include "validate_common.hpp"
#include "validate_runner.hpp"

namespace memfit::cli::validate {

/// Compares every case, prints the report in o.format, returns the gate's exit code.
int report_all(const std::vector<Case>& cases, const Options& o, const std::string& source);

/// --dry-run: the commands, the cases and their estimates; nothing runs.
int dry_run(const Options& o, const std::vector<Case>& cases, const std::vector<Job>& jobs, const std::string& python,
            const std::string& python_from, const std::string& workload, const std::string& root, const json& gpu);

}  // namespace memfit::cli::validate
