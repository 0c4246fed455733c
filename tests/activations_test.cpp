// Per-layer saved bytes of the activation model, pinned to numbers MEASURED by the CPU harness
// (validate/analyze_saved.py: unique non-parameter storages that autograd saves, torch 2.15,
// transformers 5.23, peft 0.21.2; the tiny configs of data/validation/tiny_configs at b=2, s=64).
// Layer 1 is used (layer 0's first norm keeps the embedding output, attributed outside).
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "activations.hpp"
#include "memfit/api.hpp"
#include "states.hpp"

using nlohmann::json;
using namespace memfit;
using namespace memfit::detail;

namespace {

json tiny(const std::string& family) {
  std::ifstream f(std::string(MEMFIT_DATA_DIR) + "/validation/tiny_configs/" + family + "-tiny.json");
  return json::parse(f);
}

/// The activations of the last layer group (the one holding layer 1) for a CPU training request.
LayerActivations layer1(const std::string& family, const char* task, const char* precision, const char* attention) {
  json j = {{"model", {{"config", tiny(family)}}},
            {"task", task},
            {"precision", precision},
            {"attention", attention},
            {"micro_batch_size", 2},
            {"sequence_length", 64},
            {"device", "cpu"}};
  if (std::string(task) == "lora") j["lora"] = {{"rank", 8}, {"alpha", 16}, {"targets", "all-linear"}};
  const Request r = request_from_json(j);
  const ModelStates s = model_states(r, MixedMode::None);
  const size_t g = r.model.groups.size() - 1;
  return layer_activations(r.model, r.model.groups[g], r, s.linears[g], 128, 64);
}

}  // namespace

TEST_CASE("llama layer, full fine-tuning: saved bytes equal the measured totals", "[activations]") {
  // validate/NOTES.md, "What autograd saves per decoder layer": fp32 SDPA layer 1,610,752 B,
  // bf16 SDPA layer 873,472 B (llama-tiny, b=2, s=64).
  CHECK(layer1("llama", "full", "fp32", "sdpa").saved == 1610752);
  CHECK(layer1("llama", "full", "bf16", "sdpa").saved == 873472);
}

TEST_CASE("llama layer, LoRA all-linear r8: saved bytes equal the measurement", "[activations]") {
  // analyze_saved.py --lora: layers.1 1,508,352 B (fp32 sdpa); --lora --precision bf16: 1,295,360 B
  // (fp32 adapters: each adapted Linear keeps its own fp32 cast of its input).
  CHECK(layer1("llama", "lora", "fp32", "sdpa").saved == 1508352);
  CHECK(layer1("llama", "lora", "bf16", "sdpa").saved == 1295360);
}

TEST_CASE("q/k norms, Gemma2 post-norms and fused gate_up are counted", "[activations]") {
  // analyze_saved.py qwen3-tiny --precision bf16 (sdpa): layers.1 1,075,200 B
  CHECK(layer1("qwen3", "full", "bf16", "sdpa").saved == 1075200);
  // analyze_saved.py gemma2-tiny --precision bf16 --attention eager: layers.1 1,511,424 B
  // (4 norms with fp32 x_hat and (1 + weight), tanh-softcapped scores)
  CHECK(layer1("gemma2", "full", "bf16", "eager").saved == 1511424);
  // analyze_saved.py phi3-tiny --attention eager --lora: layers.1 1,524,736 B
  CHECK(layer1("phi3", "lora", "fp32", "eager").saved == 1524736);
}

TEST_CASE("MoE layers as fused experts", "[activations]") {
  // analyze_saved.py qwen3_moe-tiny (fp32 sdpa): layers.1 1,464,336 B
  CHECK(layer1("qwen3_moe", "full", "fp32", "sdpa").saved == Approx(1464336).epsilon(0.005));
  // analyze_saved.py mixtral-tiny --lora (fp32 sdpa): layers.1 5,312,016 B, of which the merged
  // expert weights W + B@A kept by grouped_mm are 2,752,512 B
  CHECK(layer1("mixtral", "lora", "fp32", "sdpa").saved == 5312016);
}

