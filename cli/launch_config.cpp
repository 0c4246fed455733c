// `memfit estimate --from FILE`: reads a launch config (YAML, JSON or a command line of
// `--flag value` pairs) into the JSON tree + key -> line map that memfit::intake maps.
// YAML (and JSON, a subset of it) is parsed by yaml-cpp, which records each node's line.
#include "launch_config.hpp"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cstdlib>
#include <sstream>

namespace memfit::cli {

using nlohmann::json;

namespace {

/// A plain YAML scalar as JSON: YAML 1.2 core schema booleans, integers, floats and null;
/// quoted scalars (tag "!") stay strings.
json scalar(const YAML::Node& n) {
  const std::string s = n.Scalar();
  if (n.Tag() == "!") return s;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (end && *end == '\0') return i;
  const double d = std::strtod(s.c_str(), &end);
  if (end && *end == '\0') return d;
  return s;
}

json convert(const YAML::Node& n, const std::string& path, json& lines) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json obj = json::object();
      for (const auto& kv : n) {
        const std::string key = kv.first.as<std::string>();
        const std::string sub = path.empty() ? key : path + "." + key;
        lines[sub] = kv.first.Mark().line + 1;
        obj[key] = convert(kv.second, sub, lines);
      }
      return obj;
    }
    case YAML::NodeType::Sequence: {
      json arr = json::array();
      for (const auto& item : n) arr.push_back(convert(item, path, lines));
      return arr;
    }
    case YAML::NodeType::Scalar: return scalar(n);
    default: return nullptr;
  }
}

/// `--key value`, `--key=value` and bare `--flag` (true), e.g. a pasted `python train.py ...`.
json parse_flags(const std::string& text, json& lines) {
  json obj = json::object();
  std::istringstream in(text);
  std::string line_text;
  int line = 0;
  std::string pending;
  int pending_line = 0;
  auto value_of = [](const std::string& v) { return scalar(YAML::Node(v)); };
  while (std::getline(in, line_text)) {
    ++line;
    std::istringstream words(line_text);
    std::string w;
    while (words >> w) {
      if (w == "\\") continue;
      if (w.rfind("--", 0) == 0) {
        if (!pending.empty()) obj[pending] = true;
        pending.clear();
        const std::string body = w.substr(2);
        const size_t eq = body.find('=');
        if (eq != std::string::npos) {
          obj[body.substr(0, eq)] = value_of(body.substr(eq + 1));
          lines[body.substr(0, eq)] = line;
        } else {
          pending = body;
          pending_line = line;
          lines[pending] = pending_line;
        }
      } else if (!pending.empty()) {
        obj[pending] = value_of(w);
        pending.clear();
      }
    }
  }
  if (!pending.empty()) obj[pending] = true;
  return obj;
}

}  // namespace

bool read_launch_config(const std::string& text, json& input, std::string& error) {
  json lines = json::object();
  try {
    const YAML::Node root = YAML::Load(text);
    if (root.IsMap()) {
      input["config"] = convert(root, "", lines);
      input["lines"] = lines;
      return true;
    }
  } catch (const YAML::Exception& e) {
    if (text.find("--") == std::string::npos) {
      error = std::string("not valid YAML or JSON: ") + e.what();
      return false;
    }
  }
  if (text.find("--") != std::string::npos) {
    input["config"] = parse_flags(text, lines);
    input["lines"] = lines;
    return true;
  }
  error = "the file is neither a YAML/JSON mapping nor a command line of --flag value pairs";
  return false;
}

}  // namespace memfit::cli
