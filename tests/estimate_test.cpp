// The estimate: components add up, the timeline picks the right phase, sanity facts hold, and
// hand-worked examples pin each component.
#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "memfit/api.hpp"
#include "memfit/error.hpp"
#include "memfit/estimate.hpp"

using nlohmann::json;
using namespace memfit;

namespace {
constexpr u64 GiB = u64{1} << 30;
Estimate run(const json& j) { return estimate(request_from_json(j)); }
u64 part(const Estimate& e, const std::string& name) {
  for (const Component& c : e.breakdown)
    if (c.name == name) return c.bytes;
  return 0;
}
json llama7b() { return {{"model", {{"id", "meta-llama/Llama-2-7b-hf"}}}}; }
}  // namespace

TEST_CASE("the breakdown sums to the device total and the figures are ordered", "[estimate]") {
  for (const char* task : {"full", "lora", "qlora", "inference"}) {
    INFO(task);
    json j = llama7b();
    j["task"] = task;
    const Estimate e = run(j);
    u64 sum = 0;
    for (const Component& c : e.breakdown) sum += c.bytes;
    CHECK(sum == e.device_total_bytes);
    CHECK(e.allocated_peak_bytes <= e.reserved_peak_bytes);
    CHECK(e.reserved_peak_bytes <= e.device_total_bytes);
    CHECK_FALSE(e.peak_phase.empty());
  }
}

TEST_CASE("mixed-precision AdamW full fine-tuning of a 7B model does not fit on one 80 GB GPU", "[estimate][sanity]") {
  json j = llama7b();
  j["micro_batch_size"] = 1;
  j["gradient_checkpointing"] = true;
  const Estimate e = run(j);
  CHECK_FALSE(e.fits);
  // weights + gradients + AdamW states in fp32 = 16 bytes per parameter before activations
  CHECK(part(e, "weights") + part(e, "gradients") + part(e, "optimizer_states") >= 16 * e.params.total);
}

