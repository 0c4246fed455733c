// The bitsandbytes context table (core/src/bitsandbytes.cpp) and what it changes in the activation
// model: before 0.43.2 (9e753741, #1270) MatMul4Bit keeps its input A on ctx.tensors, so every
// 4-bit Linear holds its input, adapted or not; from 0.43.2 on it keeps (None, B).
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "activations.hpp"
#include "bitsandbytes.hpp"
#include "memfit/api.hpp"
#include "states.hpp"

using nlohmann::json;
using namespace memfit;
using namespace memfit::detail;

namespace {

std::string error_of(const std::string& version) {
  try {
    (void)bnb_context(version);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

json tiny_llama() {
  std::ifstream f(std::string(MEMFIT_DATA_DIR) + "/validation/tiny_configs/llama-tiny.json");
  return json::parse(f);
}

/// Layer 1 of llama-tiny, QLoRA nf4 (LoRA r8 on q_proj + v_proj, no dropout), bf16, CUDA, b=2 s=64;
/// prepare_kbit (PEFT prepare_model_for_kbit_training) upcasts the norms, so their outputs are fp32.
LayerActivations qlora_layer(const std::string& bnb_version, bool checkpointing, bool prepare_kbit = false) {
  const json j = {{"model", {{"config", tiny_llama()}}},
                  {"task", "qlora"},
                  {"quantization", "nf4"},
                  {"precision", "bf16"},
                  {"attention", "sdpa"},
                  {"lora", {{"rank", 8}, {"alpha", 16}, {"targets", {"q_proj", "v_proj"}}, {"dropout", 0.0}}},
                  {"gradient_checkpointing", checkpointing},
                  {"micro_batch_size", 2},
                  {"sequence_length", 64},
                  {"device", "cuda"},
                  {"runtime", {{"framework", "transformers"}, {"bitsandbytes_version", bnb_version}, {"prepare_kbit", prepare_kbit}}}};
  const Request r = request_from_json(j);
  const ModelStates s = model_states(r, MixedMode::None);
  const size_t g = r.model.groups.size() - 1;
  return layer_activations(r.model, r.model.groups[g], r, s.linears[g], 128, 64);
}

}  // namespace

TEST_CASE("bitsandbytes table: MatMul4Bit keeps its input before 0.43.2 only", "[bitsandbytes]") {
  CHECK(bnb_context("0.41.1").four_bit_keeps_input);  // LitGPT resource tables
  CHECK(bnb_context("0.42.0").four_bit_keeps_input);  // LitGPT 0.4.x pin
  CHECK(bnb_context("0.43.1").four_bit_keeps_input);
  CHECK_FALSE(bnb_context("0.43.2").four_bit_keeps_input);
  CHECK_FALSE(bnb_context("0.50.2").four_bit_keeps_input);
  CHECK_FALSE(bnb_context("").four_bit_keeps_input);  // the default release
  // LLM.int8 keeps its input in every release; its int8 transposed copy only before 0.45.0
  CHECK(bnb_context("0.44.1").int8_keeps_input);
  CHECK(bnb_context("0.44.1").int8_transposed_bytes == 1);
  CHECK(bnb_context("0.45.0").int8_transposed_bytes == 0);
  CHECK_FALSE(bnb_context("0.45.5").runs_on_cpu);
  CHECK(bnb_context("0.46").runs_on_cpu);
}

TEST_CASE("bitsandbytes table: a malformed or too old version is an error naming the accepted form", "[bitsandbytes]") {
  for (const char* bad : {"latest", "0", "0.43.2.1", "0.43.2.1.5", "v0.43", "0..2", "0.43.", ">=0.42", "0.1234567", "0.43rc1"})
    CHECK_THAT(error_of(bad), Catch::Matchers::Contains("MAJOR.MINOR"));
  for (const char* good : {"0.43", "0.043.2", "1.0.0", ""}) CHECK(error_of(good).empty());  // "": the default
  CHECK_THAT(error_of("0.38.1"), Catch::Matchers::Contains("0.39.0 or newer"));
  json cpu = {{"model", {{"id", "meta-llama/Llama-2-7b-hf"}}}, {"task", "qlora"}, {"device", "cpu"},
              {"runtime", {{"bitsandbytes_version", "0.42.0"}}}};
  CHECK_THROWS_WITH(request_from_json(cpu), Catch::Matchers::Contains("no CPU backend"));
}

TEST_CASE("bitsandbytes < 0.43.2: each 4-bit Linear's input is held, checkpointed or not", "[bitsandbytes]") {
  // llama-tiny layer, 128 tokens, bf16 (2 B). LoRA on q/v already keeps the attention norm's
  // output; the old MatMul4Bit adds the inputs only frozen Linears would drop: o_proj's (h),
  // gate/up's shared post-attention norm output (h) and down_proj's (intermediate).
  const json c = tiny_llama();
  const u64 h = c["hidden_size"].get<u64>(), i = c["intermediate_size"].get<u64>();
  const u64 extra = 128 * 2 * (h + h + i);
  const LayerActivations before = qlora_layer("0.42.0", false), after = qlora_layer("0.43.2", false);
  CHECK(before.saved - after.saved == extra);
  CHECK(after.checkpoint_ctx_held == 0);
  // checkpointed: all four inputs (q/k/v's too) stay alive with the layer's first-forward contexts
  const LayerActivations gc_before = qlora_layer("0.42.0", true), gc_after = qlora_layer("0.43.2", true);
  CHECK(gc_before.checkpoint_ctx_held == 128 * 2 * (h + h + h + i));
  CHECK(gc_after.checkpoint_ctx_held == 0);
  CHECK(gc_before.checkpoint_saved == gc_after.checkpoint_saved);
  // prepare_kbit: the norm outputs are fp32 and Linear4bit casts x.to(compute_dtype) (bf16) per
  // Linear, so each of q/k/v and gate/up holds a bf16 copy of its own: 3h + h + 2h + i
  CHECK(qlora_layer("0.42.0", true, true).checkpoint_ctx_held == 128 * 2 * (6 * h + i));
  CHECK(qlora_layer("0.43.2", true, true).checkpoint_ctx_held == 0);
}