TEST_CASE("PEFT LoRA on Transformers 5 MoE layers", "[activations]") {
  // analyze_saved.py mixtral-tiny --lora --precision bf16 (sdpa): layers.1 3,136,016 B: the router
  // (ParamWrapper) keeps its bf16 input and merged weight, the fused experts their merged weights
  // and the bf16 casts of the adapter factors baddbmm keeps; fp32 routing weights
  CHECK(layer1("mixtral", "lora", "bf16", "sdpa").saved == 3136016);
  // analyze_saved.py qwen3_moe-tiny --lora --precision bf16 (sdpa): layers.1 1,242,640 B
  CHECK(layer1("qwen3_moe", "lora", "bf16", "sdpa").saved == 1242640);
  // analyze_saved.py qwen2_moe-tiny --lora (sdpa): layers.1 2,392,592 B fp32, 1,859,344 B bf16
  // (experts and router not adapted; the shared expert's down_proj adapter keeps an fp32 cast of
  // its shared_expert_intermediate-wide input)
  CHECK(layer1("qwen2_moe", "lora", "fp32", "sdpa").saved == 2392592);
  CHECK(layer1("qwen2_moe", "lora", "bf16", "sdpa").saved == 1859344);
}

TEST_CASE("DeepSeek-V3: MLA on the CPU SDPA math path, eager's v copy, fp32 router", "[activations]") {
  // analyze_saved.py deepseek_v3-tiny (bf16, sdpa): layers.1 935,952 B; --lora fp32: 1,325,072 B;
  // --lora --attention eager bf16: 1,101,840 B. What is not modelled: the noaux_tc router's
  // group top-k indices and score mask (5,632 B a layer here); with fp32 adapters the estimate
  // counts a bf16 cast of down_proj's lora_B factor (8,192 B) that the measurement does not list.
  CHECK(layer1("deepseek_v3", "full", "bf16", "sdpa").saved == Approx(935952).epsilon(0.005));
  CHECK(layer1("deepseek_v3", "lora", "fp32", "sdpa").saved == Approx(1325072).epsilon(0.005));
  CHECK(layer1("deepseek_v3", "lora", "bf16", "eager").saved == Approx(1101840).epsilon(0.01));  // 5,632 B short
}

TEST_CASE("CPU SDPA with attention dropout keeps the math path's fp32 tensors", "[activations]") {
  // analyze_saved.py gpt2-tiny (sdpa, dropout 0.1), sum of transformer.h.1's saved storages:
  // 2,361,344 B fp32 and 1,475,584 B bf16 (the math fallback's q, k^T, v, probs, noise mask and
  // dropout output stay fp32 in bf16 too).
  CHECK(layer1("gpt2", "full", "fp32", "sdpa").saved == 2361344);
  CHECK(layer1("gpt2", "full", "bf16", "sdpa").saved == 1475584);
}

TEST_CASE("a checkpointed layer recomputes all but the input it aliases", "[activations]") {
  // tracker at the peak of llama/lora/fp32/gc/sdpa (backward of layer 0's MLP): backward_temp
  // 2,028,548 B = recomputed layer (saved minus the checkpointed input, 65,536 B) + gradients
  const LayerActivations a = layer1("llama", "lora", "fp32", "sdpa");
  CHECK(a.recomputed == a.saved - 65536);
  CHECK(a.checkpoint_saved == 65536);
  const LayerActivations b = layer1("llama", "lora", "bf16", "sdpa");
  CHECK(b.recomputed == b.saved);  // bf16 RMSNorm keeps an fp32 copy, not the input
}

TEST_CASE("a checkpointed LoRA layer recomputes inside down_proj's lora_B backward", "[activations]") {
  // tracker at the peak of llama/lora/bf16/gc/sdpa (3,618,744 B, layer 0's recomputation at
  // up_proj): besides the incoming gradient, the base branch's bf16 cast of it (32,768 B) and the
  // adapter branch's fp32 grad * scaling (65,536 B) stay alive through the recomputation
  CHECK(layer1("llama", "lora", "bf16", "sdpa").recompute_held == 98304);
  CHECK(layer1("llama", "lora", "fp32", "sdpa").recompute_held == 65536);  // grad * scaling only
  CHECK(layer1("llama", "full", "bf16", "sdpa").recompute_held == 0);
  // peakdump at the peak of gptj/lora/bf16/gc/eager (layer 0's recomputation at fc_out's
  // lora_A): the incoming gradient, its bf16 cast (32,768 B) and fp32 grad * scaling (65,536 B)
  CHECK(layer1("gptj", "lora", "bf16", "eager").recompute_held == 98304);
  // gpt2/lora/bf16/gc/eager: resid_dropout's mask is unpacked first, before any gradient of the
  // block: only the incoming gradient is alive through the recomputation
  CHECK(layer1("gpt2", "lora", "bf16", "eager").recompute_held == 0);
}

