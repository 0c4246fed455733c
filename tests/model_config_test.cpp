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
}

TEST_CASE("an unknown model_type with standard fields is estimated and flagged approximate", "[model]") {
  json cfg = {{"model_type", "brand_new_lm"}, {"hidden_size", 64},       {"num_hidden_layers", 2},
              {"num_attention_heads", 4},     {"intermediate_size", 128}, {"vocab_size", 1000}};
  const ModelSpec m = parse_model_config(cfg);
  CHECK(m.approximate);
  REQUIRE_FALSE(m.notes.empty());
  CHECK_THAT(m.notes.front(), Catch::Matchers::Contains("approximate"));
  CHECK_THAT(m.notes.front(), Catch::Matchers::Contains("family_traits.cpp"));  // says what to do
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
