#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "memfit/api.hpp"
#include "memfit/planner.hpp"

using nlohmann::json;
using namespace memfit;

namespace {
Plan plan_for(const char* model, int gpus, const char* task = "full") {
  json j = {{"model", {{"id", model}}}, {"task", task}, {"precision", "amp_bf16"}, {"sequence_length", 2048},
            {"gradient_checkpointing", true}, {"cluster", {{"gpu", {{"name", "A100-80GB"}}}, {"num_gpus", gpus}}}};
  return plan(request_from_json(j));
}
}  // namespace

TEST_CASE("each candidate's max micro-batch fits with 5 % headroom and one more does not", "[planner]") {
  const Plan p = plan_for("meta-llama/Llama-2-7b-hf", 8);
  REQUIRE(p.recommended >= 0);
  const u64 limit = (u64{81920} << 20) / 100 * 95;  // A100-80GB minus the default 5 % headroom
  int checked = 0;
  for (const PlanCandidate& c : p.candidates) {
    if (c.max_micro_batch == 0 || c.max_micro_batch >= 16384) continue;
    Request r = request_from_json({{"model", {{"id", "meta-llama/Llama-2-7b-hf"}}}, {"precision", "amp_bf16"},
                                   {"sequence_length", 2048}, {"gradient_checkpointing", true},
                                   {"gpu", {{"name", "A100-80GB"}}}, {"num_gpus", 8}});
    r.parallelism = c.parallelism;
    r.micro_batch_size = c.max_micro_batch;
    CHECK(estimate(r).device_total_bytes <= limit);
    r.micro_batch_size += 1;
    CHECK(estimate(r).device_total_bytes > limit);
    ++checked;
  }
  CHECK(checked > 5);
}

TEST_CASE("the plan ranks fitting layouts by throughput and explains the choice", "[planner]") {
  const Plan p = plan_for("meta-llama/Llama-2-7b-hf", 8);
  for (size_t i = 1; i < p.candidates.size(); ++i) {
    if (p.candidates[i].max_micro_batch == 0) continue;
    CHECK(p.candidates[i - 1].tokens_per_s >= p.candidates[i].tokens_per_s);
  }
  CHECK_THAT(p.recommendation, Catch::Matchers::Contains("tokens/s"));
  CHECK_FALSE(p.llmem_choice.empty());
  // DDP cannot hold 16 bytes per parameter of a 7B model on 80 GB
  for (const PlanCandidate& c : p.candidates)
    if (c.label == "ddp") CHECK(c.max_micro_batch == 0);
}

TEST_CASE("the grid has one cell per candidate and micro-batch, growing with the batch", "[planner]") {
  const Plan p = plan_for("meta-llama/Llama-3.2-1B", 2, "lora");
  for (const PlanCandidate& c : p.candidates) {
    REQUIRE(c.grid_device_bytes.size() == p.grid_batches.size());
    for (size_t i = 1; i < c.grid_device_bytes.size(); ++i) CHECK(c.grid_device_bytes[i] >= c.grid_device_bytes[i - 1]);
  }
}

TEST_CASE("one GPU: single and offload layouts only", "[planner]") {
  const Plan p = plan_for("meta-llama/Llama-3.2-1B", 1);
  for (const PlanCandidate& c : p.candidates) CHECK(c.parallelism.dp == 1);
  CHECK(p.candidates.size() == 3);
}

TEST_CASE("a larger micro-batch runs at a higher utilisation, so throughput rewards it", "[planner]") {
  const Plan p = plan_for("meta-llama/Llama-3.2-1B", 8, "lora");
  REQUIRE(p.recommended >= 0);
  // with a small model every layout fits large batches; the recommendation is not a
  // micro-batch-1 layout when others fit 8 or more
  CHECK(p.candidates[static_cast<size_t>(p.recommended)].max_micro_batch > 1);
}

namespace {
json no_fit_request() {
  // 70B full fine-tuning at 8k tokens, no checkpointing, on 8 x A100-80GB: no layout fits
  return {{"model", {{"id", "meta-llama/Llama-3.1-70B"}}}, {"sequence_length", 8192},
          {"gpu", {{"name", "A100-80GB"}}}, {"num_gpus", 8}};
}
}  // namespace