TEST_CASE("MLP forward moment of a LoRA GPT-2 block (c_proj's lora_B * scaling)", "[activations]") {
  // peakdump at the peak of gpt2/lora/bf16/gc/eager (3,515,976 B, mul.Tensor after c_proj's
  // lora_B mm): besides the saved tensors, attn_output (resid_dropout mul, 32,768 B), ln_2's output
  // (32,768 B), the gelu_new product fed to c_proj (131,072 B), c_proj's addmm (32,768 B), lora_B's
  // output and its * scaling copy (fp32, 65,536 B each): 360,448 B; forward_transient is counted
  // over the whole layer's saved tensors, which include the MLP's resid_dropout mask (32,768 B)
  // not yet drawn at this moment
  CHECK(layer1("gpt2", "lora", "bf16", "eager").forward_transient == 360448 - 32768);
}
TEST_CASE("LayerNorm families in bf16 eager", "[activations]") {
  // analyze_saved.py starcoder2-tiny --precision bf16 --attention eager: layers.1 918,528 B
  // (LayerNorm keeps its bf16 input and bf16 mean/rstd on CPU; fp32 softmax + bf16 copy)
  CHECK(layer1("starcoder2", "full", "bf16", "eager").saved == 918528);
  // analyze_saved.py opt-tiny --precision bf16 --attention eager: layers.1 656,384 B (OPT's
  // softmax upcasts to fp32; two residual dropout masks as bf16 noise on CPU)
  CHECK(layer1("opt", "full", "bf16", "eager").saved == 656384);
}

TEST_CASE("Falcon SDPA keeps each layer's own mask and per-head K/V copies", "[activations]") {
  // analyze_saved.py falcon-tiny --lora --attention sdpa (fp32): layers.1 1,042,448 B, of which a
  // (2,1,64,64) mask per layer and q, k, v, out (2,16,64,8) each (two int64 [1] offsets, 16 B, aside)
  CHECK(layer1("falcon", "lora", "fp32", "sdpa").saved == 1042448 - 16);
}

TEST_CASE("LoRA without checkpointing: layer 0's frozen first norm keeps nothing", "[activations]") {
  // analyze_saved.py falcon-tiny --lora (fp32): layer 0 has no ln_attn/ln_mlp input, mean or rstd;
  // layer 1's ln_attn keeps the layer input and its mean and rstd (65,536 + 2 x 512 B), which is
  // what the first layer does not keep (gpt2/lora/fp32/nogc/eager: llama, gpt2, ... sdpa cases
  // went to +0.01 % with it)
  CHECK(layer1("falcon", "lora", "fp32", "sdpa").first_norm == 65536 + 2 * 512);
}

TEST_CASE("CPU SDPA with a window: per-layer mask; cat-built rotary q: o_proj keeps a copy", "[activations]") {
  // analyze_saved.py phi3-tiny --lora --attention sdpa (fp32, window 31 < s = 64): layers.1
  // 1,496,064 B with the layer's own (2,1,64,64) where mask and o_proj's lora_A keeping a
  // contiguous copy of the (2,8,64,16) SDPA output
  CHECK(layer1("phi3", "lora", "fp32", "sdpa").saved == 1496064);
}

