// Serving capacity (serving.cpp): KV bytes per token for every attention family of the bundled
// library, checked against values computed by hand from the config numbers written next to
// each case; the engines' block / token / concurrency rules; request parsing and errors.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "memfit/api.hpp"
#include "memfit/error.hpp"
#include "memfit/serving.hpp"

using namespace memfit;
using nlohmann::json;

namespace {

ModelSpec load(const std::string& file) {
  std::ifstream in(std::string(MEMFIT_DATA_DIR) + "/configs/" + file);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(json::parse(ss.str()));
}

Request serve_request(const std::string& id, json serving, const std::string& gpu = "H100") {
  return request_from_json({{"model", {{"id", id}}}, {"task", "serve"}, {"gpu", {{"name", gpu}}}, {"serving", serving}});
}

}  // namespace

TEST_CASE("KV bytes per token per layer, by attention family (hand-computed from config.json)") {
  SECTION("MHA: Llama-2-7b, 32 heads x head_dim 128, K and V, bf16") {
    const KvPerToken k = kv_per_token(load("meta-llama--Llama-2-7b-hf.json"), 16, 1);
    CHECK(k.bytes_per_layer == 2 * 32 * 128 * 2);  // 16384
    CHECK(k.full_layers == 32);
    CHECK(k.bytes_all_layers() == 32 * 16384);
  }
  SECTION("GQA: Llama-3.1-8B, 8 KV heads x 128") {
    const ModelSpec m = load("meta-llama--Llama-3.1-8B.json");
    CHECK(kv_per_token(m, 16, 1).bytes_per_layer == 2 * 8 * 128 * 2);  // 4096
    CHECK(kv_per_token(m, 16, 2).bytes_per_layer == 2 * 4 * 128 * 2);  // TP 2 splits the KV heads
    CHECK(kv_per_token(m, 16, 16).bytes_per_layer == 2 * 1 * 128 * 2); // TP 16 > 8 heads: one replicated head
    CHECK(kv_per_token(m, 8, 1).bytes_per_layer == 2 * 8 * 128 * 1);   // FP8 KV
  }
  SECTION("MQA: Falcon-7B, one KV head x head_dim 64 (4544 / 71)") {
    const KvPerToken k = kv_per_token(load("tiiuae--falcon-7b.json"), 16, 1);
    CHECK(k.bytes_per_layer == 2 * 1 * 64 * 2);  // 256
    CHECK(k.full_layers == 32);
  }
  SECTION("MQA: SantaCoder (gpt_bigcode, multi_query), 2048 / 16 heads = 128") {
    const KvPerToken k = kv_per_token(load("bigcode--gpt_bigcode-santacoder.json"), 16, 1);
    CHECK(k.bytes_per_layer == 2 * 1 * 128 * 2);  // 512
    CHECK(k.full_layers == 24);
  }
  SECTION("MoE: Mixtral-8x7B (8 KV heads x 128, 32 layers) and Qwen3-30B-A3B (4 x 128, 48 layers)") {
    const KvPerToken mix = kv_per_token(load("mistralai--Mixtral-8x7B-v0.1.json"), 16, 1);
    CHECK(mix.bytes_per_layer == 2 * 8 * 128 * 2);
    CHECK(mix.full_layers + mix.window_layers == 32);
    const KvPerToken q = kv_per_token(load("Qwen--Qwen3-30B-A3B.json"), 16, 1);
    CHECK(q.bytes_per_layer == 2 * 4 * 128 * 2);
    CHECK(q.full_layers == 48);
  }
  SECTION("MLA: DeepSeek-V3 latent kv_lora_rank 512 + qk_rope_head_dim 64, not split by TP") {
    const ModelSpec m = load("deepseek-ai--DeepSeek-V3.json");
    CHECK(kv_per_token(m, 16, 1).bytes_per_layer == (512 + 64) * 2);  // 1152
    CHECK(kv_per_token(m, 16, 8).bytes_per_layer == (512 + 64) * 2);
    CHECK(kv_per_token(m, 8, 8).bytes_per_layer == 512 + 64);
    CHECK(kv_per_token(m, 16, 1).full_layers == 61);
    // expanded (per-head K 192 and V 128 for 128 heads), as Transformers caches it
    CHECK(kv_per_token(m, 16, 1, false).bytes_per_layer == 128 * (192 + 128) * 2);
    CHECK(kv_per_token(load("deepseek-ai--DeepSeek-V2-Lite.json"), 16, 1).bytes_per_layer == (512 + 64) * 2);
  }
  SECTION("Sliding window: Gemma-2-9b alternates 4096-token windows with full layers (8 KV heads x 256)") {
    const KvPerToken k = kv_per_token(load("google--gemma-2-9b.json"), 16, 1);
    CHECK(k.bytes_per_layer == 2 * 8 * 256 * 2);  // 8192
    CHECK(k.window_layers == 21);
    CHECK(k.full_layers == 21);
    CHECK(k.window == 4096);
  }
  SECTION("Sliding window on every layer: Mistral-7B-v0.1 (window 4096, 8 KV heads x 128)") {
    const KvPerToken k = kv_per_token(load("mistralai--Mistral-7B-v0.1.json"), 16, 1);
    CHECK(k.bytes_per_layer == 4096);
    CHECK(k.window_layers == 32);
    CHECK(k.window == 4096);
  }
}

