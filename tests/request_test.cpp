// The request schema: defaults, every enumerated field, and errors that name what to fix.
#include <algorithm>
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
  // QLoRA trains over bitsandbytes weights only (MXFP4 / NVFP4 are serving formats)
  j["task"] = "qlora";
  j["quantization"] = "mxfp4";
  CHECK(error_of(j).find("bitsandbytes") != std::string::npos);
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
  bad["runtime"] = {{"framework", "litgpt"}, {"loss_chunks", 8}};  // LitGPT chunks its own loss
  CHECK_THAT(error_of(bad), Catch::Matchers::Contains("leave runtime.loss_chunks out"));
  bad = base();
  bad["lora"] = {{"dropout", 1.0}};
  CHECK_THAT(error_of(bad), Catch::Matchers::Contains("lora.dropout"));
  bad = base();
  bad["attention"] = "flash";
  CHECK_THAT(error_of(bad), Catch::Matchers::Contains("\"auto\", \"eager\""));
}

TEST_CASE("attention auto resolves to what the model runs; a kernel it lacks is an error naming the one that runs",
          "[request][attention]") {
  json j = {{"model", {{"id", "bigscience/bloom-560m"}}}, {"micro_batch_size", 4}, {"sequence_length", 2048}};
  CHECK(request_from_json(j).attention == AttentionImpl::Eager);
  CHECK(request_to_json(request_from_json(j))["attention"] == "eager");  // the normalised request says so
  j["attention"] = "auto";
  CHECK(request_from_json(j).attention == AttentionImpl::Eager);
  j["attention"] = "sdpa";
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("it runs \"eager\""));
  for (const char* id : {"google/gemma-2-2b", "EleutherAI/gpt-j-6b"}) {
    json k = {{"model", {{"id", id}}}, {"attention", "sdpa"}};
    CHECK_THAT(error_of(k), Catch::Matchers::Contains("cannot run"));
    k["attention"] = "flash_attention_2";  // both have a FlashAttention-2 path
    CHECK(error_of(k).empty());
  }
  json llama = base();
  CHECK(request_from_json(llama).attention == AttentionImpl::Sdpa);
  // torchtune runs its own model code (SDPA), whatever the Transformers family flags say
  j.erase("attention");
  j["runtime"] = {{"framework", "torchtune"}};
  CHECK(request_from_json(j).attention == AttentionImpl::Sdpa);
}

TEST_CASE("LoRA targets default to the framework's choice for the architecture", "[request][lora]") {
  json j = {{"model", {{"id", "openai-community/gpt2"}}}, {"task", "lora"}, {"sequence_length", 1024}};
  Request r = request_from_json(j);
  CHECK(r.lora.targets == std::vector<std::string>{"c_attn"});  // PEFT's mapping for gpt2
  CHECK_FALSE(json::parse(estimate_json(j.dump())).contains("error"));
  j["runtime"] = {{"framework", "llamafactory"}};
  CHECK(request_from_json(j).lora.all_linear);  // lora_target: all
  json q = {{"model", {{"id", "meta-llama/Llama-2-7b-hf"}}}, {"task", "lora"}, {"runtime", {{"framework", "torchtune"}}}};
  CHECK(request_from_json(q).lora.targets ==
        std::vector<std::string>{"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});
  json moe = {{"model", {{"id", "Qwen/Qwen2-57B-A14B"}}}, {"task", "lora"}};
  r = request_from_json(moe);
  CHECK(r.lora.all_linear);  // PEFT has no qwen2_moe entry: all-linear, with a note that says so
  CHECK(std::any_of(r.warnings.begin(), r.warnings.end(),
                    [](const std::string& w) { return w.find("PEFT has no default") != std::string::npos; }));
  json given = q;
  given["lora"] = {{"targets", {"q_proj"}}};
  CHECK(request_from_json(given).lora.targets == std::vector<std::string>{"q_proj"});  // overridable
}

TEST_CASE("hardware limits: FlashAttention-2 needs Ampere+ CUDA; bf16 without native support is a note",
          "[request][gpu]") {
  json j = base();
  j["attention"] = "flash_attention_2";
  j["device"] = "cpu";
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("CUDA GPUs only"));
  j["device"] = "cuda";
  j["gpu"] = {{"name", "V100-32GB"}};
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("Ampere"));
  j["attention"] = "sdpa";
  j["precision"] = "bf16";
  const Request r = request_from_json(j);
  CHECK_THAT(r.warnings.back(), Catch::Matchers::Contains("no native bf16"));
  // flash_attn takes fp16 / bf16 only: fp32 weights without autocast fail at the first forward,
  // for LoRA, QLoRA and inference alike; autocast or half weights run
  j["gpu"] = {{"name", "A100-80GB"}};
  j["attention"] = "flash_attention_2";
  for (const char* task : {"lora", "qlora", "full", "inference"}) {
    INFO(task);
    j["task"] = task;
    j["precision"] = "fp32";
    CHECK_THAT(error_of(j), Catch::Matchers::Contains("fp16 / bf16 only"));
    CHECK(json::parse(estimate_json(j.dump())).value("rejected", false));
    for (const char* ok : {"amp_bf16", "bf16", "fp16"}) {
      j["precision"] = ok;
      CHECK_NOTHROW(request_from_json(j));
    }
  }
}

