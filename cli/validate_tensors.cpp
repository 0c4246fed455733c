// `memfit validate --tensors`: recorded tensors vs the core's lists (validate_tensors.hpp).
#include "validate_tensors.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "memfit/api.hpp"

namespace memfit::cli::validate {

namespace {

/// One tensor PyTorch created (a measure.tensors row).
struct Recorded {
  size_t row = 0;
  std::string op, dtype, shape;
  double bytes = 0, elements = 0;
  std::string born, died;  ///< phases: f forward, r recomputation, b backward, o optimizer, x other
  long died_after = -1;    ///< the row born last before it died
};

/// A list entry (tensor_lists_json).
struct Entry {
  std::string name, op, freed_after;
  double bytes = 0, elements = 0, element_bytes = 0;
  bool saved = false;
};

// The aten ops that may create the storage of a list entry whose op is written at the level of
// the Python source (an aten op whose name starts with the list's op matches too:
// nll_loss -> nll_loss_forward, _scaled_dot_product_flash_attention -> ..._for_cpu).
const std::map<std::string, std::set<std::string>>& creators() {
  static const std::map<std::string, std::set<std::string>> t = {
      {"linear", {"mm", "addmm", "bmm"}},  // linear = view + mm (+ bias: addmm) for 3-D inputs
      {"matmul", {"bmm", "mm"}},
      {"expand+reshape", {"clone", "_unsafe_view"}},  // reshape of an expanded view copies
      {"reshape", {"clone", "_unsafe_view"}},         // ... as does reshape of any non-contiguous view
      {"tensor", {"lift_fresh", "lift_fresh_copy"}},  // torch.tensor(...) inside a forward
      {"bernoulli_", {"empty_like", "bernoulli"}},    // dropout's mask: empty_like, filled in place
      {"contiguous", {"clone"}},
      // cos() * attention_scaling, cast to the model dtype: the product (or its cast) is what the layers read
      {"cos", {"mul", "_to_copy"}},
      {"sin", {"mul", "_to_copy"}},
      {"masked_fill", {"where", "masked_fill", "clone"}},
      {"_scaled_dot_product_flash_attention", {"_scaled_dot_product_efficient_attention"}},
  };
  return t;
}

bool creates(const std::string& list_op, const std::string& aten) {
  if (aten == list_op || (aten.rfind(list_op, 0) == 0 && list_op.size() > 2)) return true;
  const auto it = creators().find(list_op);
  return it != creators().end() && it->second.count(aten) > 0;
}

/// When a tensor died: "forward", "backward" or "step" (it outlived the backward).
std::string fate_of(const std::string& died) {
  if (died == "f" || died == "r") return "forward";
  if (died == "b") return "backward";
  return "step";
}

std::string died_text(const std::string& died) {
  const std::string fate = fate_of(died);
  return fate == "step" ? "outlives the backward" : "dies in the " + fate;
}

std::vector<Recorded> recorded_rows(const json& t) {
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < t["columns"].size(); ++i) col[t["columns"][i].get<std::string>()] = i;
  std::vector<Recorded> out;
  const json& rows = t["rows"];
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& r = rows[i];
    Recorded x;
    x.row = i;
    x.op = r[col.at("op")].get<std::string>();
    x.dtype = r[col.at("dtype")].get<std::string>();
    x.bytes = r[col.at("bytes")].get<double>();
    x.elements = 1;
    for (const json& d : r[col.at("shape")]) x.elements *= d.get<double>();
    x.shape = r[col.at("shape")].dump();
    x.born = r[col.at("born_phase")].get<std::string>() + std::to_string(r[col.at("born_layer")].get<long>());
    x.died = r[col.at("died_phase")].is_string() ? r[col.at("died_phase")].get<std::string>() : "";
    x.died_after = r[col.at("died_after")].get<long>();
    out.push_back(x);
  }
  return out;
}

