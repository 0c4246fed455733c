// Launch-config intake: real-shaped example files (tests/intake/, written in each framework's
// documented recipe format) -> the request, with the key and line of every field.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launch_config.hpp"
#include "memfit/api.hpp"
#include "memfit/error.hpp"
#include "memfit/intake.hpp"

using nlohmann::json;

namespace {
json read_example(const std::string& name) {
  std::ifstream in(std::filesystem::path(MEMFIT_TESTS_DIR) / "intake" / name);
  std::stringstream ss;
  ss << in.rdbuf();
  json input = json::object();
  std::string error;
  REQUIRE(memfit::cli::read_launch_config(ss.str(), input, error));
  return memfit::intake(input);
}
int line_of(const json& out, const char* field) { return out["sources"][field]["line"].get<int>(); }
bool estimates(const json& request) { return !json::parse(memfit::estimate_json(request.dump())).contains("error"); }
}  // namespace

TEST_CASE("an Axolotl QLoRA YAML becomes its request, field by field with lines", "[intake]") {
  const json out = read_example("axolotl-qlora.yml");
  const json& r = out["request"];
  CHECK(out["format"] == "axolotl");
  CHECK(r["model"]["id"] == "meta-llama/Llama-2-7b-hf");
  CHECK(r["task"] == "qlora");
  CHECK(r["quantization"] == "nf4");
  CHECK(r["micro_batch_size"] == 2);
  CHECK(r["sequence_length"] == 4096);
  CHECK(r["lora"]["targets"] == "all-linear");
  CHECK(r["lora"]["dropout"] == Approx(0.05));
  CHECK(r["optimizer"] == "paged_adamw");
  CHECK(r["attention"] == "flash_attention_2");
  CHECK(line_of(out, "micro_batch_size") == 25);
  CHECK(line_of(out, "model.id") == 2);
  CHECK(std::find(out["ignored"].begin(), out["ignored"].end(), "learning_rate") != out["ignored"].end());
  CHECK(estimates(r));
}

TEST_CASE("LLaMA-Factory, torchtune and LitGPT recipes map their own keys", "[intake]") {
  json out = read_example("llamafactory-lora.yaml");
  CHECK(out["format"] == "llamafactory");
  CHECK(out["request"]["lora"]["targets"] == "all-linear");  // lora_target: all
  CHECK(out["request"]["gradient_checkpointing"] == true);   // LLaMA-Factory's default
  CHECK(out["sources"]["gradient_checkpointing"].contains("default"));
  CHECK(line_of(out, "sequence_length") == 14);
  CHECK(estimates(out["request"]));

  out = read_example("torchtune-lora.yaml");
  CHECK(out["format"] == "torchtune");
  CHECK(out["request"]["model"]["id"] == "meta-llama/Llama-3.1-8B");
  CHECK(out["request"]["lora"]["targets"] ==
        json({"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));  // output_proj = o_proj
  CHECK(out["request"]["optimizer"] == "adamw_fused");
  CHECK(out["request"]["runtime"]["loss_chunks"] == 8);
  CHECK(line_of(out, "sequence_length") == 16);  // tokenizer.max_seq_len
  CHECK(estimates(out["request"]));

  out = read_example("torchtune-full-fsdp.yaml");
  CHECK(out["request"]["parallelism"]["separate_embedding_units"] == true);  // custom_sharded_layers
  CHECK(estimates(out["request"]));

  out = read_example("litgpt-lora.yaml");
  CHECK(out["format"] == "litgpt");
  CHECK(out["request"]["model"]["id"] == "meta-llama/Llama-2-7b-hf");  // checkpoints/ stripped
  CHECK(out["request"]["quantization"] == "nf4");
  CHECK(out["request"]["precision"] == "bf16");
  CHECK(out["request"]["gradient_accumulation_steps"] == 8);  // global 8 / micro 1 / 1 device
  CHECK(out["request"]["lora"]["targets"] == json({"q_proj", "v_proj"}));
  CHECK_FALSE(out["request"].contains("gradient_checkpointing"));  // one device: none
  CHECK(estimates(out["request"]));
  // on more than one device LitGPT shards with FSDP and checkpoints every Block
  json input = json::object();
  std::string error;
  REQUIRE(memfit::cli::read_launch_config("checkpoint_dir: checkpoints/meta-llama/Llama-2-7b-hf\ndevices: 4\nlora_r: 8\n",
                                          input, error));
  out = memfit::intake(input);
  CHECK(out["request"]["parallelism"]["method"] == "fsdp_full_shard");
  CHECK(out["request"]["gradient_checkpointing"] == true);
  CHECK(out["sources"]["gradient_checkpointing"]["key"] == "devices");
}

TEST_CASE("TrainingArguments as JSON or as command-line flags; DeepSpeed and accelerate files", "[intake]") {
  json out = read_example("trl-sft-args.json");
  CHECK(out["format"] == "training_args");
  CHECK(out["request"]["runtime"]["framework"] == "trl");  // max_length / use_peft are TRL's
  CHECK(out["request"]["task"] == "lora");
  CHECK(out["request"]["precision"] == "amp_bf16");  // TRL loads a model id in fp32, bf16=True autocasts
  CHECK(line_of(out, "micro_batch_size") == 4);

  out = read_example("trl-cli.txt");
  CHECK(out["request"]["task"] == "qlora");
  CHECK(out["request"]["micro_batch_size"] == 8);
  CHECK(line_of(out, "task") == 11);  // --load_in_4bit
  CHECK(estimates(out["request"]));

  out = read_example("deepspeed-zero3-offload.json");
  CHECK(out["format"] == "deepspeed");
  CHECK(out["request"]["parallelism"]["method"] == "zero3");
  CHECK(out["request"]["parallelism"]["offload_params"] == true);
  CHECK_FALSE(out["request"].contains("precision"));  // bf16 "auto": the Trainer decides
  CHECK_FALSE(out["request"].contains("micro_batch_size"));

  out = read_example("accelerate-fsdp.yaml");
  CHECK(out["format"] == "accelerate");
  CHECK(out["request"]["parallelism"]["method"] == "fsdp_full_shard");
  CHECK(out["request"]["num_gpus"] == 8);
  CHECK(std::find(out["defaulted"].begin(), out["defaulted"].end(), "model.id") != out["defaulted"].end());
}

TEST_CASE("intake is a pure JSON function: the API gives the same answer and names a bad input", "[intake]") {
  const json input = {{"config", {{"base_model", "meta-llama/Llama-2-7b-hf"}, {"micro_batch_size", 3}}}};
  const json a = json::parse(memfit::intake_json(input.dump()));
  CHECK(a == memfit::intake(input));
  CHECK(a["request"]["micro_batch_size"] == 3);
  CHECK_FALSE(a["sources"]["micro_batch_size"].contains("line"));  // no line map given
  const json none = json::parse(memfit::intake_json(R"({"config": {"learning_rate": 0.1}})"));
  CHECK_THAT(none["error"].get<std::string>(), Catch::Matchers::Contains("none of the launch configs"));
  // a ZeRO stage DeepSpeed would refuse is an error naming the key, not a silently ignored line
  const json stage7 = json::parse(memfit::intake_json(R"({"config": {"zero_optimization": {"stage": 7}}})"));
  CHECK_THAT(stage7["error"].get<std::string>(), Catch::Matchers::Contains("zero_optimization.stage is 7"));
  const json stage0 = json::parse(memfit::intake_json(R"({"config": {"zero_optimization": {"stage": 0}}})"));
  CHECK(stage0["request"]["parallelism"]["method"] == "ddp");
}
