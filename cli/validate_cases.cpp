// `memfit validate`: the cases (validate_cases.hpp).
#include "validate_cases.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "memfit/api.hpp"

namespace memfit::cli::validate {

namespace fs = std::filesystem;

namespace {

/// Fields whose default differs between workload.py and the core. What runs is the workload's
/// default, so it is written into the case and both sides see the same setup.
void fill_workload_defaults(json& c) {
  auto dflt = [&](const char* k, json v) {
    if (!c.contains(k)) c[k] = std::move(v);
  };
  dflt("task", "full");
  dflt("precision", "fp32");          // core: amp_bf16
  dflt("optimizer", "adamw");
  dflt("micro_batch_size", 1);        // core: 4
  dflt("sequence_length", 128);       // core: 2048
  dflt("gradient_accumulation_steps", 1);
  dflt("gradient_checkpointing", false);
  dflt("attention", "sdpa");
  if (!c.contains("parallelism")) c["parallelism"] = {{"method", "single"}};
  if (c["task"] == "inference") {
    if (!c.contains("inference")) c["inference"] = json::object();
    json& in = c["inference"];
    if (in.is_object()) {
      if (!in.contains("batch_size")) in["batch_size"] = 1;
      if (!in.contains("context_length")) in["context_length"] = 128;  // core: 4096
      if (!in.contains("new_tokens")) in["new_tokens"] = 4;
    }
  }
}

int nproc_of(const json& w) {
  const json& p = w.contains("parallelism") && w["parallelism"].is_object() ? w["parallelism"] : json::object();
  if (p.value("method", std::string("single")) == "single") return 1;
  const long long dp = p.contains("dp") && p["dp"].is_number_integer() ? p["dp"].get<long long>() : 1;
  const long long tp = p.contains("tp") && p["tp"].is_number_integer() ? p["tp"].get<long long>() : 1;
  return static_cast<int>(std::clamp<long long>(dp * tp, 2, 4096));
}

std::string resolve_path(const std::string& p, const std::vector<std::string>& bases) {
  if (fs::path(p).is_absolute()) return p;
  for (const std::string& b : bases) {
    const fs::path cand = b.empty() ? fs::path(p) : fs::path(b) / p;
    std::error_code ec;
    if (fs::exists(cand, ec)) return cand.string();
  }
  return p;
}

/// Checks and completes one case; throws std::runtime_error naming the field.
Case make_case(json c, const json& defaults, size_t index, const std::string& device, const std::vector<std::string>& bases) {
  if (!c.is_object()) throw std::runtime_error("must be a JSON object (a memfit request), not " + std::string(c.type_name()));
  c = deep_merge(defaults, c);
  Case k;
  k.index = index;
  if (c.contains("name") && !c["name"].is_string()) throw std::runtime_error("field \"name\" must be a string");
  k.name = c.value("name", "case" + std::to_string(index - 1));  // workload.py's default name
  c["name"] = k.name;
  if (!c.contains("model") || !c["model"].is_object())
    throw std::runtime_error("needs \"model\": {\"config\": {...}}, {\"config_path\": \"file.json\"} or {\"id\": \"org/name\"}");
  json& m = c["model"];
  if (m.contains("config_path")) {
    if (!m["config_path"].is_string()) throw std::runtime_error("field \"model.config_path\" must be a path string");
    const std::string path = resolve_path(m["config_path"].get<std::string>(), bases);
    std::ifstream in(path);
    if (!in) throw std::runtime_error("field \"model.config_path\": cannot read " + path);
    json cfg = json::parse(in, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object())
      throw std::runtime_error("field \"model.config_path\": " + path + " is not a JSON object (a config.json)");
    if (!m.contains("source")) m["source"] = m["config_path"];
    m.erase("config_path");
    m["config"] = cfg;
  }
  if (c.contains("device") && c["device"] != device)
    throw std::runtime_error("field \"device\" is " + c["device"].dump() + " but the run is --device " + device);
  c["device"] = device;
  fill_workload_defaults(c);
  k.family = family_of(k.name);
  k.nproc = nproc_of(c);
  k.workload = std::move(c);
  return k;
}

bool wanted(const std::string& name, const std::vector<std::string>& filters) {
  if (filters.empty()) return true;
  return std::any_of(filters.begin(), filters.end(), [&](const std::string& f) { return name.find(f) != std::string::npos; });
}

}  // namespace

/// The workload case -> the core's request. The core rejects fields it does not know, so the
/// workload's extensions go; the rest is translated where the two read a field differently.
json core_request(const json& w, const std::string& device, const json& gpu) {
  json r = w;
  for (const char* k : {"steps", "seed", "measure"}) r.erase(k);
  if (r.contains("model") && r["model"].is_object()) {
    r["model"].erase("source");
    r["model"].erase("config_path");
  }
  r["device"] = device;
  if (r.value("task", "") == "inference" && r.contains("inference") && r["inference"].is_object()) {
    json& in = r["inference"];
    // workload: context_length = prompt, then new_tokens generated; core: the tokens the KV
    // cache must hold (prompt + generated).
    if (in.contains("context_length") && in["context_length"].is_number_integer() && in.contains("new_tokens") &&
        in["new_tokens"].is_number_integer())
      in["context_length"] = in["context_length"].get<long long>() + in["new_tokens"].get<long long>();
    // transformers' DynamicCache holds K/V in the dtype the model computes in.
    if (!in.contains("kv_cache_dtype") && r["precision"].is_string()) {
      const std::string p = r["precision"];
      in["kv_cache_dtype"] = p == "fp32" ? "fp32" : (p == "fp16" || p == "amp_fp16") ? "fp16" : "bf16";
    }
  }
  if (!gpu.is_null() && !r.contains("gpu") && !(r.contains("cluster") && r["cluster"].contains("gpu"))) r["gpu"] = gpu;
  return r;
}

void throw_problems(const std::string& where, Problems p) {
  if (p.empty()) return;
  std::stable_sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string msg = where + ": " + std::to_string(p.size()) + " malformed case" + (p.size() > 1 ? "s" : "") +
                    " (nothing was run):";
  for (size_t i = 0; i < p.size() && i < 20; ++i) msg += "\n  " + p[i].second;
  if (p.size() > 20) msg += "\n  ... and " + std::to_string(p.size() - 20) + " more";
  throw Fatal(msg);
}

void estimate_all(std::vector<Case>& cases, const std::string& device, const json& gpu_for, Problems& problems) {
  for (Case& k : cases) {
    const std::string dev = k.workload.value("device", device);
    k.request = core_request(k.workload, dev, gpu_for);
    const json e = json::parse(memfit::estimate_json(k.request.dump()));
    if (e.value("rejected", false)) {  // a run the framework rejects: compared with what the run did
      k.refused = e["error"].get<std::string>();
      continue;
    }
    if (e.contains("error")) {
      problems.emplace_back(k.index, "case " + std::to_string(k.index) + " (\"" + k.name + "\"): " + e["error"].get<std::string>());
      continue;
    }
    k.estimate = e;
  }
}

std::vector<Case> load_cases(const Options& o, const std::string& root, Problems& problems) {
  const std::string text = read_file(o.cases_path);
  json doc = json::parse(text, nullptr, false);
  std::vector<json> list;
  json defaults = json::object();
  if (doc.is_discarded()) {  // JSON lines, like workload.py accepts
    std::istringstream ss(text);
    std::string line;
    size_t n = 0;
    while (std::getline(ss, line)) {
      ++n;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded())
        throw Fatal(o.cases_path + " is neither JSON nor JSON lines (line " + std::to_string(n) +
                    " does not parse): check for a missing comma, quote or bracket");
      list.push_back(std::move(j));
    }
  } else if (doc.is_array()) {
    list = doc.get<std::vector<json>>();
  } else if (doc.is_object() && doc.contains("cases")) {
    if (!doc["cases"].is_array()) throw Fatal(o.cases_path + ": \"cases\" must be a list of requests");
    list = doc["cases"].get<std::vector<json>>();
    if (doc.contains("defaults")) {
      if (!doc["defaults"].is_object()) throw Fatal(o.cases_path + ": \"defaults\" must be an object of request fields");
      defaults = doc["defaults"];
    }
  } else if (doc.is_object()) {
    list.push_back(doc);
  } else {
    throw Fatal(o.cases_path + " must hold a request, a list of requests, or {\"cases\": [...], \"defaults\": {...}}");
  }
  const std::string dir = fs::path(o.cases_path).parent_path().string();
  const std::vector<std::string> bases = {"", dir, root};
  std::vector<Case> cases;
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    try {
      Case k = make_case(list[i], defaults, i + 1, o.device, bases);
      if (auto it = seen.find(k.name); it != seen.end())
        throw std::runtime_error("duplicate name (also case " + std::to_string(it->second) +
                                 "): results are matched by name, give each case its own");
      seen[k.name] = k.index;
      if (wanted(k.name, o.filters)) cases.push_back(std::move(k));
    } catch (const std::exception& e) {
      const std::string name = list[i].is_object() && list[i].contains("name") && list[i]["name"].is_string()
                                   ? " (\"" + list[i]["name"].get<std::string>() + "\")"
                                   : "";
      if (name.empty() || wanted(list[i]["name"].get<std::string>(), o.filters))
        problems.emplace_back(i + 1, "case " + std::to_string(i + 1) + name + ": " + e.what());
    }
  }
  if (list.empty()) throw Fatal(o.cases_path + " has no cases");
  if (cases.empty() && problems.empty()) throw Fatal("no case name matches the --filter given (" + std::to_string(list.size()) + " cases in the file)");
  return cases;
}