/// Aligns a (recorded) and b (the list) in order, maximising the summed score of the pairs;
/// returns for each element of a the index in b it is paired with (-1: none).
template <class Score>
std::vector<long> align(size_t na, size_t nb, Score score) {
  std::vector<std::vector<int>> best(na + 1, std::vector<int>(nb + 1, 0));
  for (size_t i = na; i-- > 0;)
    for (size_t j = nb; j-- > 0;) {
      const int s = score(i, j);
      best[i][j] = std::max({best[i + 1][j], best[i][j + 1], s > 0 ? s + best[i + 1][j + 1] : 0});
    }
  std::vector<long> pair(na, -1);
  for (size_t i = 0, j = 0; i < na && j < nb;) {
    const int s = score(i, j);
    if (s > 0 && best[i][j] == s + best[i + 1][j + 1]) pair[i] = static_cast<long>(j), ++i, ++j;
    else if (best[i][j] == best[i + 1][j]) ++i;
    else ++j;
  }
  return pair;
}

std::string bytes_text(double b) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

struct Group {
  std::string list, where;
  std::vector<Recorded> fwd, bwd;
};

/// PyTorch's tensors of one layer paired with the list's entries.
struct Pairing {
  std::vector<long> pair;            ///< per recorded tensor: its list entry (-1: none)
  std::vector<bool> used;            ///< per list entry: paired
  std::map<size_t, long> list_at;    ///< recorded row -> the entry paired at or before it (in order)
  std::vector<std::string> reordered;  ///< entries paired out of order: "name|after what"
};

/// In order (bytes weigh most, then the op, then whether it lives as long as the list says, which
/// picks the list's tensor among equal candidates); then an entry PyTorch creates elsewhere in the
/// layer with the same op and bytes is paired out of order.
Pairing pair_forward(const std::vector<Recorded>& r, const std::vector<Entry>& list) {
  auto score = [&](size_t i, size_t j) {
    const bool op = creates(list[j].op, r[i].op), bytes = r[i].bytes == list[j].bytes;
    const bool fate = (fate_of(r[i].died) == "forward") != list[j].saved;
    return bytes || op ? 4 * bytes + 2 * op + fate : 0;
  };
  Pairing p{align(r.size(), list.size(), score), std::vector<bool>(list.size(), false), {}, {}};
  long last = -1;
  for (size_t i = 0; i < r.size(); ++i) {
    if (p.pair[i] >= 0) last = p.pair[i], p.used[static_cast<size_t>(p.pair[i])] = true;
    p.list_at[r[i].row] = last;
  }
  for (size_t j = 0; j < list.size(); ++j)
    for (size_t i = 0; i < r.size() && !p.used[j]; ++i)
      if (p.pair[i] < 0 && creates(list[j].op, r[i].op) && r[i].bytes == list[j].bytes) {
        p.pair[i] = static_cast<long>(j), p.used[j] = true;
        const long before = p.list_at[r[i].row];
        p.reordered.push_back(list[j].name + "|" + (before >= 0 ? list[static_cast<size_t>(before)].name : "(start)"));
      }
  return p;
}