TEST_CASE("vLLM blocks, tokens and concurrency follow kv_cache_utils") {
  const Request r = serve_request("meta-llama/Llama-3.1-8B", {{"engine", "vllm"}, {"max_model_len", 32768}});
  const ServingEstimate e = serve(r);
  // one block = 16 tokens x 4096 B x 32 layers
  CHECK(e.block_bytes == 16 * 4096 * 32);
  CHECK(e.num_gpu_blocks == e.kv_cache_bytes / (16 * 4096) / 32);
  CHECK(e.kv_cache_tokens == e.num_gpu_blocks * 16);
  CHECK(e.max_concurrency == Approx(static_cast<double>(e.num_gpu_blocks) / (32768 / 16)));
  // the newest row: 0.92 by default, of what torch sees of an H100 (79.19 GiB, not nvidia-smi's 81559 MiB)
  CHECK(e.budget_bytes == static_cast<u64>(0.92 * static_cast<double>(static_cast<u64>(79.19 * 1073741824.0))));
  // Llama-3.1-8B: 8,030,261,248 parameters in bf16 + the rotary cache (131072 x 128 x 2 B)
  CHECK(e.weights_bytes == 8030261248ull * 2 + 131072ull * 128 * 2);
  CHECK(e.fits);
  CHECK(e.max_model_len_that_fits == e.kv_cache_bytes / (16 * 4096 * 32) * 16);

  // FP8 KV doubles the tokens of the same bytes (to the block)
  const ServingEstimate f = serve(serve_request("meta-llama/Llama-3.1-8B", {{"kv_cache_dtype", "fp8"}, {"max_model_len", 32768}}));
  CHECK(f.kv_cache_tokens / 16 == e.kv_cache_bytes / (16 * 2048 * 32));
}

TEST_CASE("vLLM hybrid KV manager: Gemma-2 windows need only window + chunk blocks per request") {
  const ServingEstimate e = serve(serve_request("google/gemma-2-9b", {{"engine_version", "0.10.1"}, {"max_model_len", 8192}}));
  // 21 full + 21 window layers: group_size 21, two groups; num_blocks per 21-layer pool
  CHECK(e.num_gpu_blocks == e.kv_cache_bytes / (16 * 8192) / 21);
  CHECK(e.kv_cache_tokens == e.num_gpu_blocks / 2 * 16);
  // a request: 8192/16 blocks in the full group + (min(4096 - 1 + 8192, 8192) / 16 + 1) in the window group
  CHECK(e.max_concurrency == Approx(static_cast<double>(e.num_gpu_blocks) / (512 + 513)));
  // vLLM 0.9 had no hybrid manager: every layer caches every token
  const ServingEstimate old = serve(serve_request("google/gemma-2-9b", {{"engine_version", "0.9.2"}, {"max_model_len", 8192}}));
  CHECK(old.num_gpu_blocks == old.kv_cache_bytes / (16 * 8192) / 42);
}

