// The lists as tables (sched::tensor_tables, memfit::tensor_lists_json), which `memfit validate
// --tensors` compares with the tensors PyTorch creates: a table must be what the schedule pass
// allocates, in the same order, and a request the lists do not describe must say so.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memfit/api.hpp"
#include "schedule.hpp"

using namespace memfit;
using namespace memfit::sched;

namespace {

StepSetup tiny(bool full, bool half, u64 layers) {
  StepSetup s;
  s.layer = {half, false, true, full, !full, false, false};
  s.dims = {2, 64, 128, 128, 32, 512, 8, 1024, 8, 16};
  s.dtypes = {half ? 2u : 4u, 4};
  s.layers = layers;
  s.tied_embeddings = true;
  return s;
}

/// The allocations of the first forward in step_trace: after the weights (`params` tensors) and
/// the input ids, in order.
std::vector<u64> first_forward(const StepSetup& s, size_t params, size_t count) {
  std::vector<u64> out;
  size_t seen = 0;
  for (std::int64_t e : step_trace(s)) {
    if (e <= 0) continue;
    if (seen++ < params + 1) continue;
    out.push_back(static_cast<u64>(e));
    if (out.size() == count) break;
  }
  return out;
}

std::vector<u64> table_forward(const StepSetup& s) {
  std::vector<u64> out;
  for (const ListTable& t : tensor_tables(s)) {
    const u64 copies = t.list == "layer" ? s.layers - (s.layer.full || s.checkpointing ? 0 : 1) : 1;
    for (u64 k = 0; k < copies; ++k)
      for (const TensorRow& r : t.forward) out.push_back(r.bytes);
  }
  return out;
}

}  // namespace

TEST_CASE("tensor tables: the forward rows are what the schedule allocates, in order") {
  // tied embeddings: 2 outer weights; 9 per full layer, + 14 LoRA matrices (all-linear)
  for (const auto& [s, params] : {std::pair{tiny(true, false, 3), 2 + 3 * 9}, std::pair{tiny(false, true, 3), 2 + 3 * 23}}) {
    const std::vector<u64> table = table_forward(s);
    CHECK(first_forward(s, static_cast<size_t>(params), table.size()) == table);
    for (const ListTable& t : tensor_tables(s))
      for (const TensorRow& r : t.forward) CHECK(r.bytes == r.elements * r.element_bytes);
  }
}

TEST_CASE("tensor tables: a full layer's backward creates one gradient per weight of the layer") {
  const StepSetup s = tiny(true, false, 2);
  const Dims& d = s.dims;
  u64 grads = 0;
  for (const ListTable& t : tensor_tables(s))
    if (t.list == "layer")
      for (const BackwardRow& r : t.backward)
        if (r.name.ends_with(".weight_grad")) grads += r.bytes;
  // two norms, q, k, v, o, gate, up, down (modeling_llama.py)
  CHECK(grads == 4 * (2 * d.h + d.h * d.q + 2 * d.h * d.kv + d.q * d.h + 3 * d.h * d.i));
}

TEST_CASE("tensor_lists_json: the lists of a covered request, a reason otherwise") {
  using nlohmann::json;
  const json llama = json::parse(tensor_lists_json(R"({"model": {"id": "meta-llama/Llama-2-7b-hf"}, "task": "full",
    "precision": "bf16", "micro_batch_size": 1, "sequence_length": 512})"));
  REQUIRE(llama.value("covered", false));
  CHECK(llama["layers"] == 32);
  std::vector<std::string> names;
  for (const json& l : llama["lists"]) names.push_back(l["list"]);
  CHECK(names == std::vector<std::string>{"embedding", "layer", "head"});
  const json gpt2 = json::parse(tensor_lists_json(R"({"model": {"id": "openai-community/gpt2"}, "task": "full"})"));
  CHECK_FALSE(gpt2.value("covered", true));
  CHECK_THAT(gpt2["reason"].get<std::string>(), Catch::Matchers::Contains("gpt2"));
  CHECK(json::parse(tensor_lists_json("{")).contains("error"));
}