/// What differs between a list entry and the tensor paired with it; true when nothing does.
bool check_pair(const Entry& e, const Recorded& x, const std::vector<Entry>& list, const Pairing& p,
                const std::function<void(const std::string&, const std::string&)>& add) {
  const bool op = creates(e.op, x.op);
  if (!op) add("op", "list: " + e.op + ", PyTorch: " + x.op + " " + x.shape);
  if (x.elements != e.elements)
    add("size", "list " + bytes_text(e.bytes) + ", PyTorch " + x.shape + " " + x.dtype + " " + bytes_text(x.bytes));
  else if (x.bytes != e.bytes)
    add("dtype", "list " + bytes_text(e.element_bytes) + "/element, PyTorch " + x.dtype);
  bool ok = op && x.bytes == e.bytes;
  const std::string fate = fate_of(x.died);
  if (e.freed_after == "layer_out") return ok;  // handed on: the next list decides
  if (e.freed_after == "backward_end" && fate == "forward") {
    add("freed", "the list keeps it until the backward has run, PyTorch freed it in the forward");
    return false;
  }
  if (e.freed_after == "backward_end") return ok;
  if (e.saved && fate == "forward") {
    add("saved", "the list keeps it for backward, PyTorch freed it in the forward");
    return false;
  }
  if (!e.saved && fate != "forward") {
    add("freed", "the list frees it after " + e.freed_after + ", PyTorch kept it (" + fate + ")");
    return false;
  }
  const auto at = p.list_at.find(static_cast<size_t>(x.died_after));
  if (e.saved || e.freed_after == "decoder_end" || at == p.list_at.end()) return ok;
  const std::string freed_at = at->second >= 0 ? list[static_cast<size_t>(at->second)].name : "(start)";
  if (freed_at == e.freed_after) return ok;
  add("freed_at", "list: after " + e.freed_after + ", PyTorch: after " + freed_at);
  return false;
}

/// The forward of one group against its list: pairs, then what differs.
void compare_forward(const Group& g, const std::vector<Entry>& list, TensorCase& out) {
  const std::vector<Recorded>& r = g.fwd;
  const Pairing p = pair_forward(r, list);
  auto add = [&](const std::string& kind, const std::string& what, const std::string& detail) {
    out.mismatches.push_back({g.list, kind, what, g.where + ": " + detail});
  };
  for (const std::string& o : p.reordered)
    add("order", o.substr(0, o.find('|')), "PyTorch creates it after " + o.substr(o.find('|') + 1));
  out.fwd_total += list.size();
  for (size_t i = 0; i < r.size(); ++i) {
    const Recorded& x = r[i];
    if (p.pair[i] < 0) {
      ++out.fwd_total;
      add("extra", x.op + " " + x.dtype,
          x.op + " " + x.shape + " " + x.dtype + " " + bytes_text(x.bytes) + ", " + died_text(x.died));
      continue;
    }
    const Entry& e = list[static_cast<size_t>(p.pair[i])];
    out.fwd_matched += check_pair(e, x, list, p, [&](const std::string& kind, const std::string& d) { add(kind, e.name, d); });
  }
  for (size_t j = 0; j < list.size(); ++j)
    if (!p.used[j]) add("missing", list[j].name, list[j].op + " " + bytes_text(list[j].bytes));
}

/// The backward of one group: the list's creations found among PyTorch's, by bytes in order.
void compare_backward(const Group& g, const json& list, TensorCase& out) {
  const auto& r = g.bwd;
  auto score = [&](size_t i, size_t j) { return r[i].bytes == list[j]["bytes"].get<double>() ? 1 : 0; };
  std::vector<long> pair = align(r.size(), list.size(), score);
  std::vector<bool> used(list.size(), false);
  for (long p : pair)
    if (p >= 0) used[static_cast<size_t>(p)] = true;
  // the engine's order among independent branches (q/k/v) is its own: found anywhere counts
  for (size_t j = 0; j < list.size(); ++j)
    for (size_t i = 0; i < r.size() && !used[j]; ++i)
      if (pair[i] < 0 && score(i, j)) pair[i] = static_cast<long>(j), used[j] = true;
  out.bwd_total += list.size();
  for (size_t j = 0; j < list.size(); ++j) {
    if (used[j]) ++out.bwd_found;
    else
      out.mismatches.push_back({g.list, "bwd_missing", list[j]["name"].get<std::string>(),
                                g.where + ": " + bytes_text(list[j]["bytes"].get<double>()) + " not created"});
  }
  out.bwd_unlisted += static_cast<size_t>(std::count(pair.begin(), pair.end(), -1));
}