std::vector<Case> load_replay(const Options& o) {
  const std::string text = read_file(o.replay_path);
  std::istringstream ss(text);
  std::string line;
  std::vector<Case> cases;
  std::map<std::string, size_t> by_name;
  size_t n = 0;
  std::string bad;
  size_t nbad = 0;
  while (std::getline(ss, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    std::string err;
    if (j.is_discarded() || !j.is_object()) err = "not a JSON object";
    else if (!j.contains("request") || !j["request"].is_object())
      err = "no \"request\": record files come from `memfit validate ... --record FILE` (workload.py's own output "
            "summarises the model config, so the estimate cannot be recomputed from it)";
    if (!err.empty()) {
      if (++nbad <= 10) bad += "\n  line " + std::to_string(n) + ": " + err;
      continue;
    }
    const std::string name = j["request"].value("name", str(j, "name"));
    if (!wanted(name, o.filters)) continue;
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      const std::string device = j["request"].value(
          "device", j.contains("environment") ? str(j["environment"], "device", "cpu") : std::string("cpu"));
      try {
        Case k = make_case(j["request"], json::object(), n, device, {});
        k.index = cases.size() + 1;
        by_name[name] = cases.size();
        cases.push_back(std::move(k));
      } catch (const std::exception& e) {
        if (++nbad <= 10) bad += "\n  line " + std::to_string(n) + " (\"" + name + "\"): " + e.what();
        continue;
      }
      it = by_name.find(name);
    }
    j.erase("request");
    cases[it->second].results.push_back(std::move(j));
  }
  if (nbad) throw Fatal(o.replay_path + ": " + std::to_string(nbad) + " unusable line" + (nbad > 1 ? "s" : "") + ":" + bad);
  if (cases.empty())
    throw Fatal(o.filters.empty() ? o.replay_path + " has no recorded cases" : "no recorded case name matches the --filter given");
  return cases;
}

