// Test helper: the measurement records (data/measurements/*.jsonl) line by line, and a record's
// request as the estimator reads it. Shared by the tests that compare with measurements.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memfit/library.hpp"
#include "memfit/request.hpp"

namespace memfit::testing {

/// One case line of a record file.
struct RecordLine {
  std::string name;
  nlohmann::json request;   ///< as the validator ran it (with its own fields: steps, measure, the model's source)
  nlohmann::json measured;  ///< null where the line has no measurement
};

/// The case lines of data/measurements/`file`, in file order (blank and '#' lines skipped).
inline std::vector<RecordLine> record_lines(const std::string& file) {
  std::ifstream in(std::string(MEMFIT_DATA_DIR) + "/measurements/" + file);
  std::vector<RecordLine> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto j = nlohmann::json::parse(line);
    out.push_back({j.value("name", std::string()), j.value("request", nlohmann::json()), j.value("measured", nlohmann::json())});
  }
  return out;
}

/// A record's request as the estimator reads it: the validator's own fields dropped, the model's
/// config from the bundled library.
inline Request estimator_request(nlohmann::json request) {
  for (const char* k : {"steps", "measure"}) request.erase(k);
  request["model"].erase("source");
  request["model"].erase("config_inline");
  return parse_request(request, [](const std::string& id, nlohmann::json& c) { return bundled_config(id, c); });
}

}  // namespace memfit::testing