TEST_CASE("CUDA SDPA with a window: the same per-layer float mask, padded to 8 keys", "[activations]") {
  // Not measured (no GPU): from source. Transformers builds the same bool mask on every device
  // (masking_utils.py sdpa_mask); SDPA converts it to a float bias in the query dtype
  // (attention.cpp convert_boolean_attn_mask); CUDA's memory-efficient kernel saves it for the
  // backward (derivatives.yaml) after preprocess_mask pads its last dim to a multiple of 8.
  const auto saved = [](bool windowed, u64 seq) {
    json config = tiny("phi3");  // window 31, 8 heads, 8 K/V heads (no K/V repeat)
    if (!windowed) config.erase("sliding_window");
    json j = {{"model", {{"config", config}}}, {"task", "lora"}, {"precision", "fp32"}, {"attention", "sdpa"},
              {"micro_batch_size", 2}, {"sequence_length", seq}, {"device", "cuda"}, {"gpu", {{"name", "H100-SXM-80GB"}}},
              {"lora", {{"rank", 8}, {"alpha", 16}, {"targets", "all-linear"}}}};
    const Request r = request_from_json(j);
    const ModelStates s = model_states(r, MixedMode::None);
    return layer_activations(r.model, r.model.groups.back(), r, s.linears.back(), 2 * seq, seq).saved;
  };
  CHECK(saved(true, 64) - saved(false, 64) == 2 * 64 * 64 * 4);  // [2, 1, 64, 64] fp32
  CHECK(saved(true, 60) - saved(false, 60) == 2 * 60 * 64 * 4);  // [2, 1, 60, 60] padded to 64 keys
}

TEST_CASE("GPTBigCode bf16 eager: fp32 softmax, attention dropout on its half copy", "[activations]") {
  // analyze_saved.py gpt_bigcode-tiny --lora --precision bf16 --attention eager: layers.1
  // 1,098,752 B: fp32 softmax (131,072 B), bf16 dropout noise and output (65,536 B each), no
  // bf16 copy of the softmax kept
  CHECK(layer1("gpt_bigcode", "lora", "bf16", "eager").saved == 1098752);
}

TEST_CASE("full fine-tuning: down_proj's gradient is alive at the MLP's backward moments", "[activations]") {
  // bloom/full/fp32/nogc/eager measured 10,932,860 B at layer 1's BloomGelu backward, with
  // dense_4h_to_h's weight and bias gradient (262,656 B) already produced (peakdump)
  json j = {{"model", {{"config", tiny("bloom")}}}, {"task", "full"}, {"precision", "fp32"},
            {"attention", "eager"}, {"micro_batch_size", 2}, {"sequence_length", 64}, {"device", "cpu"}};
  const Estimate e = estimate(request_from_json(j));
  CHECK(std::abs(double(e.allocated_peak_bytes) - 10932860.0) / 10932860.0 < 0.005);
}

TEST_CASE("LitGPT QLoRA: lm_head is 4-bit and each head chunk dequantizes it through an fp16 copy", "[activations][qlora]") {
  // Lightning's BitsandbytesPrecision (LitGPT --quantize bnb.nf4) replaces every nn.Linear, lm_head's
  // too, quantizing from an fp16 copy: dequantize_4bit returns fp16 and MatMul4Bit casts it to the
  // compute dtype. Llama-2-7B's head: 32000 x 4096 = 131,072,000 weights; NF4 codes + an fp32 absmax
  // per 64 = 4.5 bits each, plus the 16-entry fp32 code table; dense, fp16 + bf16 = 4 bytes each.
  json j = {{"model", {{"id", "meta-llama/Llama-2-7b-hf"}}}, {"task", "qlora"}, {"quantization", "nf4"},
            {"precision", "bf16"}, {"lora", {{"adapter_dtype", "bf16"}}}, {"micro_batch_size", 1}, {"sequence_length", 512},
            {"runtime", {{"framework", "litgpt"}, {"bitsandbytes_version", "0.42.0"}}}};
  const Request lit = request_from_json(j);
  CHECK(model_states(lit, MixedMode::None).head_w_split == 131'072'000ull * 9 / 16 + 64);
  json hf = j;  // Transformers' BitsAndBytesConfig skips lm_head
  hf["runtime"] = {{"framework", "transformers"}, {"prepare_kbit", false}, {"bitsandbytes_version", "0.42.0"}};
  CHECK(model_states(request_from_json(hf), MixedMode::None).head_w_split == 131'072'000ull * 2);
  json lora = j;
  lora["task"] = "lora";
  lora["quantization"] = "none";
  const Request plain = request_from_json(lora);
  const HeadActivations q = head_activations(lit.model, lit, false, 512), p = head_activations(plain.model, plain, false, 512);
  CHECK(q.loss_backward_peak - p.loss_backward_peak == 4ull * 131'072'000);
  CHECK(q.loss_forward_peak - p.loss_forward_peak == 4ull * 131'072'000);
}