TEST_CASE("SGLang: tokens = (total x mem_fraction_static - used after load) // cell size") {
  const Request r = serve_request("meta-llama/Llama-3.1-8B", {{"engine", "sglang"}, {"engine_version", "0.4.6"}, {"context_length", 8192}});
  const ServingEstimate e = serve(r);
  CHECK(e.fraction == 0.88);  // TP 1 default before 0.4.7
  CHECK(e.activation_peak_bytes == 0);  // SGLang leaves activations to 1 - mem_fraction_static
  CHECK(e.kv_cache_tokens == e.kv_cache_bytes / (32 * 2 * 8 * 128 * 2));
  CHECK(serve(serve_request("meta-llama/Llama-3.1-8B", {{"engine", "sglang"}, {"engine_version", "0.4.6"}, {"tp_size", 4}}, "H100")).fraction == 0.85);
  // 0.4.7+: (81559 MiB - (9.5 + 1/2) GiB) / 81559 MiB, rounded to 3 places
  CHECK(serve(serve_request("meta-llama/Llama-3.1-8B", {{"engine", "sglang"}})).fraction == Approx(0.874));
  // a GPU smaller than SGLang's default reserve: an error that says what to set, not a negative budget
  CHECK_THROWS_WITH(serve(request_from_json({{"model", {{"id", "Qwen/Qwen2.5-0.5B"}}}, {"task", "serve"}, {"gpu", {{"memory_gib", 2}}},
                                             {"serving", {{"engine", "sglang"}}}})),
                    Catch::Contains("mem_fraction_static"));
  // max_total_tokens caps the pool
  CHECK(serve(serve_request("meta-llama/Llama-3.1-8B", {{"engine", "sglang"}, {"max_total_tokens", 1000}})).kv_cache_tokens == 1000);
}

TEST_CASE("Tensor parallelism splits weights but replicates norms; expert parallel needs experts") {
  const ServingEstimate one = serve(serve_request("meta-llama/Llama-3.1-70B", {{"tensor_parallel_size", 8}}));
  const ServingEstimate two = serve(serve_request("meta-llama/Llama-3.1-70B", {{"tensor_parallel_size", 4}}));
  CHECK(two.weights_bytes > one.weights_bytes * 19 / 10);
  CHECK(two.weights_bytes < one.weights_bytes * 2);
  CHECK_THROWS_WITH(serve(serve_request("meta-llama/Llama-3.1-8B", {{"tensor_parallel_size", 3}})),
                    Catch::Contains("does not divide num_attention_heads (32)") && Catch::Contains("use tensor_parallel_size 1, 2, 4"));
  CHECK_THROWS_WITH(serve(serve_request("meta-llama/Llama-3.1-8B", {{"enable_expert_parallel", true}})), Catch::Contains("dense"));
}

TEST_CASE("Nothing fits: by how much, and the single changes that would") {
  const ServingEstimate e = serve(serve_request("meta-llama/Llama-3.1-70B", {{"max_model_len", 131072}}));
  CHECK_FALSE(e.fits);
  CHECK(e.shortfall_bytes > 0);
  bool tp = false;
  for (const ServeFix& f : e.fixes) tp = tp || f.change.rfind("tensor_parallel_size", 0) == 0;
  CHECK(tp);
  for (const ServeFix& f : e.fixes) CHECK(f.kv_cache_tokens > 0);
}

