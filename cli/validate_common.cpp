// Small helpers shared by the `memfit validate` files (validate_common.hpp).
#include "validate_common.hpp"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace memfit::cli::validate {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Fatal("cannot read " + path + ": check the path");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Fatal("cannot write " + path);
  out << text;
}

std::vector<json> read_json_lines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

std::string tail_lines(const std::string& text, size_t n) {
  std::vector<std::string> lines;
  std::istringstream ss(text);
  for (std::string l; std::getline(ss, l);)
    if (!l.empty()) lines.push_back(l);
  std::string out;
  for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) out += (out.empty() ? "" : "\n") + lines[i];
  return out;
}

std::string first_line(const std::string& s, size_t max_len) {
  std::string l = s.substr(0, s.find('\n'));
  if (l.size() > max_len) l = l.substr(0, max_len - 3) + "...";
  return l;
}

double num(const json& j, const char* key, double fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string str(const json& j, const char* key, const std::string& fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

json deep_merge(const json& base, const json& over) {
  if (!base.is_object() || !over.is_object()) return over;
  json out = base;
  for (auto it = over.begin(); it != over.end(); ++it)
    out[it.key()] = out.contains(it.key()) ? deep_merge(out[it.key()], it.value()) : it.value();
  return out;
}

std::string family_of(const std::string& name) { return name.substr(0, name.find('/')); }

std::string gib_text(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  return buf;
}

}  // namespace memfit::cli::validate
