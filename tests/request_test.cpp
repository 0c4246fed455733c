// The request schema: defaults, every enumerated field, and errors that name what to fix.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "memfit/api.hpp"
#include "memfit/error.hpp"
#include "memfit/request.hpp"

using nlohmann::json;
using namespace memfit;

namespace {
json base() { return {{"model", {{"id", "meta-llama/Llama-2-7b-hf"}}}}; }
std::string error_of(const json& j) {
  try {
    (void)request_from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a request with only a model gets the documented defaults", "[request]") {
  const Request r = request_from_json(base());
  CHECK(r.task == Task::Full);
  CHECK(r.precision == Precision::AmpBf16);
  CHECK(r.optimizer == Optimizer::AdamW);
  CHECK(r.micro_batch_size == 4);
  CHECK(r.sequence_length == 2048);
  CHECK(r.gradient_accumulation_steps == 1);
  CHECK_FALSE(r.gradient_checkpointing);
  CHECK(r.attention == AttentionImpl::Sdpa);
  CHECK(r.gpu.name == "A100-80GB");
  CHECK(r.num_gpus == 1);
  CHECK(r.lora.targets == std::vector<std::string>{"q_proj", "v_proj"});
}

TEST_CASE("bundled ids resolve case-insensitively and inline configs are accepted", "[request]") {
  json j = base();
  j["model"]["id"] = "META-LLAMA/llama-2-7b-HF";
  CHECK(request_from_json(j).model.layers == 32);
  json inline_cfg = {{"model", {{"config", {{"model_type", "gpt2"}, {"n_embd", 64}, {"n_layer", 2}, {"n_head", 4},
                                            {"vocab_size", 100}, {"n_positions", 32}}}}}};
  CHECK(request_from_json(inline_cfg).model.family == "gpt2");
}

TEST_CASE("bad requests give errors that name the field and the fix", "[request][errors]") {
  CHECK_THAT(error_of(json::array()), Catch::Matchers::Contains("JSON object"));
  CHECK_THAT(error_of(json::object()), Catch::Matchers::Contains("\"model\""));
  CHECK_THAT(error_of({{"model", {{"id", "nobody/nothing"}}}}), Catch::Matchers::Contains("not in the bundled library"));
  json j = base();
  j["task"] = "pretrain";
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("\"full\", \"lora\", \"qlora\", \"inference\""));
  j = base();
  j["micro_batch_size"] = 0;
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("micro_batch_size"));
  j["micro_batch_size"] = 1.5;
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("whole number"));
  j = base();
  j["micro_batch_size"] = 2'000'000'000;
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("micro_batch_size"));
  j = base();
  j["sequence_lenght"] = 128;  // typo
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("unknown field \"sequence_lenght\""));
  j = base();
  j["gpu"] = {{"name", "Voodoo2"}};
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("memory_gib"));
  j = base();
  j["task"] = "full";
  j["quantization"] = "nf4";
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("qlora"));
  j = base();
  j["task"] = "lora";
  j["lora"] = {{"targets", json::array()}};
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("lora.targets"));
}

TEST_CASE("qlora defaults to NF4 and LoRA over quantized weights becomes QLoRA", "[request]") {
  json j = base();
  j["task"] = "qlora";
  CHECK(request_from_json(j).quantization == Quantization::Nf4);
  j["task"] = "lora";
  j["quantization"] = "nf4_double";
  CHECK(request_from_json(j).task == Task::Qlora);
}

TEST_CASE("GPU by catalog name, alias or custom size", "[request]") {
  json j = base();
  j["gpu"] = {{"name", "4090"}};
  CHECK(request_from_json(j).gpu.name == "RTX4090-24GB");
  j["gpu"] = {{"memory_gib", 48}};
  const Request r = request_from_json(j);
  CHECK(r.gpu.name == "custom");
  CHECK(r.gpu.memory_bytes == u64{48} << 30);
}

