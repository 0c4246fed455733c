// The RMSNorm families' tensor lists (layer_ops_rms.cpp), LoRA and autocast edits, against the
// CPU suite's measurements (data/measurements/cpu-suite-full.jsonl). Nothing here was fitted on
// these records: the lists follow derivatives.yaml and the modeling files.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "layer_ops.hpp"
#include "layer_ops_rms.hpp"
#include "memfit/allocator.hpp"
#include "memfit/library.hpp"
#include "memfit/request.hpp"
#include "records.hpp"
#include "schedule.hpp"

using namespace memfit;
using namespace memfit::sched;
using namespace memfit::testing;

namespace {

struct Measured {
  std::string name;
  nlohmann::json request;
  u64 peak = 0;
};

std::vector<Measured> suite_records(const char* file = "cpu-suite-full.jsonl") {
  std::vector<Measured> out;
  for (const RecordLine& l : record_lines(file))
    if (!l.measured.is_null() && l.measured.contains("peak_allocated_bytes"))
      out.push_back({l.name, l.request, l.measured["peak_allocated_bytes"].get<u64>()});
  return out;
}

std::optional<StepSetup> setup_of(const Measured& m) {
  try {
    return step_setup(estimator_request(m.request));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

double pct(double est, double ref) { return 100.0 * (est - ref) / ref; }

bool in_scope(const std::string& name) {
  for (const char* f : {"llama/", "mistral/", "qwen2/", "qwen3/", "gemma/", "gemma2/", "phi3/", "mixtral/", "qwen2_moe/",
                        "qwen3_moe/", "deepseek_v3/", "olmo2/", "smollm3/", "gemma3/", "gpt_oss/"})
    if (name.rfind(f, 0) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("LoRA: every adapter's lifetimes name entries of its list (all-linear and q/v)") {
  for (bool half : {false, true})
    for (bool all : {false, true}) {
      LayerSetup s;
      s.half = half;
      s.full = false;
      s.lora_all = all;
      s.lora_qv = !all;
      OpList first = decoder_layer(s);
      edit_input_needs_no_grad(first);
      for (const OpList& l : {decoder_layer(s), head_and_loss(s), first})
        for (const TensorOp& t : l) {
          INFO((half ? "half " : "fp32 ") << (all ? "all " : "qv ") << t.name << " dies after " << t.dies_after
                                          << " / residual of " << t.residual_of);
          if (!t.dies_after.empty() && t.dies_after != "layer_out" && t.dies_after != "backward_end")
            CHECK(find_op(l, t.dies_after) != nullptr);
          if (!t.residual_of.empty()) CHECK(find_op(l, t.residual_of) != nullptr);
        }
    }
}

TEST_CASE("LoRA: the frozen base Linear's gradient is summed with the adapter's (two [T, in] alive)") {
  LayerSetup s;
  s.full = false;
  s.lora_all = true;
  const OpList l = decoder_layer(s);
  // add(result, lora_B(lora_A(x)) * scaling): its backward hands the gradient to the base Linear too
  REQUIRE(find_op(l, "down_proj.out") != nullptr);
  CHECK(find_op(l, "down_proj.out")->residual_of == "down_proj.base");
  CHECK_FALSE(find_op(l, "down_proj.base")->grad_input.empty);
  // a frozen lm_head keeps nothing of its input
  CHECK_FALSE(find_op(head_and_loss(s), "norm1.out")->saved);
}

TEST_CASE("OLMo-2 and Gemma3: the norms their edits are about; every lifetime names an entry") {
  for (const FamilyEdits* f : {&kOlmo2Edits, &kGemma3Edits})
    for (bool full : {true, false})
      for (bool half : {false, true})
        for (bool eager : {false, true}) {
          LayerSetup s;
          s.family = f, s.full = full, s.half = half, s.eager = eager, s.lora_all = !full, s.gqa = true;
          OpList first = decoder_layer(s);
          edit_input_needs_no_grad(first);
          for (const OpList& l : {decoder_layer(s), head_and_loss(s), embedding(s), first})
            for (const TensorOp& t : l) {
              INFO((f == &kOlmo2Edits ? "olmo2 " : "gemma3 ") << full << half << eager << " " << t.name);
              if (!t.dies_after.empty() && t.dies_after != "layer_out" && t.dies_after != "decoder_end" &&
                  t.dies_after != "backward_end")
                CHECK(find_op(l, t.dies_after) != nullptr);
              if (!t.residual_of.empty()) CHECK(find_op(l, t.residual_of) != nullptr);
            }
        }
  Dims d;
  d.b = 2, d.s = 64, d.h = 128, d.q = 128, d.kv = 32, d.a = 4, d.kv_heads = 1, d.head_dim = 32;
  LayerSetup o;
  o.family = &kOlmo2Edits;
  const OpList olmo2 = decoder_layer(o);
  // no norm before attention or MLP; q_norm over the whole q width: one variance per token
  CHECK(find_op(olmo2, "norm1.pow") == nullptr);
  CHECK(find_op(olmo2, "q_norm.mean")->shape.elements(d) == 128);
  CHECK(find_op(olmo2, "post_ff.out")->dies_after == "mlp.residual");
  // fp32 LoRA: lora_A keeps the layer input itself, also where that input needs no gradient
  o.full = false, o.lora_all = true;
  OpList olmo2_first = decoder_layer(o);
  edit_input_needs_no_grad(olmo2_first);
  CHECK(find_op(olmo2_first, "input")->saved);
  // half-precision LoRA: the adapters cast their input (PEFT), as in the Llama lists
  o.half = true;
  CHECK(find_op(decoder_layer(o), "q.lora_in") != nullptr);
  LayerSetup g;
  g.family = &kGemma3Edits;
  // Gemma3: a variance per head of q and k, two rotary pairs
  CHECK(find_op(decoder_layer(g), "q_norm.mean")->shape.elements(d) == 128 * 4);
  CHECK(find_op(decoder_layer(g), "k_norm.mean")->shape.elements(d) == 128);
  CHECK(find_op(embedding(g), "rotary.cos_local") != nullptr);
}

TEST_CASE("gpt-oss: the sink column widens the softmax, the experts' clamped SwiGLU, the rotary on halves") {
  Dims d;
  d.b = 2, d.s = 64, d.h = 128, d.q = 128, d.kv = 32, d.a = 8, d.head_dim = 16, d.i = 128, d.experts = 4, d.topk = 2;
  for (bool half : {false, true}) {
    LayerSetup s;
    s.family = &kGptOssEdits, s.eager = true, s.gqa = true, s.half = half;
    const OpList l = decoder_layer(s);
    INFO("half " << half);
    // softmax over [b, heads, s, s + 1] in the model dtype: no fp32 copy, no cast back [O]
    CHECK(find_op(l, "attn.softmax")->shape.elements(d) == 2u * 8 * 64 * 65);
    CHECK(find_op(l, "attn.softmax")->dtype == Dt::Model);
    CHECK(find_op(l, "attn.probs_half") == nullptr);
    CHECK(find_op(l, "attn.row_argmax")->saved);
    // every lifetime names an entry of the list
    for (const TensorOp& t : l)
      if (!t.dies_after.empty() && t.dies_after != "layer_out" && t.dies_after != "backward_end")
        CHECK(find_op(l, t.dies_after) != nullptr);
    // the clamped SwiGLU keeps the clamped gate, the sigmoid, glu and up + 1; the up clamp dies
    for (std::string_view n : {"moe.gate", "moe.sigmoid", "moe.glu", "moe.up_plus_1"}) CHECK(find_op(l, n)->saved);
    CHECK_FALSE(find_op(l, "moe.up")->saved);
    // rotary on halves: x1 * cos etc. are [T, q / 2], their cat the rotated q
    CHECK(find_op(l, "q.x1_cos")->shape.elements(d) == 128u * 64);
    CHECK(find_op(l, "q.rot")->op == "cat");
    // the norms multiply in fp32 and cast in half precision (GptOssRMSNorm)
    if (half) CHECK(find_op(l, "norm1.out")->op == "_to_copy");
  }
}

// The gate for the families of this file: within 2 % of every covered measurement
// (the suite and the generated tuning cases).
TEST_CASE("the RMSNorm families' schedule is within 2 % of every covered CPU suite measurement") {
  int covered = 0;
  std::vector<Measured> all = suite_records();
  for (const char* file : {"cpu-suite-generated.jsonl", "cpu-suite-families.jsonl"})
    for (Measured& m : suite_records(file)) all.push_back(std::move(m));
  for (const Measured& m : all) {
    if (!in_scope(m.name)) continue;
    const auto s = setup_of(m);
    if (!s) continue;
    ++covered;
    const u64 est = peak_allocated(*s);
    INFO(m.name << ": measured " << m.peak << ", schedule " << est);
    CHECK(std::abs(pct(double(est), double(m.peak))) <= 2.0);
  }
  CHECK(covered >= 120);
}

// build/native/tests/memfit_tests "[.rms-table]": the table of sched-rms-table.md; with
// MEMFIT_DUMP=<case name> it prints what the schedule has alive at its peak.
TEST_CASE("[.rms-table] schedule vs measured, RMSNorm families", "[.rms-table]") {
  const char* dump = std::getenv("MEMFIT_DUMP");
  const char* filter = std::getenv("MEMFIT_FILTER");
  const char* at_name = std::getenv("MEMFIT_AT");  // with MEMFIT_DUMP: the first allocation of this name instead of the peak
  std::map<std::string, std::vector<std::int64_t>> traces;
  for (const RecordLine& l : record_lines("cpu-traces.jsonl"))
    if (!l.measured.is_null() && l.measured.contains("allocation_trace"))
      traces[l.name] = l.measured["allocation_trace"].get<std::vector<std::int64_t>>();
  std::printf("| case | measured | schedule | error %% | replayed trace reserved MiB | schedule reserved MiB |\n"
              "|---|---:|---:|---:|---:|---:|\n");
  std::vector<Measured> all = suite_records();
  for (Measured& m : suite_records("cpu-suite-generated.jsonl")) all.push_back(std::move(m));
  for (const Measured& m : all) {
    if (!in_scope(m.name) || (filter && m.name.find(filter) == std::string::npos)) continue;
    const auto s = setup_of(m);
    if (!s) continue;
    const u64 est = peak_allocated(*s);
    std::printf("| %s | %llu | %llu | %+.2f |", m.name.c_str(), (unsigned long long)m.peak, (unsigned long long)est,
                pct(double(est), double(m.peak)));
    if (auto it = traces.find(m.name); it != traces.end()) {
      const auto real = alloc::simulate(alloc::events_from_signed(it->second)).stats.peak_reserved;
      const auto sim = alloc::simulate(alloc::events_from_signed(step_trace(*s))).stats.peak_reserved;
      std::printf(" %.3f | %.3f |\n", real / 1048576.0, sim / 1048576.0);
    } else {
      std::printf(" | |\n");
    }
    if (!dump || m.name != dump) continue;
    std::vector<std::string> names;
    const auto trace = step_trace(*s, &names);
    std::vector<std::int64_t> sizes;
    std::vector<bool> live;
    u64 cur = 0, peak = 0;
    std::vector<bool> at_peak;
    for (std::int64_t e : trace) {
      if (e > 0) sizes.push_back(e), live.push_back(true), cur += u64(e);
      else live[size_t(-e - 1)] = false, cur -= u64(sizes[size_t(-e - 1)]);
      if (cur > peak && !at_name) peak = cur, at_peak = live;
      if (at_name && e > 0 && names[sizes.size() - 1] == at_name && at_peak.empty()) peak = cur, at_peak = live;
    }
    std::map<std::string, std::pair<u64, int>> rows;
    for (size_t k = 0; k < at_peak.size(); ++k)
      if (at_peak[k]) rows[names[k] + " " + std::to_string(sizes[k])].first += u64(sizes[k]), rows[names[k] + " " + std::to_string(sizes[k])].second++;
    std::printf("alive at the schedule's peak %llu (last: %s)\n", (unsigned long long)peak, names[at_peak.size() - 1].c_str());
    for (const auto& [k, v] : rows) std::printf("  %10llu x%d %s\n", (unsigned long long)v.first, v.second, k.c_str());
  }
}

TEST_CASE("the schedule frees every tensor at most once (LoRA, half, autocast)") {
  for (int variant = 0; variant < 6; ++variant) {
    StepSetup s;
    s.layer.full = variant >= 4;
    s.layer.lora_all = variant == 0 || variant == 2;
    s.layer.lora_qv = variant == 1 || variant == 3;
    s.layer.half = variant == 2 || variant == 3;
    s.layer.autocast = variant == 5;
    s.layer.gqa = true;
    s.dims = {2, 64, 128, 128, 32, 512, 8, 1024, 8, 16};
    s.dtypes = {s.layer.half ? 2u : 4u, 4};
    s.layers = 3;
    for (bool gc : {false, true}) {
      s.checkpointing = gc;
      std::vector<std::string> names;
      const auto t = step_trace(s, &names);
      std::vector<int> freed(names.size(), 0);
      for (std::int64_t e : t)
        if (e < 0) {
          const size_t k = size_t(-e - 1);
          INFO("variant " << variant << " gc " << gc << ": " << names[k] << " freed twice");
          CHECK(++freed[k] == 1);
        }
    }
  }
}