TEST_CASE("a context longer than the model's positions: an error for learned positions, a note for RoPE",
          "[request]") {
  json j = {{"model", {{"id", "openai-community/gpt2"}}}};
  CHECK(request_from_json(j).sequence_length == 1024);  // the default 2048 is clamped to n_positions
  j["sequence_length"] = 2048;
  CHECK_THAT(error_of(j), Catch::Matchers::Contains("at most 1024"));
  json l = base();
  l["sequence_length"] = 8192;  // Llama-2: 4096 positions, rotary
  CHECK_THAT(request_from_json(l).warnings.back(), Catch::Matchers::Contains("max_position_embeddings"));
}

TEST_CASE("LoRA/QLoRA precision follows what the framework loads; prepare_kbit for QLoRA", "[request][precision]") {
  json j = base();  // Llama-2-7b: torch_dtype float16
  j["task"] = "lora";
  CHECK(request_from_json(j).precision == Precision::Fp16);  // Transformers 5 loads the checkpoint dtype
  j["runtime"] = {{"framework", "trl"}};
  CHECK(request_from_json(j).precision == Precision::AmpBf16);  // TRL loads a model id in fp32, bf16=True
  j["runtime"] = {{"framework", "torchtune"}};
  CHECK(request_from_json(j).precision == Precision::Bf16);
  j["precision"] = "fp32";
  CHECK(request_from_json(j).precision == Precision::Fp32);  // overridable
  json q = base();
  q["task"] = "qlora";
  Request r = request_from_json(q);
  CHECK(r.runtime.prepare_kbit);
  CHECK(r.gradient_checkpointing);  // prepare_model_for_kbit_training(use_gradient_checkpointing=True)
  q["quantization"] = "gptq_int4";
  q["task"] = "lora";
  r = request_from_json(q);
  CHECK(r.task == Task::Qlora);  // LoRA over a GPTQ base: PEFT trains it
  CHECK_FALSE(r.runtime.prepare_kbit);  // no bitsandbytes layers to prepare
}

TEST_CASE("TRL casts a quantized model's adapters to bf16; PEFT alone keeps them in fp32", "[request][lora]") {
  json q = base();
  q["task"] = "qlora";
  CHECK(request_from_json(q).lora.adapter_bytes == 0);  // Transformers + PEFT: fp32 (autocast_adapter_dtype)
  q["runtime"] = {{"framework", "trl"}};
  CHECK(request_from_json(q).lora.adapter_bytes == 2);  // SFTTrainer: .to(torch.bfloat16) when _is_quantized_model
  q["lora"] = {{"adapter_dtype", "fp32"}};
  CHECK(request_from_json(q).lora.adapter_bytes == 4);  // overridable
  json l = base();
  l["task"] = "lora";
  l["runtime"] = {{"framework", "trl"}};
  CHECK(request_from_json(l).lora.adapter_bytes == 0);  // an unquantized base keeps PEFT's fp32 adapters
}

TEST_CASE("LitGPT runs its own modules: no config dropout, torch's fused GELU", "[request][framework]") {
  // phi-2's HF config: resid_pdrop 0.1 and hidden_act gelu_new (NewGELUActivation, Python ops).
  // LitGPT's GPT has no dropout module and its GptNeoxMLP calls F.gelu(approximate="tanh")
  // (litgpt/model.py at v0.4.0 and 0.5.13).
  json j = {{"model", {{"id", "microsoft/phi-2"}}}, {"task", "lora"}, {"precision", "bf16"}};
  const Request hf = request_from_json(j);
  CHECK(hf.model.hidden_dropout == Approx(0.1));
  CHECK(hf.model.activation == "gelu_new");
  j["runtime"] = {{"framework", "litgpt"}};
  const Request lit = request_from_json(j);
  CHECK(lit.model.hidden_dropout == 0);
  CHECK(lit.model.attention_dropout == 0);
  CHECK(lit.model.embedding_dropout == 0);
  CHECK(lit.model.activation == "gelu_pytorch_tanh");
  bool said = false;
  for (const std::string& n : lit.notes) said = said || n.find("no dropout modules") != std::string::npos;
  CHECK(said);
}