json gpu_from_device(const std::string& torch_name, double total_bytes) {
  const double gib = total_bytes / 1073741824.0;
  auto upper = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
  };
  std::vector<std::string> words;
  {
    std::string w;
    for (char c : upper(torch_name) + " ") {
      if (std::isalnum(static_cast<unsigned char>(c))) w += c;
      else if (!w.empty()) {
        words.push_back(w);
        w.clear();
      }
    }
    for (size_t i = 0; i + 1 < words.size(); ++i)
      if (words[i] == "RTX") words.push_back("RTX" + words[i + 1]);
  }
  const bool pcie = upper(torch_name).find("PCIE") != std::string::npos;
  const json catalog = json::parse(memfit::gpus_json());
  std::string best;
  double best_diff = 1e300;
  if (catalog.is_array())
    for (const json& g : catalog) {
      const std::string name = g.value("name", "");
      const std::string model = upper(name.substr(0, name.find('-')));
      if (std::find(words.begin(), words.end(), model) == words.end()) continue;
      const bool g_pcie = upper(name).find("PCIE") != std::string::npos;
      double diff = std::fabs(num(g, "memory_bytes") - total_bytes) / 1073741824.0;
      if (g_pcie != pcie) diff += 1000;
      if (diff < best_diff) {
        best_diff = diff;
        best = name;
      }
    }
  json gpu = {{"memory_gib", std::round(gib * 1000) / 1000}};
  if (!best.empty()) gpu["name"] = best;
  return gpu;
}

json gpu_option(const std::string& s) {
  if (s.empty()) return nullptr;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end && *end == '\0' && v > 0) return {{"memory_gib", v}};
  return {{"name", s}};
}

void retarget_gpu(std::vector<Case>& cases, const json& gpu_opt) {
  for (Case& k : cases) {
    if (!gpu_opt.is_null() || k.workload.contains("gpu") || k.results.empty()) continue;
    const json& r = k.results.front();
    if (!r.contains("environment") || str(r["environment"], "device") != "cuda") continue;
    const json& env = r["environment"];
    const json gpu = gpu_from_device(str(env, "gpu_name"), num(env, "gpu_total_bytes"));
    k.request = core_request(k.workload, "cuda", gpu);
    const json e = json::parse(memfit::estimate_json(k.request.dump()));
    if (!e.contains("error")) k.estimate = e;
  }
}

}  // namespace memfit::cli::validate