std::vector<Entry> entries_of(const json& l) {
  std::vector<Entry> out;
  for (const json& e : l["forward"])
    out.push_back({e["name"], e["op"], e["freed_after"], e["bytes"].get<double>(), e["elements"].get<double>(),
                   e["element_bytes"].get<double>(), e["saved"].get<bool>()});
  return out;
}

TensorCase compare_case(const Case& k, const json& t) {
  TensorCase out;
  out.c = &k;
  const json lists = json::parse(memfit::tensor_lists_json(k.request.dump()));
  if (lists.contains("error") || !lists.value("covered", false)) {
    out.reason = lists.contains("error") ? str(lists, "error") : str(lists, "reason");
    return out;
  }
  out.covered = true;
  const long layers = t.value("layers", 0L);
  if (layers != lists["layers"].get<long>()) {
    out.mismatches.push_back({"model", "layers", std::to_string(layers), "PyTorch ran " + std::to_string(layers) +
                              " decoder layers, the lists " + lists["layers"].dump()});
    return out;
  }
  std::map<std::string, json> by_name;
  for (const json& l : lists["lists"]) by_name[l["list"].get<std::string>()] = l;
  // the decoder list that describes a layer (the decoder may be groups of layers with their own
  // lists; two groups may share a name)
  auto decoder_list = [&](long layer) -> const json& {
    for (const json& l : lists["lists"])
      if (l.contains("layers") && layer >= l["layers"]["first"].get<long>() &&
          layer < l["layers"]["first"].get<long>() + l["layers"]["count"].get<long>())
        return l;
    return by_name["layer"];
  };
  const bool gc = lists["checkpointing"].get<bool>();
  const std::vector<Recorded> rows = recorded_rows(t);
  for (long layer = -1; layer <= layers; ++layer) {
    Group g;
    const json& list = layer < 0 ? by_name["embedding"] : layer == layers ? by_name["head"] : decoder_list(layer);
    g.list = list["list"].get<std::string>();
    g.where = layer < 0 ? "embedding" : layer == layers ? "head" : "layer " + std::to_string(layer);
    const bool recomputed = gc && layer >= 0 && layer < layers;
    const std::string fwd = (recomputed ? "r" : "f") + std::to_string(layer), bwd = "b" + std::to_string(layer);
    for (const Recorded& x : rows) {
      if (x.born == fwd) g.fwd.push_back(x);
      else if (x.born == bwd) g.bwd.push_back(x);
    }
    compare_forward(g, entries_of(list), out);
    compare_backward(g, list["backward"], out);
  }
  return out;
}

/// The --known file: "FAMILIES LIST KIND WHAT  # why" a line; FAMILIES is "*" (any family) or
/// names separated by commas.
struct Known {
  std::map<std::string, std::set<std::string>> families;  ///< "list kind what" -> families
  bool has(const std::string& key) const {
    const size_t space = key.find(' ');
    if (space == std::string::npos) return false;
    const auto it = families.find(key.substr(space + 1));
    return it != families.end() && (it->second.count("*") || it->second.count(key.substr(0, space)));
  }
};

Known read_known(const std::string& path) {
  Known k;
  if (path.empty()) return k;
  std::ifstream in(path);
  if (!in) throw Fatal("cannot read " + path + " (--known): a file of known mismatches, one a line");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line.substr(0, line.find('#')));
    std::string fams, w, rest;
    if (!(words >> fams)) continue;
    while (words >> w) rest += (rest.empty() ? "" : " ") + w;
    if (rest.empty()) throw Fatal(path + ": \"" + line + "\" is not FAMILIES LIST KIND WHAT");
    std::istringstream names(fams);
    for (std::string f; std::getline(names, f, ',');) k.families[rest].insert(f);
  }
  return k;
}

}  // namespace