TEST_CASE("serving request fields: engine names, defaults and errors") {
  CHECK(parse_engine_version("0.10.1") == 1001);
  CHECK(parse_engine_version("v0.4.6.post1") == 406);
  CHECK(parse_engine_version("latest") == 0);
  CHECK(std::string(engine_profile("vllm", "0.8.5").label).find("0.8") != std::string::npos);
  CHECK_THROWS_WITH(engine_profile("tgi", ""), Catch::Contains("\"vllm\" or \"sglang\""));
  CHECK_THROWS_WITH(engine_profile("vllm", "0.5.0"), Catch::Contains("older"));
  CHECK_THROWS_WITH(serve_request("meta-llama/Llama-3.1-8B", {{"gpu_mem_util", 0.9}}), Catch::Contains("unknown field \"gpu_mem_util\""));
  CHECK_THROWS_WITH(serve_request("meta-llama/Llama-3.1-8B", {{"kv_cache_dtype", "int4"}}), Catch::Contains("kv_cache_dtype"));
  CHECK_THROWS_WITH(request_from_json({{"model", {{"id", "meta-llama/Llama-3.1-8B"}}}, {"serving", json::object()}}),
                    Catch::Contains("task \"serve\""));
  // defaults: the model's max_position_embeddings; vLLM serve on an H100: 8192 batched tokens, 1024 seqs
  const ServingEstimate e = serve(serve_request("meta-llama/Llama-3.1-8B", json::object()));
  CHECK(e.max_model_len == 131072);
  CHECK(e.max_num_batched_tokens == 8192);
  CHECK(e.max_num_seqs == 1024);
  CHECK(serve(serve_request("meta-llama/Llama-3.1-8B", json::object(), "A100-80GB")).max_num_batched_tokens == 2048);
  // the JSON API carries the figures per GPU
  const json j = json::parse(estimate_json(R"({"model":{"id":"Qwen/Qwen2.5-7B"},"task":"serve","serving":{"max_model_len":4096}})"));
  for (const char* k : {"weights_bytes", "activation_peak_bytes", "non_torch_bytes", "cuda_graph_bytes", "kv_cache_bytes",
                        "kv_cache_tokens", "num_gpu_blocks", "max_concurrency", "max_model_len_that_fits"})
    CHECK(j["serving"].contains(k));
}

TEST_CASE("Serving planner: 3 or 64 GPUs split into TP groups x replicas, never a TP that breaks the heads") {
  Request r = serve_request("meta-llama/Llama-3.1-8B", {{"max_model_len", 8192}});
  r.num_gpus = 3;
  const ServePlan p = plan_serving(r);
  REQUIRE_FALSE(p.layouts.empty());
  for (const ServeLayout& l : p.layouts) {
    CHECK(32 % l.tp == 0);
    CHECK(l.tp * l.pp * l.replicas + l.unused_gpus == 3);
  }
  CHECK(p.layouts.front().fits);
  CHECK(p.layouts.front().replicas == 3);  // three TP-1 replicas hold the most 8K requests
  CHECK(p.layouts.front().concurrency_total == Approx(3 * p.layouts.front().concurrency_per_replica));
  r.num_gpus = 64;
  const ServePlan big = plan_serving(r);
  for (const ServeLayout& l : big.layouts) CHECK(l.tp * l.pp * l.replicas == 64);
  // MoE: DP ranks with the experts over every GPU hold fewer weights per GPU than plain replicas
  Request moe = serve_request("Qwen/Qwen3-30B-A3B", {{"max_model_len", 8192}});
  moe.num_gpus = 4;
  const ServePlan mp = plan_serving(moe);
  const ServeLayout* plain = nullptr;
  const ServeLayout* ep = nullptr;
  for (const ServeLayout& l : mp.layouts) {
    if (l.tp == 1 && l.pp == 1) (l.expert_parallel ? ep : plain) = &l;
  }
  REQUIRE(plain);
  REQUIRE(ep);
  CHECK(ep->per_gpu.weights_bytes < plain->per_gpu.weights_bytes);
  CHECK(ep->concurrency_total > plain->concurrency_total);
  // the JSON plan of task serve
  const json j = json::parse(plan_json(
      R"({"model":{"id":"meta-llama/Llama-3.1-70B"},"task":"serve","cluster":{"gpu":{"name":"H100"},"num_gpus":3},"serving":{"max_model_len":8192}})"));
  REQUIRE(j.contains("layouts"));
  CHECK(j["tokens_per_s"].is_null());
  CHECK(j["layouts"][0]["fits"] == true);
  // 70B in bf16 needs two H100s: TP 2 or PP 2, the third GPU left over (named in the label)
  CHECK(j["layouts"][0]["tensor_parallel_size"].get<int>() * j["layouts"][0]["pipeline_parallel_size"].get<int>() == 2);
  CHECK(j["layouts"][0]["unused_gpus"] == 1);
}