TEST_CASE("parallel degrees without num_gpus describe the GPUs they need", "[request][parallel]") {
  json j = base();
  j["parallelism"] = {{"method", "zero3"}, {"dp", 4}, {"tp", 2}};
  CHECK(request_from_json(j).num_gpus == 8);
}

TEST_CASE("torchtune keeps LoRA adapters in the model dtype; PEFT upcasts them", "[request]") {
  json j = base();
  j["task"] = "lora";
  j["precision"] = "bf16";
  CHECK(request_from_json(j).lora.adapter_bytes == 0);  // auto: fp32 (PEFT)
  j["runtime"] = {{"framework", "torchtune"}};
  CHECK(request_from_json(j).lora.adapter_bytes == 2);
}

TEST_CASE("request_to_json round-trips through parse_request", "[request]") {
  json j = base();
  j["task"] = "lora";
  j["lora"] = {{"rank", 8}, {"targets", "all-linear"}};
  j["precision"] = "bf16";
  j["micro_batch_size"] = 3;
  const Request r = request_from_json(j);
  json back = request_to_json(r);
  back["model"] = j["model"];
  const Request again = request_from_json(back);
  CHECK(again.task == r.task);
  CHECK(again.lora.all_linear);
  CHECK(again.micro_batch_size == 3);
  CHECK(again.precision == Precision::Bf16);
}

TEST_CASE("issue 8 schema: framework, its version, lora.dropout, prepare_kbit, fp4, attention auto", "[request]") {
  json j = base();
  j["task"] = "qlora";
  j["quantization"] = "fp4";
  j["runtime"] = {{"framework", "hf"}};
  Request r = request_from_json(j);
  CHECK(r.quantization == Quantization::Fp4);
  CHECK(r.runtime.framework == Framework::Transformers);
  CHECK(r.lora.dropout == 0.0);  // PEFT LoraConfig default
  CHECK_FALSE(r.runtime.framework_version.empty());
  CHECK(request_to_json(r)["runtime"]["framework"] == "transformers");

  j["runtime"] = {{"framework", "trl"}};
  r = request_from_json(j);
  CHECK(r.lora.dropout == Approx(0.05));  // TRL ModelConfig lora_dropout
  j["lora"] = {{"dropout", 0.1}};
  CHECK(request_from_json(j).lora.dropout == Approx(0.1));  // every default overridable
  j["runtime"] = {{"framework", "litgpt"}, {"framework_version", "0.5.3"}, {"prepare_kbit", false}};
  r = request_from_json(j);
  CHECK(r.runtime.framework == Framework::Litgpt);
  CHECK(r.runtime.framework_version == "0.5.3");
  CHECK_FALSE(r.runtime.prepare_kbit);

  for (const char* f : {"transformers", "trl", "torchtune", "litgpt", "axolotl", "llamafactory", "swift", "unsloth"}) {
    json k = base();
    k["runtime"] = {{"framework", f}};
    CHECK(to_string(request_from_json(k).runtime.framework) == std::string(f));
  }
  json bad = base();
  bad["runtime"] = {{"framework", "megatron"}};
  CHECK_THAT(error_of(bad), Catch::Matchers::Contains("\"axolotl\""));
  bad["runtime"] = {{"framework", "trl"}, {"framework_version", "0.9"}};
  CHECK_THAT(error_of(bad), Catch::Matchers::Contains("older than trl 1.0"));
  bad["runtime"] = {{"framework", "trl"}, {"framework_version", "latest"}};
  CHECK_THAT(error_of(bad), Catch::Matchers::Contains("framework_version"));
  bad = base();
  bad["lora"] = {{"dropout", 1.0}};
  CHECK_THAT(error_of(bad), Catch::Matchers::Contains("lora.dropout"));
  bad = base();
  bad["attention"] = "flash";
  CHECK_THAT(error_of(bad), Catch::Matchers::Contains("\"auto\", \"eager\""));
}
