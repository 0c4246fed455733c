// Parameter counts must be exact: every config of the bundled library whose published total is
// known is checked against it, and every bundled config must parse (or, for partial files,
// fail with a message naming the missing field).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "memfit/error.hpp"
#include "memfit/model.hpp"

using nlohmann::json;
using namespace memfit;

namespace {
json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  REQUIRE(in);
  return json::parse(in);
}
std::filesystem::path configs() { return std::filesystem::path(MEMFIT_DATA_DIR) / "configs"; }
ModelSpec load(const std::string& file) {
  std::filesystem::path p = configs() / (file + ".json");
  if (!std::filesystem::exists(p)) p = configs() / "partial" / (file + ".json");
  json cfg = read_json(p);
  // The partial gemma-7b file keeps only the size fields; its Hub id names the family.
  if (file == "google--gemma-7b" && !cfg.contains("model_type")) cfg["model_type"] = "gemma";
  return parse_model_config(cfg);
}
}  // namespace

TEST_CASE("parameter counts equal the published totals recorded in data/configs", "[model][params]") {
  const json counts = read_json(configs() / "published_param_counts.json");
  REQUIRE(counts.size() >= 20);
  for (auto it = counts.begin(); it != counts.end(); ++it) {
    INFO(it.key());
    const ModelSpec m = load(it.key());
    u64 expected = it.value()["params"].get<u64>();
    // Falcon checkpoints store lm_head.weight separately although the module ties it to the word
    // embeddings (the recorded note says so); the model has one vocab x hidden matrix fewer.
    if (it.key().starts_with("tiiuae--falcon")) expected -= m.vocab * m.hidden;
    CHECK(count_params(m).total == expected);
  }
}

