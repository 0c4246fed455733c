// The JSON boundary shared by the CLI and wasm: never throws, errors as {"error": ...}, the
// documented output fields are present.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "memfit/api.hpp"

using nlohmann::json;
using namespace memfit;

TEST_CASE("estimate_json has the documented fields", "[api]") {
  const json e = json::parse(estimate_json(R"({"model": {"id": "meta-llama/Llama-2-7b-hf"}, "task": "lora"})"));
  REQUIRE_FALSE(e.contains("error"));
  for (const char* k : {"params", "per_gpu", "peak_phase", "fits", "phases", "warnings", "notes", "request", "model"})
    CHECK(e.contains(k));
  CHECK(e["params"]["total"] == 6'738'415'616ULL);
  CHECK(e["params"]["trainable"] == 8'388'608);  // rank 16 on q_proj and v_proj: 32 x 2 x 16 x (4096 + 4096)
  for (const char* k : {"allocated_peak_bytes", "reserved_peak_bytes", "device_total_bytes", "breakdown"})
    CHECK(e["per_gpu"].contains(k));
  for (const json& c : e["per_gpu"]["breakdown"]) {
    CHECK(c["bytes"].get<u64>() > 0);
    CHECK_FALSE(c["formula"].get<std::string>().empty());
  }
}

TEST_CASE("warnings (what to weigh before trusting the figure) come apart from notes", "[api]") {
  // bf16 on a V100 runs emulated, and a framework measured from its source only: warnings; the
  // framework's default precision: a note. A serve request carries the request's warnings too.
  const json e = json::parse(estimate_json(
      R"({"model": {"id": "meta-llama/Llama-3.1-8B"}, "task": "lora", "precision": "bf16", "runtime": {"framework": "torchtune"},
          "cluster": {"gpu": {"name": "V100-32GB"}}})"));
  REQUIRE_FALSE(e.contains("error"));
  const auto has = [](const json& list, const char* what) {
    for (const json& s : list)
      if (s.get<std::string>().find(what) != std::string::npos) return true;
    return false;
  };
  CHECK(has(e["warnings"], "no native bf16"));
  CHECK_FALSE(has(e["notes"], "no native bf16"));
  CHECK(has(e["notes"], "own memory figure"));
  CHECK_FALSE(has(e["warnings"], "own memory figure"));
  const json s = json::parse(estimate_json(
      R"({"model": {"id": "meta-llama/Llama-3.1-8B"}, "task": "serve", "precision": "bf16", "cluster": {"gpu": {"name": "V100-32GB"}}})"));
  REQUIRE_FALSE(s.contains("error"));
  CHECK(has(s["warnings"], "no native bf16"));
  const json a = json::parse(estimate_json(
      R"({"model": {"config": {"model_type": "brand_new_lm", "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 1000}}, "task": "lora"})"));
  REQUIRE_FALSE(a.contains("error"));
  CHECK(has(a["warnings"], "approximate"));
  CHECK(has(a["model"]["warnings"], "approximate"));
}

TEST_CASE("malformed input comes back as an error object, never an exception", "[api][errors]") {
  for (const char* bad : {"", "{", "[1,2", "null", "42", R"({"model": 7})", R"({"model": {"config": {"model_type": "llama"}}})"}) {
    INFO(bad);
    json out;
    REQUIRE_NOTHROW(out = json::parse(estimate_json(bad)));
    CHECK(out.contains("error"));
    REQUIRE_NOTHROW(out = json::parse(plan_json(bad)));
    CHECK(out.contains("error"));
    REQUIRE_NOTHROW(out = json::parse(parse_config_json(bad)));
    CHECK(out.contains("error"));
  }
  CHECK_THAT(json::parse(estimate_json("{"))["error"].get<std::string>(), Catch::Matchers::Contains("not valid JSON"));
}

TEST_CASE("models, gpus and defaults list what the page needs", "[api]") {
  const json models = json::parse(models_json());
  REQUIRE(models.is_array());
  CHECK(models.size() > 50);
  const json gpus = json::parse(gpus_json());
  CHECK(gpus.size() >= 16);
  const json d = json::parse(defaults_json());
  CHECK(d["request"]["task"] == "full");
  CHECK(d["options"]["optimizer"].size() == 10);
  CHECK(d["options"]["runtime.framework"].size() == 9);  // 8 frameworks + the "hf" alias
  CHECK(d["options"]["quantization"].size() == 10);  // none, bitsandbytes int8/nf4/nf4_double/fp4, gptq, awq, fp8, mxfp4, nvfp4
  CHECK(d["options"]["attention"][0] == "auto");
  CHECK(d["request"]["lora"]["dropout"] == 0.0);
  CHECK(d["request"]["runtime"].contains("prepare_kbit"));
  CHECK(d["precision_meaning"]["amp_bf16"].get<std::string>().find("fp32 weights") != std::string::npos);
  // which frameworks' own training steps the CPU validator runs (validate/frameworks.py)
  for (const json& f : d["frameworks"]) {
    const std::string name = f["framework"], figures = f["figures"];
    if (name == "trl") continue;  // 1.16 runs (SFTTrainer), the 1.0 row does not
    const bool runs = name == "transformers" || name == "torchtune" || name == "litgpt";
    CHECK(figures.rfind(runs ? "measured on CPU" : "defaults read from its source", 0) == 0);
  }
  CHECK(d["frameworks"].size() == 11);  // 8 frameworks, TRL with two version rows, LitGPT with three (its FSDP wrapping)
  // FSDP gradient behaviour is the framework's: Transformers (the default) keeps neither
  CHECK(d["request"]["parallelism"]["frozen_in_trained_units"] == false);
  CHECK(d["request"]["parallelism"]["unsharded_grad_accumulation"] == false);
  // the defaults are themselves a valid request
  json req = d["request"];
  CHECK_FALSE(json::parse(estimate_json(req.dump())).contains("error"));
  const json cfg = json::parse(parse_config_json(R"({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                                                      "vocab_size": 50257, "n_positions": 1024})"));
  CHECK(cfg["params"]["total"] == 124'439'808);
}

TEST_CASE("the same request gives the same text twice (deterministic output)", "[api]") {
  const char* req = R"({"model": {"id": "mistralai/Mixtral-8x7B-v0.1"}, "task": "qlora", "num_gpus": 2,
                        "parallelism": {"method": "fsdp_full_shard"}})";
  CHECK(estimate_json(req) == estimate_json(req));
}