std::vector<TensorCase> compare_tensors(const std::vector<Case>& cases) {
  std::vector<TensorCase> out;
  for (const Case& k : cases)
    for (const json& r : k.results)
      if (r.contains("measured") && r["measured"].contains("tensors") && !k.request.is_null()) {
        out.push_back(compare_case(k, r["measured"]["tensors"]));
        break;
      }
  return out;
}

size_t print_tensor_report(const std::vector<TensorCase>& rows, const std::string& known_path, bool markdown) {
  if (rows.empty()) return 0;
  const Known known = read_known(known_path);
  struct Family {
    size_t cases = 0, fm = 0, ft = 0, bf = 0, bt = 0, bu = 0;
    std::string reason;
    std::map<std::string, std::vector<std::string>> seen;  // key -> where (case: detail)
  };
  std::map<std::string, Family> fams;
  for (const TensorCase& t : rows) {
    Family& f = fams[t.c->family];
    if (!t.covered) {
      f.reason = t.reason;
      continue;
    }
    ++f.cases, f.fm += t.fwd_matched, f.ft += t.fwd_total, f.bf += t.bwd_found, f.bt += t.bwd_total, f.bu += t.bwd_unlisted;
    for (const TensorMismatch& m : t.mismatches) f.seen[m.key(t.c->family)].push_back(t.c->name + " " + m.detail);
  }
  size_t unlisted = 0;
  std::printf(markdown ? "\n### Tensor lists: each layer's tensors, PyTorch vs the core's lists\n\n"
                       : "\ntensor lists: each layer's tensors, PyTorch vs the core's lists (in order, by op and bytes)\n\n");
  std::printf(markdown ? "| family | cases | forward matched / total | backward found / total (+ unlisted temporaries) | mismatches (not known) |\n|---|---:|---:|---:|---:|\n"
                       : "%-14s %5s %22s %34s %22s\n", "family", "cases", "forward matched/total", "backward found/total (+temps)", "mismatches (not known)");
  for (const auto& [name, f] : fams) {
    size_t fresh = 0;
    for (const auto& [key, where] : f.seen) fresh += !known.has(key);
    unlisted += fresh;
    char fwd[40], bwd[48], mm[40];
    std::snprintf(fwd, sizeof fwd, "%zu / %zu", f.fm, f.ft);
    std::snprintf(bwd, sizeof bwd, "%zu / %zu (+%zu)", f.bf, f.bt, f.bu);
    std::snprintf(mm, sizeof mm, "%zu (%zu)", f.seen.size(), fresh);
    if (f.cases == 0) std::printf(markdown ? "| %s | - | no tensor list yet | | |\n" : "%-14s %5s  no tensor list yet\n", name.c_str(), "-");
    else if (markdown) std::printf("| %s | %zu | %s | %s | %s |\n", name.c_str(), f.cases, fwd, bwd, mm);
    else std::printf("%-14s %5zu %22s %34s %22s\n", name.c_str(), f.cases, fwd, bwd, mm);
  }
  for (const auto& [name, f] : fams) {
    if (f.seen.empty()) continue;
    std::printf(markdown ? "\n#### %s\n\n| mismatch (family list kind what) | occurrences | known | first seen |\n|---|---:|---|---|\n"
                         : "\n%s mismatches (family list kind what; count; first seen):\n", name.c_str());
    for (const auto& [key, where] : f.seen) {
      const bool is_known = known.has(key);
      if (markdown) std::printf("| %s | %zu | %s | %s |\n", key.c_str(), where.size(), is_known ? "yes" : "**no**", where.front().c_str());
      else std::printf("  %s%-52s x%-3zu %s\n", is_known ? "  " : "! ", key.c_str(), where.size(), where.front().c_str());
    }
  }
  std::printf("\n%zu mismatch kinds not in the known list%s%s\n", unlisted, known_path.empty() ? "" : " ",
              known_path.empty() ? " (no --known file given)" : known_path.c_str());
  return unlisted;
}

}  // namespace memfit::cli::validate
