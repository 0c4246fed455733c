// The LayerNorm families' tensor lists (layer_ops_layernorm): lifetimes name entries of their
// list, the edits change what they are about, and the periodic shortcut equals the full trace on
// every list the family table reaches. The accuracy against the CPU measurements is checked for
// every covered family by schedule_test.cpp.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "layer_ops_layernorm.hpp"
#include "memfit/allocator.hpp"
#include "memfit/library.hpp"
#include "memfit/request.hpp"
#include "records.hpp"
#include "schedule.hpp"

using namespace memfit;
using namespace memfit::sched;

namespace {

/// The families of layer_ops_layernorm.hpp, by their tiny configs (data/validation/tiny_configs).
constexpr const char* kFamilies[] = {"gpt_neox", "falcon", "phi", "starcoder2", "stablelm", "opt", "gpt2", "gpt_bigcode", "bloom", "biogpt", "gpt_neo", "gptj", "codegen"};

bool lookup(const std::string& id, nlohmann::json& c) { return bundled_config(id, c); }

/// A CPU training request on a family's tiny config.
Request tiny_request(const std::string& family, bool full, bool half, bool eager, bool gc, u64 layers) {
  std::ifstream in(std::string(MEMFIT_DATA_DIR) + "/validation/tiny_configs/" + family + "-tiny.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["num_hidden_layers"] = layers;
  if (config.contains("n_layer")) config["n_layer"] = layers;
  nlohmann::json req = {{"model", {{"config", config}}},
                        {"device", "cpu"},
                        {"task", full ? "full" : "lora"},
                        {"precision", half ? "bf16" : "fp32"},
                        {"attention", eager ? "eager" : "auto"},  // auto: SDPA where the family has it
                        {"gradient_checkpointing", gc},
                        {"micro_batch_size", 2},
                        {"sequence_length", 64},
                        {"optimizer", "adamw"}};
  if (!full) req["lora"] = {{"rank", 8}, {"alpha", 16}, {"targets", "all-linear"}};
  return parse_request(req, &lookup);
}

}  // namespace

TEST_CASE("the family table covers every LayerNorm family's tiny config") {
  for (const char* f : kFamilies) {
    INFO(f);
    CHECK(step_setup(tiny_request(f, true, false, false, false, 2)).has_value());
    CHECK(step_setup(tiny_request(f, false, true, true, false, 2)).has_value());
  }
}

TEST_CASE("every lifetime in the LayerNorm lists names an entry of its list") {
  for (const char* f : kFamilies)
    for (bool full : {true, false})
      for (bool half : {false, true})
        for (bool eager : {false, true}) {
          const auto s = step_setup(tiny_request(f, full, half, eager, false, 2));
          REQUIRE(s);
          OpList first = s->lists->layer(s->layer);
          s->lists->input_needs_no_grad(first);
          for (const OpList& l : {s->lists->layer(s->layer), s->lists->embedding(s->layer), s->lists->head(s->layer), first})
            for (const TensorOp& t : l) {
              INFO(f << ": " << t.name << " dies after " << t.dies_after << ", branch of " << t.branch_of);
              if (!t.dies_after.empty() && t.dies_after != "layer_out" && t.dies_after != "decoder_end" &&
                  t.dies_after != "next_layer" && t.dies_after != "backward_end")
                CHECK(find_op(l, t.dies_after) != nullptr);
              if (!t.branch_of.empty()) CHECK(find_op(l, t.branch_of) != nullptr);
              if (!t.residual_of.empty()) CHECK(find_op(l, t.residual_of) != nullptr);
            }
        }
}

TEST_CASE("the LayerNorm edits change the entries they are about") {
  LayerSetup base;
  base.act = Activation::Gelu;
  // native_layer_norm keeps its statistics; the trained norm has a weight and a bias gradient
  const OpList neox = kGptNeoxLists.layer(base);
  CHECK(find_op(neox, "ln1.mean")->saved);
  CHECK_FALSE(find_op(neox, "ln1.out")->bias.empty);
  // parallel residual: the attention branch reads the layer's incoming gradient
  CHECK(find_op(neox, "dense.out")->branch_of == "mlp.sum");
  // LoRA in half precision: each adapter keeps its own fp32 cast of its input; the norm's output
  // is kept by nothing else
  LayerSetup lora = base;
  lora.full = false;
  lora.half = true;
  const OpList l = kGptNeoxLists.layer(lora);
  REQUIRE(find_op(l, "qkv.lora_in") != nullptr);
  CHECK(find_op(l, "qkv.lora_in")->dtype == Dt::F32);
  CHECK_FALSE(find_op(l, "ln1.out")->saved);
  CHECK(find_op(l, "qkv.base")->weight.empty);
  // Falcon's eager path keeps contiguous copies of q and k, not the rotated tensors
  LayerSetup eager = base;
  eager.eager = true;
  const OpList falcon = kFalconLists.layer(eager);
  CHECK(find_op(falcon, "attn.q_copy")->saved);
  CHECK_FALSE(find_op(falcon, "q.rot")->saved);
  CHECK(find_op(falcon, "attn.lse") == nullptr);
  // CodeGen: _split_heads copies q, k and v only when a group of mp_num = 4 holds several heads;
  // in half precision the rotary runs in fp32 (the fp32 sin / cos promote it)
  LayerSetup codegen = eager;
  codegen.half = true;
  CHECK(find_op(kCodeGenLists.layer(codegen), "q.split") == nullptr);
  codegen.heads_split_copied = true;
  const OpList cg = kCodeGenLists.layer(codegen);
  REQUIRE(find_op(cg, "v.split") != nullptr);
  CHECK(find_op(cg, "v.split")->dies_after == "out_proj.out");
  CHECK(find_op(cg, "q.embed")->dtype == Dt::F32);
  CHECK(find_op(cg, "q.rotate")->dtype == Dt::Model);
}

TEST_CASE("the periodic shortcut equals the full simulation on the LayerNorm lists") {
  for (const char* f : kFamilies)
    for (bool full : {true, false})
      for (bool half : {false, true})
        for (bool eager : {false, true})
          for (bool gc : {false, true})
            for (u64 layers : {1u, 2u, 5u}) {
              auto s = step_setup(tiny_request(f, full, half, eager, gc, layers));
              if (!s && !full && gc) continue;  // a family whose row leaves out LoRA under checkpointing
              REQUIRE(s);
              for (bool cuda : {false, true}) {
                s->round_512 = cuda;
                INFO(f << " full " << full << " half " << half << " eager " << eager << " gc " << gc << " layers "
                       << layers << " cuda " << cuda);
                const auto trace = step_trace(*s);
                CHECK(peak_allocated(*s) == trace_peak(trace, cuda));
                // every free names a live allocation (a gradient handed to two consumers is freed once)
                CHECK_NOTHROW(alloc::events_from_signed(trace));
              }
            }
}

// A debugging aid, not a check: MEMFIT_DUMP_CASE=gpt_neox/full/fp32/nogc/sdpa writes the schedule's
// trace of that suite case to /tmp/memfit-schedule-trace.json (compare with cpu-traces.jsonl).
TEST_CASE("[.dump] the schedule's trace of one suite case", "[.dump]") {
  const char* name = std::getenv("MEMFIT_DUMP_CASE");
  if (!name) return;
  for (const memfit::testing::RecordLine& l : memfit::testing::record_lines("cpu-suite-full.jsonl")) {
    if (l.name != name) continue;
    const auto s = step_setup(memfit::testing::estimator_request(l.request));
    REQUIRE(s);
    std::ofstream out("/tmp/memfit-schedule-trace.json");
    out << nlohmann::json{{"name", name}, {"trace", step_trace(*s)}}.dump() << "\n";
  }
}