TEST_CASE("parameter counts equal the totals on the model cards", "[model][params]") {
  // Published totals (model cards / Hub safetensors metadata); SOURCES.md's consistency check
  // found the same totals from these files.
  const std::pair<const char*, u64> cards[] = {
      {"meta-llama--Llama-2-7b-hf", 6'738'415'616},     {"meta-llama--Llama-2-13b-hf", 13'015'864'320},
      {"meta-llama--Llama-2-70b-hf", 68'976'648'192},   {"meta-llama--Meta-Llama-3-8B", 8'030'261'248},
      {"meta-llama--Llama-3.1-8B", 8'030'261'248},      {"meta-llama--Llama-3.1-70B", 70'553'706'496},
      {"meta-llama--Llama-3.1-405B", 405'853'388'800},  {"meta-llama--Llama-3.2-1B", 1'235'814'400},
      {"meta-llama--Llama-3.2-3B", 3'212'749'824},      {"mistralai--Mistral-7B-v0.1", 7'241'732'096},
      {"mistralai--Mixtral-8x7B-v0.1", 46'702'792'704}, {"TinyLlama--TinyLlama-1.1B-Chat-v1.0", 1'100'048'384},
      {"google--gemma-2b", 2'506'172'416},              {"google--gemma-2-2b", 2'614'341'888},
      {"google--gemma-2-9b", 9'241'705'984},            {"Qwen--Qwen2.5-0.5B", 494'032'768},
      {"Qwen--Qwen3-8B", 8'190'735'360},                {"Qwen--Qwen3-30B-A3B", 30'532'122'624},
      {"microsoft--phi-2", 2'779'683'840},              {"microsoft--Phi-3-mini-4k-instruct", 3'821'079'552},
      {"openai-community--gpt2", 124'439'808},          {"openai-community--gpt2-medium", 354'823'168},
      {"facebook--opt-1.3b", 1'315'758'080},
  };
  for (const auto& [file, total] : cards) {
    INFO(file);
    CHECK(count_params(load(file)).total == total);
  }
}

TEST_CASE("every complete bundled config parses; partial ones parse or name the missing field", "[model]") {
  for (const auto& entry : std::filesystem::directory_iterator(configs())) {
    if (entry.path().extension() != ".json" || entry.path().filename() == "published_param_counts.json") continue;
    INFO(entry.path().filename().string());
    const ModelSpec m = parse_model_config(read_json(entry.path()));
    CHECK(count_params(m).total > 0);
    CHECK_FALSE(m.approximate);
  }
  for (const auto& entry : std::filesystem::directory_iterator(configs() / "partial")) {
    INFO(entry.path().filename().string());
    try {
      const ModelSpec m = parse_model_config(read_json(entry.path()));
      CHECK(count_params(m).total > 0);
    } catch (const Error& e) {
      const std::string msg = e.what();
      const bool names_problem = msg.find("has no") != std::string::npos || msg.find("encoder-decoder") != std::string::npos || msg.find("model_type") != std::string::npos;
      CHECK(names_problem);
    }
  }
}

TEST_CASE("tied embeddings are counted once and untied heads twice", "[model][params]") {
  json cfg = {{"model_type", "llama"}, {"hidden_size", 64},       {"num_hidden_layers", 2},
              {"num_attention_heads", 4}, {"intermediate_size", 128}, {"vocab_size", 1000}};
  cfg["tie_word_embeddings"] = true;
  const u64 tied = count_params(parse_model_config(cfg)).total;
  cfg["tie_word_embeddings"] = false;
  const u64 untied = count_params(parse_model_config(cfg)).total;
  CHECK(untied - tied == 1000 * 64);
  // Worked by hand: per layer q,k,v,o 4*64*64 + MLP 3*64*128 + 2 norms 2*64 = 41,088;
  // two layers 82,176 + embedding 64,000 + final norm 64 = 146,240 (tied).
  CHECK(tied == 146'240);
}

TEST_CASE("MoE configs count every expert but only top-k as active", "[model][params][moe]") {
  const ModelSpec m = load("mistralai--Mixtral-8x7B-v0.1");
  const ParamCounts c = count_params(m);
  // 8 experts, 2 per token: the routed expert weights are 3 * 4096 * 14336 per expert per layer.
  const u64 expert = u64{3} * 4096 * 14336;
  CHECK(c.total - c.active_per_token == u64{32} * 6 * expert);
}

TEST_CASE("Qwen MoE configs saved by Transformers 5 (num_local_experts) count the same", "[model][params][moe]") {
  json cfg = read_json(configs() / "Qwen--Qwen3-30B-A3B.json");
  const ParamCounts hub = count_params(parse_model_config(cfg));
  cfg["num_local_experts"] = cfg["num_experts"];
  cfg.erase("num_experts");
  const ParamCounts saved = count_params(parse_model_config(cfg));
  CHECK(saved.total == hub.total);
  CHECK(saved.active_per_token == hub.active_per_token);
}

TEST_CASE("MLA and shared experts of DeepSeek are counted exactly", "[model][params][mla]") {
  const ModelSpec m = load("deepseek-ai--DeepSeek-V2-Lite");
  CHECK(m.attention == AttentionKind::MultiLatent);
  CHECK(m.kv_lora_rank == 512);
  CHECK(count_params(m).total == 15'706'484'224);
}

TEST_CASE("missing or malformed fields give errors that name them", "[model][errors]") {
  json cfg = {{"model_type", "llama"}, {"hidden_size", 64}, {"num_attention_heads", 4}, {"intermediate_size", 128},
              {"vocab_size", 1000}};
  CHECK_THROWS_WITH(parse_model_config(cfg), Catch::Matchers::Contains("num_hidden_layers"));
  cfg["num_hidden_layers"] = -3;
  CHECK_THROWS_WITH(parse_model_config(cfg), Catch::Matchers::Contains("num_hidden_layers"));
  cfg["num_hidden_layers"] = "32";
  CHECK_THROWS_WITH(parse_model_config(cfg), Catch::Matchers::Contains("must be a number"));
  CHECK_THROWS_WITH(parse_model_config(json::array()), Catch::Matchers::Contains("JSON object"));
  CHECK_THROWS_WITH(parse_model_config(json{{"foo", 1}}), Catch::Matchers::Contains("model_type"));
  CHECK_THROWS_WITH(parse_model_config(json{{"model_type", "t5"}}), Catch::Matchers::Contains("encoder-decoder"));
  // state-space models say what they are, not "add num_attention_heads" (UX review step 3c)
  const json mamba = {{"model_type", "mamba"}, {"hidden_size", 768}, {"num_hidden_layers", 24}, {"vocab_size", 50280}};
  CHECK_THROWS_WITH(parse_model_config(mamba), Catch::Matchers::Contains("state-space"));
  json renamed = mamba;
  renamed["model_type"] = "my_ssm";
  CHECK_THROWS_WITH(parse_model_config(renamed), Catch::Matchers::Contains("no attention heads"));
}

TEST_CASE("an unknown model_type with standard fields is estimated and flagged approximate", "[model]") {
  json cfg = {{"model_type", "brand_new_lm"}, {"hidden_size", 64},       {"num_hidden_layers", 2},
              {"num_attention_heads", 4},     {"intermediate_size", 128}, {"vocab_size", 1000}};
  const ModelSpec m = parse_model_config(cfg);
  CHECK(m.approximate);
  REQUIRE_FALSE(m.warnings.empty());
  CHECK_THAT(m.warnings.front(), Catch::Matchers::Contains("approximate"));
  CHECK_THAT(m.warnings.front(), Catch::Matchers::Contains("family_traits.cpp"));  // says what to do
}

TEST_CASE("absurd sizes give a clear error or an exact huge count, never a wrapped number", "[model][hostile]") {
  json cfg = {{"model_type", "llama"}, {"hidden_size", 8192},        {"num_hidden_layers", 1'000'000},
              {"num_attention_heads", 64}, {"intermediate_size", 28672}, {"vocab_size", 10'000'000'000ULL}};
  const ModelSpec m = parse_model_config(cfg);
  const ParamCounts c = count_params(m);
  // embedding 10^10 * 8192 and 10^6 layers of (4*8192^2 + 3*8192*28672 + 2*8192)
  const u64 layer = u64{4} * 8192 * 8192 + u64{3} * 8192 * 28672 + 2 * 8192;
  CHECK(c.total == u64{10'000'000'000} * 8192 * 2 + u64{1'000'000} * layer + 8192);
  cfg["hidden_size"] = 1ULL << 41;
  CHECK_THROWS_WITH(parse_model_config(cfg), Catch::Matchers::Contains("absurdly large"));
}

TEST_CASE("multimodal configs are sized through their text_config", "[model]") {
  json cfg = {{"model_type", "gemma3"},
              {"text_config",
               {{"model_type", "gemma3_text"}, {"hidden_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                {"num_key_value_heads", 1}, {"head_dim", 16}, {"intermediate_size", 128}, {"vocab_size", 1000}}},
              {"vision_config", {{"hidden_size", 32}}}};
  const ModelSpec m = parse_model_config(cfg);
  CHECK(m.model_type == "gemma3_text");
  REQUIRE_FALSE(m.notes.empty());
  CHECK_THAT(m.notes.front(), Catch::Matchers::Contains("vision tower"));
}

namespace {
u64 layers_where(const ModelSpec& m, bool (*pred)(const LayerGroup&)) {
  u64 n = 0;
  for (const LayerGroup& g : m.groups)
    if (pred(g)) n += g.count;
  return n;
}
}  // namespace

TEST_CASE("a window or chunk no longer than the sequence gets an explicit mask", "[model]") {
  // transformers 5.23 masking_utils.py _ignore_causal_mask_sdpa keeps the mask when
  // kv_length >= local_attention_size (measured: a (3, 1, 32, 32) mask at s = window = 32)
  LayerGroup window;
  window.sliding_window = 32;
  CHECK_FALSE(window.local_mask(31));
  CHECK(window.local_mask(32));
  CHECK(window.local_mask(64));
  LayerGroup chunk;
  chunk.attention_chunk = 64;
  CHECK_FALSE(chunk.local_mask(63));
  CHECK(chunk.local_mask(64));
  CHECK_FALSE(LayerGroup{}.local_mask(4096));
}

TEST_CASE("gpt-oss: sinks, biases, alternating sliding window and MXFP4 storage", "[model][params][gpt_oss]") {
  const ModelSpec m = load("openai--gpt-oss-20b");
  CHECK(m.layers == 24);
  CHECK(layers_where(m, [](const LayerGroup& g) { return g.attention_kind() == LayerAttention::SlidingWindow; }) == 12);
  CHECK(layers_where(m, [](const LayerGroup& g) { return g.sliding_window == 128; }) == 12);
  CHECK(layers_where(m, [](const LayerGroup& g) { return g.moe && g.experts == 32 && g.experts_per_token == 4; }) == 24);
  REQUIRE(m.checkpoint_quant.method == "mxfp4");
  // By hand: the expert weights (not their biases) are MXFP4: per layer 32 x 2880 x 5760 (gate_up) +
  // 32 x 2880 x 2880 (down) = 796,262,400 elements, x 24 layers = 19,110,297,600, at 4 bits + one
  // scale byte per 32 = 0.53125 bytes -> 10,152,345,600 bytes. The other 1,804,459,584 parameters
  // stay bf16 (3,608,919,168 bytes).
  CHECK(checkpoint_weight_bytes(m, 2) == u64{10'152'345'600} + u64{3'608'919'168});
}

TEST_CASE("Llama 4 Scout: chunked RoPE layers, full NoPE layers, shared expert and vision tower", "[model][params][llama4]") {
  const ModelSpec m = load("RedHatAI--Llama-4-Scout-17B-16E-Instruct-FP8-dynamic");
  CHECK(m.model_type == "llama4_text");
  // no_rope_layers is empty in the file, so Llama4TextConfig's rule applies: every 4th layer NoPE.
  CHECK(layers_where(m, [](const LayerGroup& g) { return !g.rope && g.attention_kind() == LayerAttention::Full; }) == 12);
  CHECK(layers_where(m, [](const LayerGroup& g) { return g.rope && g.attention_chunk == 8192; }) == 36);
  CHECK(layers_where(m, [](const LayerGroup& g) { return g.moe && g.shared_intermediate == 8192; }) == 48);
  // By hand (vision_config): patch Linear 588 x 1408, class token 1408, positions 577 x 1408,
  // LayerNorm pre/post 4 x 1408, 34 layers x 23,807,872, adapter 5632 x 4096 + 4096 x 4096,
  // projector 4096 x 5120.
  CHECK(m.vision_params == u64{871'932'416});
}

TEST_CASE("Gemma 3: five sliding layers to one full, SigLIP tower counted", "[model][params][gemma3]") {
  const ModelSpec m = load("google--gemma-3-4b-it");
  CHECK(layers_where(m, [](const LayerGroup& g) { return g.sliding_window == 1024; }) == 29);
  CHECK(layers_where(m, [](const LayerGroup& g) { return g.attention_kind() == LayerAttention::Full; }) == 5);
  // SigLIP-400M (27 layers x 15,239,504 + patch conv 678,528 + 4096 positions x 1152 + post norm)
  // = 416,866,032, projector 1152 x 2560 + soft-embedding norm 1152.
  CHECK(m.vision_params == u64{416'866'032} + 1152 * 2560 + 1152);
  CHECK(m.kv_heads == 4);  // Gemma3TextConfig default: the published file does not say
  const ModelSpec text = load("google--gemma-3-1b-it");
  CHECK(text.vision_params == 0);
  CHECK(layers_where(text, [](const LayerGroup& g) { return g.sliding_window == 512; }) == 22);
}

TEST_CASE("SmolLM3: every fourth layer has no rotary embedding", "[model][smollm3]") {
  const ModelSpec m = load("HuggingFaceTB--SmolLM3-3B");
  CHECK(layers_where(m, [](const LayerGroup& g) { return !g.rope; }) == 9);
  CHECK(m.tied_embeddings);
}

TEST_CASE("a multimodal wrapper whose vision tower memfit does not know says it is left out", "[model]") {
  json cfg = {{"model_type", "llava"},
              {"text_config",
               {{"model_type", "llama"}, {"hidden_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                {"intermediate_size", 128}, {"vocab_size", 1000}}},
              {"vision_config", {{"hidden_size", 32}}}};
  const ModelSpec m = parse_model_config(cfg);
  CHECK(m.vision_params == 0);
  REQUIRE_FALSE(m.warnings.empty());  // an under-count: a warning, not a note
  CHECK_THAT(m.warnings.back(), Catch::Matchers::Contains("not counted"));
}

TEST_CASE("family traits: attention kernels, PEFT targets and config-driven flags come from the table", "[model][traits]") {
  const ModelSpec bloom = parse_model_config(read_json(configs() / "bigscience--bloom-560m.json"));
  CHECK_FALSE(bloom.supports_sdpa);
  CHECK(bloom.default_attention == AttentionImpl::Eager);
  CHECK(bloom.peft_lora_targets == std::vector<std::string>{"query_key_value"});
  const ModelSpec gpt2 = parse_model_config(read_json(configs() / "openai-community--gpt2.json"));
  CHECK(gpt2.supports_sdpa);
  CHECK(gpt2.default_attention == AttentionImpl::Sdpa);
  CHECK(gpt2.peft_lora_targets == std::vector<std::string>{"c_attn"});
  // DeepSeek-V2-Lite's file says norm_topk_prob: false; an edited copy says true.
  json ds = read_json(configs() / "deepseek-ai--DeepSeek-V2-Lite.json");
  CHECK_FALSE(parse_model_config(ds).norm_topk_prob);
  ds["norm_topk_prob"] = true;
  CHECK(parse_model_config(ds).norm_topk_prob);
  CHECK(parse_model_config(ds).peft_lora_targets.empty());  // PEFT has no deepseek_v2 entry
  // remote code: InternLM2 runs what its config's attn_implementation names
  json il = {{"model_type", "internlm2"}, {"hidden_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
             {"num_key_value_heads", 2}, {"intermediate_size", 128}, {"vocab_size", 100}};
  CHECK(parse_model_config(il).default_attention == AttentionImpl::Eager);
  il["attn_implementation"] = "flash_attention_2";
  CHECK(parse_model_config(il).default_attention == AttentionImpl::FlashAttention2);
}

TEST_CASE("configs Transformers rejects at the first forward are errors with the reason", "[model][errors]") {
  const json llama = {{"model_type", "llama"}, {"hidden_size", 160}, {"num_hidden_layers", 2}, {"num_attention_heads", 10},
                      {"num_key_value_heads", 8}, {"intermediate_size", 256}, {"vocab_size", 100}};
  CHECK_THROWS_WITH(parse_model_config(llama), Catch::Matchers::Contains("10 attention heads do not split into 8"));
  json odd = llama;
  odd["num_key_value_heads"] = 5;
  odd["hidden_size"] = 100;  // 100 / 10 heads = 10: fine
  CHECK_NOTHROW(parse_model_config(odd));
  odd["num_attention_heads"] = 15;  // 100 / 15: not whole, no head_dim
  odd["num_key_value_heads"] = 5;
  CHECK_THROWS_WITH(parse_model_config(odd), Catch::Matchers::Contains("not divisible by 15"));
  odd["head_dim"] = 8;  // an explicit head_dim is what Gemma/Qwen3 configs do
  CHECK_NOTHROW(parse_model_config(odd));
  const json gpt2 = {{"model_type", "gpt2"}, {"n_embd", 100}, {"n_layer", 2}, {"n_head", 3}, {"vocab_size", 100}, {"n_positions", 32}};
  CHECK_THROWS_WITH(parse_model_config(gpt2), Catch::Matchers::Contains("not divisible by 3"));
}

// The decoder's layer order (ModelSpec::layer_runs): groups merge identical layers wherever they
// are, the runs keep their order (the tensor schedule walks a decoder whose layers differ by them)
TEST_CASE("layer runs keep the decoder's order where the groups merge identical layers") {
  nlohmann::json l4 = read_json(std::filesystem::path(MEMFIT_DATA_DIR) / "validation/tiny_configs/llama4_text-tiny.json");
  const ModelSpec m = parse_model_config(l4);
  // 4 layers: dense RoPE, MoE RoPE, dense RoPE, MoE NoPE (interleave_moe_layer_step 2, NoPE every 4th)
  REQUIRE(m.groups.size() == 3);
  REQUIRE(m.layer_runs.size() == 4);
  const std::vector<size_t> order{m.layer_runs[0].group, m.layer_runs[1].group, m.layer_runs[2].group, m.layer_runs[3].group};
  CHECK(order[0] == order[2]);
  CHECK(!m.groups[order[0]].moe);
  CHECK((m.groups[order[1]].moe && m.groups[order[1]].rope));
  CHECK((m.groups[order[3]].moe && !m.groups[order[3]].rope));
  nlohmann::json ds = read_json(std::filesystem::path(MEMFIT_DATA_DIR) / "validation/tiny_configs/deepseek_v3-tiny.json");
  ds["num_hidden_layers"] = 5;
  ds["first_k_dense_replace"] = 2;
  const ModelSpec d = parse_model_config(ds);
  REQUIRE(d.layer_runs.size() == 2);
  CHECK((d.layer_runs[0].count == 2 && !d.groups[d.layer_runs[0].group].moe));
  CHECK((d.layer_runs[1].count == 3 && d.groups[d.layer_runs[1].group].moe));
}