TEST_CASE("hand-worked: pure bf16 full fine-tuning of Llama-2-7B, model states", "[estimate][worked]") {
  // 6,738,415,616 parameters: weights 2 B each = 13,476,831,232 B; AdamW (torch, states in the
  // parameter dtype) 2 x 2 B = 26,953,662,464 B; at the optimizer step the gradients (2 B) and
  // the foreach temporary (one copy of exp_avg_sq, 2 B) are live too.
  json j = llama7b();
  j["precision"] = "bf16";
  j["micro_batch_size"] = 1;
  j["sequence_length"] = 128;
  j["gradient_checkpointing"] = true;
  const Estimate e = run(j);
  REQUIRE(e.peak_phase == "optimizer_step");
  CHECK(part(e, "weights") == 13'476'831'232);
  CHECK(part(e, "optimizer_states") == 26'953'662'464);
  CHECK(part(e, "gradients") == 13'476'831'232);
  CHECK(part(e, "temporary_buffers") == 13'476'831'232);
  // fused AdamW has no step temporary
  j["optimizer"] = "adamw_fused";
  CHECK(part(run(j), "temporary_buffers") < 13'476'831'232);
}

TEST_CASE("hand-worked: the logits and loss of a large vocabulary", "[estimate][worked]") {
  // Llama-3-8B, vocabulary 128,256, 1 x 8192 tokens: the fp32 log-softmax output is
  // 8192 x 128,256 x 4 B = 4,202,692,608 B, and the start of backward adds its gradient and the
  // gradient of its input (2 x the same) while it is still saved: 12,608,077,824 B in all.
  json j = {{"model", {{"id", "meta-llama/Meta-Llama-3-8B"}}}, {"task", "lora"}, {"precision", "bf16"},
            {"micro_batch_size", 1}, {"sequence_length", 8192}, {"gradient_checkpointing", true}};
  const Estimate e = run(j);
  CHECK(e.peak_phase == "backward");
  CHECK(part(e, "logits_loss") >= 12'608'077'824);
  CHECK(part(e, "logits_loss") < 12'608'077'824 + 8192 * 4096 * 20);  // + the final norm's tensors
}

TEST_CASE("QLoRA of a 7B model fits on one 24 GB GPU at sequence 2048", "[estimate][sanity]") {
  json j = llama7b();
  j["task"] = "qlora";
  j["precision"] = "bf16";
  j["micro_batch_size"] = 1;
  j["gradient_checkpointing"] = true;
  j["gpu"] = {{"name", "RTX4090-24GB"}};
  const Estimate e = run(j);
  CHECK(e.fits);
  // NF4: 4.5 bits per quantized weight; the 7B model's Linear weights are 6.48B of its 6.74B.
  CHECK(part(e, "weights") < 5 * GiB);
  CHECK(part(e, "weights") > 3 * GiB);
}

TEST_CASE("memory grows with batch, sequence and checkpointing off", "[estimate][monotone]") {
  json j = llama7b();
  j["task"] = "lora";
  u64 last = 0;
  for (u64 b : {1, 2, 4, 8}) {
    j["micro_batch_size"] = b;
    const u64 now = run(j).allocated_peak_bytes;
    CHECK(now > last);
    last = now;
  }
  j["micro_batch_size"] = 2;
  j["gradient_checkpointing"] = true;
  const u64 gc = run(j).allocated_peak_bytes;
  j["gradient_checkpointing"] = false;
  CHECK(run(j).allocated_peak_bytes > gc);
}

TEST_CASE("flash attention and sdpa avoid the s x s scores that eager attention keeps", "[estimate]") {
  json j = llama7b();
  j["task"] = "lora";
  j["micro_batch_size"] = 1;
  j["sequence_length"] = 4096;
  j["attention"] = "eager";
  const u64 eager = part(run(j), "activations");
  j["attention"] = "sdpa";
  const u64 sdpa = part(run(j), "activations");
  // eager keeps fp32 + bf16 probabilities: 32 layers x 32 heads x 4096^2 x 6 B = 96 GiB more
  CHECK(eager - sdpa > u64{90} * GiB);
}

TEST_CASE("optimizers differ by their states", "[estimate]") {
  json j = llama7b();
  j["precision"] = "fp32";
  j["micro_batch_size"] = 1;
  j["sequence_length"] = 64;
  auto states = [&](const char* opt) {
    j["optimizer"] = opt;
    return part(run(j), "optimizer_states");
  };
  const u64 n = 6'738'415'616;
  CHECK(states("adamw") == 8 * n);
  CHECK(states("sgd_momentum") == 4 * n);
  CHECK(states("lion") == 4 * n);
  CHECK(states("sgd") == 0);
  // bitsandbytes blockwise 8-bit: two uint8 states + two fp32 absmax per 256 elements, and the two
  // shared 256-entry fp32 maps (every Llama-2-7B tensor has at least 4,096 elements)
  CHECK(states("adamw_8bit") == 2 * n + n / 32 + 2 * 1024);
  CHECK(states("adafactor") < n / 100);
  // bitsandbytes keeps fp32 states whatever the parameter dtype
  j["precision"] = "bf16";
  CHECK(states("lion") == 4 * n);
}

TEST_CASE("bitsandbytes 8-bit states: tensors under 4096 elements stay fp32", "[estimate]") {
  // rank 1 on q/v of Llama-2-7B: lora_A [1, 4096] and lora_B [4096, 1] have 4,096 elements, which
  // is 8-bit (bitsandbytes' test is numel < min_8bit_size); the suite's 128-wide adapters measure
  // the fp32 side (llama/lora/bf16/nogc/sdpa/adamw_8bit in data/validation/cpu_suite_frameworks.json)
  json j = llama7b();
  j["task"] = "lora";
  j["lora"] = {{"rank", 1}, {"alpha", 2}, {"targets", {"q_proj", "v_proj"}}};
  j["optimizer"] = "adamw_8bit";
  const u64 tensors = 32 * 2 * 2, elems = 4096;
  CHECK(part(run(j), "optimizer_states") == tensors * 2 * (elems + 4 * (elems / 256)) + 2 * 1024);
}

TEST_CASE("inference: the longest context stops at the model's max_position_embeddings, with a note", "[estimate][inference]") {
  // Llama-3.1-8B (131,072 positions) at batch 1 on an 80 GB GPU: memory alone would allow more
  json j = {{"model", {{"id", "meta-llama/Llama-3.1-8B"}}}, {"task", "inference"}, {"precision", "bf16"},
            {"inference", {{"batch_size", 1}, {"context_length", 4096}}}, {"gpu", {{"name", "H100-SXM-80GB"}}}};
  const auto noted = [](const Estimate& e) {
    return std::any_of(e.notes.begin(), e.notes.end(), [](const std::string& n) { return n.find("max_position_embeddings") != std::string::npos; });
  };
  const Estimate e = run(j);
  CHECK(e.inference.max_context_at_batch == 131'072);
  CHECK(noted(e));
  // at batch 16 memory runs out first: a context that fits, below the cap, and no note
  j["inference"]["batch_size"] = 16;
  const Estimate b16 = run(j);
  CHECK(b16.inference.max_context_at_batch < 131'072);
  CHECK(b16.inference.max_context_at_batch > 4096);
  CHECK_FALSE(noted(b16));
}

TEST_CASE("inference: KV cache with GQA, sliding windows and the largest batch that fits", "[estimate][inference]") {
  json j = {{"model", {{"id", "meta-llama/Meta-Llama-3-8B"}}}, {"task", "inference"}, {"precision", "bf16"},
            {"inference", {{"batch_size", 1}, {"context_length", 8192}}}};
  const Estimate e = run(j);
  // 32 layers x 2 (K, V) x 8 KV heads x 128 x 2 B = 131,072 B per token
  CHECK(e.inference.kv_cache_bytes_per_token == 131'072);
  CHECK(e.inference.kv_cache_bytes == 131'072ULL * 8192);
  // a full-prompt prefill of 8192 tokens per sequence keeps [batch x 8192, 14336] MLP tensors
  CHECK(e.inference.max_batch_at_context > 20);
  j["inference"]["batch_size"] = e.inference.max_batch_at_context;
  CHECK(run(j).fits);
  j["inference"]["batch_size"] = e.inference.max_batch_at_context + 1;
  CHECK_FALSE(run(j).fits);
  // Gemma-2: every other layer attends to a 4096 window
  json g = {{"model", {{"id", "google/gemma-2-9b"}}}, {"task", "inference"}, {"precision", "bf16"},
            {"inference", {{"batch_size", 1}, {"context_length", 8192}}}};
  const Estimate ge = run(g);
  const u64 per_layer_token = 2 * 8 * 256 * 2;  // K and V, 8 KV heads of 256, bf16
  CHECK(ge.inference.kv_cache_bytes == per_layer_token * (21 * 8192 + 21 * 4096));
}

TEST_CASE("MLA caches the compressed latent unless asked for the Transformers layout", "[estimate][inference][mla]") {
  json j = {{"model", {{"id", "deepseek-ai/DeepSeek-V2-Lite"}}}, {"task", "inference"}, {"precision", "bf16"}};
  const Estimate e = run(j);
  CHECK(e.inference.kv_cache_bytes_per_token == 27 * (512 + 64) * 2);
  j["inference"] = {{"mla_cache", "expanded"}};
  CHECK(run(j).inference.kv_cache_bytes_per_token == 27 * 16 * (192 + 128) * 2);
}

TEST_CASE("absurd requests give an error or a correct huge number, never a wrapped one", "[estimate][hostile]") {
  json j = llama7b();
  j["micro_batch_size"] = 1'000'000'000;
  j["sequence_length"] = 1'000'000'000;
  CHECK_THROWS_AS(run(j), Error);
  json big = {{"model", {{"config", {{"model_type", "llama"}, {"hidden_size", 8192}, {"num_hidden_layers", 1'000'000},
                                      {"num_attention_heads", 64}, {"intermediate_size", 28672}, {"vocab_size", 10'000'000'000ULL}}}}},
              {"task", "inference"}, {"precision", "bf16"}, {"inference", {{"batch_size", 1}, {"context_length", 16}}}};
  const Estimate e = run(big);
  CHECK_FALSE(e.fits);
  CHECK(part(e, "weights") == 2 * e.params.total);
}

TEST_CASE("frozen bottom layers: fewer trainable parameters, no gradients or activations below", "[estimate][frozen]") {
  json j = llama7b();
  j["precision"] = "bf16";
  j["micro_batch_size"] = 1;
  j["sequence_length"] = 1024;
  const Estimate all = run(j);
  j["frozen_layers"] = 16;
  const Estimate half = run(j);
  // 16 of 32 layers (202,383,360 parameters each) and the embeddings (131,072,000) frozen
  CHECK(all.trainable_params - half.trainable_params == 16 * 202'383'360ULL + 131'072'000ULL);
  CHECK(half.allocated_peak_bytes < all.allocated_peak_bytes);
  j["frozen_layers"] = 32;
  CHECK_THROWS_WITH(run(j), Catch::Matchers::Contains("frozen_layers"));
  j["frozen_layers"] = 4;
  j["task"] = "lora";
  CHECK_THROWS_WITH(run(j), Catch::Matchers::Contains("full fine-tuning"));
}

TEST_CASE("runtime features that trade memory: chunked loss, offloaded activations, compile", "[estimate][runtime]") {
  json j = {{"model", {{"id", "meta-llama/Llama-3.2-3B"}}}, {"task", "full"}, {"precision", "bf16"},
            {"micro_batch_size", 2}, {"sequence_length", 4096}, {"optimizer", "adamw_fused"}};
  const Estimate base = run(j);
  j["runtime"] = {{"loss_chunks", 8}};
  const Estimate chunked = run(j);
  CHECK(part(chunked, "logits_loss") < part(base, "logits_loss"));
  j["runtime"] = {{"activation_offloading", true}};
  const Estimate offloaded = run(j);
  // two layers of saved tensors stay on the GPU instead of 28
  CHECK(part(offloaded, "activations") * 10 < part(base, "activations"));
  j["runtime"] = {{"compile", true}};
  CHECK(part(run(j), "activations") < part(base, "activations"));
}

TEST_CASE("torchtune compiles the loss, not the chunked head: the head's gradient sum stays", "[estimate][runtime]") {
  // torchtune's compile_model compiles the decoder layers and compile_loss the per-chunk
  // cross-entropy; the eight output projections and the sum of their weight gradients run eager:
  // once every chunk's loss backward has run, six of the eight bf16 logits-gradient chunks wait
  // while the running sum, the next product and their sum ([V, h] each) are alive.
  json j = {{"model", {{"id", "meta-llama/Llama-3.2-3B"}}}, {"task", "full"}, {"precision", "bf16"},
            {"micro_batch_size", 2}, {"sequence_length", 4096}, {"optimizer", "adamw_fused"},
            {"gradient_checkpointing", true},
            {"runtime", {{"framework", "torchtune"}, {"loss_chunks", 8}, {"compile", true}, {"optimizer_in_backward", true}}}};
  const u64 head_grad = 128256ull * 3072 * 2;      // [V, h] bf16 (tied with the embedding)
  const u64 logits = 2ull * 4096 * 128256 * 2;     // all chunks' logits gradients, bf16
  CHECK(part(run(j), "logits_loss") >= 3 * head_grad + logits / 8 * 6);
}

TEST_CASE("DDP without a bucket copy, and GPipe holding every micro-batch", "[estimate][parallel]") {
  json j = llama7b();
  j["task"] = "lora";
  j["num_gpus"] = 2;
  j["parallelism"] = {{"method", "ddp"}};
  j["precision"] = "fp32";
  j["task"] = "full";
  j["model"]["id"] = "meta-llama/Llama-3.2-1B";
  CHECK(part(run(j), "communication_buffers") > 0);
  j["parallelism"]["gradient_as_bucket_view"] = true;
  CHECK(part(run(j), "communication_buffers") == 0);
  json p = {{"model", {{"id", "meta-llama/Llama-3.2-1B"}}}, {"precision", "bf16"}, {"micro_batch_size", 2},
            {"sequence_length", 2048}, {"gradient_accumulation_steps", 16}, {"num_gpus", 4},
            {"parallelism", {{"method", "pp"}}}};
  const u64 one_f_one_b = part(run(p), "activations");
  p["parallelism"]["pipeline_schedule"] = "gpipe";
  CHECK(part(run(p), "activations") > 3 * one_f_one_b);
}

TEST_CASE("FP8 block-scaled weights take one byte per quantized parameter", "[estimate][inference]") {
  json j = {{"model", {{"id", "meta-llama/Llama-3.1-8B"}}}, {"task", "inference"}, {"precision", "bf16"},
            {"inference", {{"batch_size", 1}, {"context_length", 128}}}};
  const u64 bf16 = part(run(j), "weights");
  j["quantization"] = "fp8";
  const u64 fp8 = part(run(j), "weights");
  // Linear weights of the 8B model: 6,979,321,856 parameters; embeddings, head and norms stay bf16
  CHECK(bf16 - fp8 > 6'970'000'000ULL);
  CHECK(bf16 - fp8 < 6'979'321'856ULL);
}

TEST_CASE("QLoRA: prepare_model_for_kbit_training keeps the non-quantized weights in fp32", "[estimate]") {
  json j = llama7b();
  j["task"] = "qlora";
  j["precision"] = "bf16";
  j["quantization"] = "nf4";
  j["runtime"] = {{"prepare_kbit", true}};
  const u64 upcast = part(run(j), "weights");
  j["runtime"]["prepare_kbit"] = false;
  const u64 half = part(run(j), "weights");
  // untied embeddings and lm_head (32000 x 4096 each) and 65 RMSNorm weights, 2 more bytes each
  CHECK(upcast - half == 2 * (2 * 32000ULL * 4096 + 65 * 4096));
  // double quantization: 8-bit absmax (+ fp32 per 256 blocks) instead of fp32, and per Linear a
  // 256-entry fp32 map and an offset beside the 16-entry code table
  j["quantization"] = "nf4_double";
  const u64 dq = part(run(j), "weights");
  // 6,476,005,376 quantized weights in 224 Linears: 0.5 bit of fp32 absmax became 0.125 + 2/1024
  const u64 linear_weights = 6'476'005'376ULL, linears = 7 * 32;
  CHECK(half - dq == linear_weights / 8192 * (512 - 130) - linears * (256 * 4 + 4));
}

TEST_CASE("LitGPT 4-bit generate: the prefill dequantizes lm_head to fp16 and bf16 before its logits", "[estimate][inference][qlora]") {
  // LitGPT generate --quantize bnb.nf4 (Lightning BitsandbytesPrecision): lm_head is 4-bit too, and
  // a prefill of more than one token runs MatMul4Bit, which dequantizes the [V, h] weight to fp16
  // (Lightning quantized it from fp16) and casts it to bf16: 2 + 2 bytes per weight at once, more
  // than the bf16 weight plus the logits of one sequence (Llama-2-7B: 32000 x 4096).
  const json j = {{"model", {{"id", "meta-llama/Llama-2-7b-hf"}}}, {"task", "inference"}, {"precision", "bf16"},
                  {"quantization", "nf4"}, {"inference", {{"batch_size", 1}, {"context_length", 56}}},
                  {"runtime", {{"framework", "litgpt"}}}};
  const Estimate e = estimate(request_from_json(j));
  u64 logits_loss = 0;
  for (const Component& c : e.breakdown)
    if (c.name == "logits_loss") logits_loss = c.bytes;
  CHECK(logits_loss == 4ull * 32000 * 4096);
}

TEST_CASE("a loop that keeps its outputs keeps bitsandbytes' ctx-held inputs into the next step", "[estimate][qlora]") {
  // LitGPT's fit() keeps `logits` and `loss`, hence the step's autograd graph, until the next step
  // rebinds them. Backward released what save_for_backward saved, but MatMul4Bit before 0.43.2 keeps
  // its input A as a plain ctx attribute: alive with its node through the next forward and loss.
  // Llama-2-7B, q/v LoRA: the 4-bit Linears read x_normed (h), the attention output (h), the MLP's
  // normed input (h) and its product (i): (3 x 4096 + 11008) x 2 bytes per token and layer.
  json j = {{"model", {{"id", "meta-llama/Llama-2-7b-hf"}}}, {"task", "qlora"}, {"quantization", "nf4"},
            {"precision", "bf16"}, {"micro_batch_size", 1}, {"sequence_length", 512},
            {"runtime", {{"framework", "litgpt"}, {"bitsandbytes_version", "0.42.0"}}}};
  const double ctx_graph = (3.0 * 4096 + 11008) * 2 * 32 * 512;
  const double kept = static_cast<double>(run(j).allocated_peak_bytes);
  j["runtime"]["later_steps_shorter"] = true;
  const double first_longest = static_cast<double>(run(j).allocated_peak_bytes);
  CHECK(kept - first_longest > 0.5 * ctx_graph);
  CHECK(kept - first_longest <= ctx_graph);
  // bitsandbytes 0.43.2 keeps (None, B): nothing outlives the backward
  j["runtime"]["bitsandbytes_version"] = "0.43.2";
  j["runtime"]["later_steps_shorter"] = false;
  const u64 fixed = run(j).allocated_peak_bytes;
  j["runtime"]["later_steps_shorter"] = true;
  CHECK(run(j).allocated_peak_bytes == fixed);
  j["runtime"]["later_steps_shorter"] = 1;
  CHECK_THROWS_WITH(run(j), Catch::Contains("runtime.later_steps_shorter"));
}