TEST_CASE("nothing fits: the closest layout, by how much it misses, and single changes that do fit", "[planner]") {
  const json request = no_fit_request();
  const Plan p = plan(request_from_json(request));
  REQUIRE(p.recommended == -1);
  REQUIRE(p.nothing_fits);
  const PlanCandidate& closest = p.candidates[p.nothing_fits->closest];
  for (const PlanCandidate& c : p.candidates) CHECK(c.at_max.device_total_bytes >= closest.at_max.device_total_bytes);
  CHECK(p.nothing_fits->missing_bytes == closest.at_max.device_total_bytes - p.budget_bytes);
  CHECK(p.recommendation.find("closest layout, " + closest.label) != std::string::npos);
  bool checkpointing = false, gpus = false;
  for (const Suggestion& s : p.nothing_fits->suggestions) {
    checkpointing |= s.change == Change::Checkpointing;
    gpus |= s.change == Change::NumGpus;
    if (!s.fits) continue;
    // the claim holds: the changed request has a layout that fits, at the figure given
    json changed = request;
    if (s.change == Change::Checkpointing) changed["gradient_checkpointing"] = true;
    if (s.change == Change::Lora) changed["task"] = "lora";
    if (s.change == Change::Qlora) changed["task"] = "qlora";
    if (s.change == Change::SequenceLength) changed["sequence_length"] = s.value;
    if (s.change == Change::NumGpus) changed["num_gpus"] = s.value;
    const Plan after = plan(request_from_json(changed));
    CHECK(after.recommended >= 0);
    u64 smallest = UINT64_MAX;
    for (const PlanCandidate& c : after.candidates) smallest = std::min(smallest, c.grid_device_bytes[0]);
    CHECK(smallest == s.per_gpu_bytes);
  }
  CHECK(checkpointing);
  CHECK(gpus);
}

TEST_CASE("nothing fits: never suggests what the request already does", "[planner]") {
  json request = no_fit_request();
  request["gradient_checkpointing"] = true;
  request["task"] = "qlora";
  request["sequence_length"] = 131072;  // activations alone overflow, whatever is offloaded
  request["gpu"] = {{"name", "RTX4090-24GB"}};
  request["num_gpus"] = 1;
  const Plan p = plan(request_from_json(request));
  REQUIRE(p.nothing_fits);
  for (const Suggestion& s : p.nothing_fits->suggestions) {
    CHECK(s.change != Change::Checkpointing);
    CHECK(s.change != Change::Qlora);
    CHECK(s.change != Change::Lora);
  }
}

TEST_CASE("nothing fits: a change that does not fit is listed only if it gets closer", "[planner]") {
  // QLoRA at a long sequence on 4 x RTX 4090: the activations of one sequence set the peak, and
  // more GPUs do not split them, so "4096 GPUs instead of 4, still too big" must not be offered
  const json request = {{"model", {{"id", "meta-llama/Llama-3.1-8B"}}}, {"task", "qlora"}, {"sequence_length", 8192},
                        {"cluster", {{"gpu", {{"name", "RTX4090-24GB"}}}, {"num_gpus", 4}}}};
  const Plan p = plan(request_from_json(request));
  REQUIRE(p.nothing_fits);
  const u64 now = p.candidates[p.nothing_fits->closest].at_max.device_total_bytes;
  bool fitting = false;
  for (const Suggestion& s : p.nothing_fits->suggestions) {
    fitting |= s.fits;
    if (!s.fits) CHECK(s.per_gpu_bytes < now);
    CHECK(s.change != Change::NumGpus);
  }
  CHECK(fitting);  // a shorter sequence does fit
}

TEST_CASE("an error every layout hits is the plan's error, not \"nothing fits\"", "[planner]") {
  const json request = {{"model", {{"id", "openai-community/gpt2"}}}, {"task", "lora"},
                        {"lora", {{"targets", {"foo_proj"}}}}, {"num_gpus", 8}};
  CHECK_THROWS_WITH(plan(request_from_json(request)), Catch::Contains("LoRA target"));
  const json out = json::parse(plan_json(request.dump()));
  REQUIRE(out.contains("error"));
  CHECK(out["error"].get<std::string>().find("c_attn") != std::string::npos);
}
