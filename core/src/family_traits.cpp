// Per-family traits as data: one row per model_type (see family_traits.hpp).
//
// Attention kernels: the `_supports_sdpa` / `_supports_flash_attn` class flags of each
// modeling_<type>.py in Transformers 5.23 (a family without `_supports_sdpa = True` runs eager
// when no attn_implementation is given). Remote-code families (trust_remote_code) ignore
// attn_implementation: their own modeling file picks the kernel, noted per row.
// LoRA targets: PEFT 0.21 TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (peft/utils/
// constants.py); "" where PEFT has no entry (its LoraConfig then needs target_modules).
// norm_topk_prob: the configuration class's default where the config file leaves it out.
#include "family_traits.hpp"

#include <cstring>

namespace memfit {

namespace {

using AI = AttentionImpl;

// clang-format off
constexpr FamilyTraits kFamilies[] = {
    // model_type       sdpa   fa2    remote  remote runs  PEFT LoRA targets                norm_topk_prob
    {"llama",           true,  true,  false, AI::Sdpa,  "q_proj,v_proj",                   true},
    {"mistral",         true,  true,  false, AI::Sdpa,  "q_proj,v_proj",                   true},
    {"mixtral",         true,  true,  false, AI::Sdpa,  "q_proj,v_proj",                   true},   // always renormalises
    {"qwen2",           true,  true,  false, AI::Sdpa,  "q_proj,v_proj",                   true},
    {"qwen2_moe",       true,  true,  false, AI::Sdpa,  "",                                false},  // Qwen2MoeConfig default
    {"qwen3",           true,  true,  false, AI::Sdpa,  "q_proj,v_proj",                   true},
    {"qwen3_moe",       true,  true,  false, AI::Sdpa,  "",                                false},  // Qwen3MoeConfig default
    {"olmo",            true,  true,  false, AI::Sdpa,  "",                                true},
    {"olmo2",           true,  true,  false, AI::Sdpa,  "",                                true},
    {"gemma",           true,  true,  false, AI::Sdpa,  "q_proj,v_proj",                   true},
    {"gemma2",          false, true,  false, AI::Eager, "q_proj,v_proj",                   true},   // _supports_sdpa = False
    {"gemma3_text",     true,  true,  false, AI::Sdpa,  "q_proj,v_proj",                   true},
    {"phi3",            true,  true,  false, AI::Sdpa,  "",                                true},
    {"starcoder2",      true,  true,  false, AI::Sdpa,  "",                                true},
    {"stablelm",        true,  true,  false, AI::Sdpa,  "q_proj,v_proj",                   true},
    {"deepseek_v2",     true,  true,  false, AI::Sdpa,  "",                                false},  // DeepseekV2Config default
    {"deepseek_v3",     true,  true,  false, AI::Sdpa,  "",                                true},   // DeepseekV3Config default
    {"gpt2",            true,  true,  false, AI::Sdpa,  "c_attn",                          true},
    {"gpt_bigcode",     true,  true,  false, AI::Sdpa,  "c_attn",                          true},
    {"opt",             true,  true,  false, AI::Sdpa,  "q_proj,v_proj",                   true},
    {"bloom",           false, false, false, AI::Eager, "query_key_value",                 true},   // no kernel flags: eager only
    {"falcon",          true,  true,  false, AI::Sdpa,  "query_key_value",                 true},
    {"RefinedWeb",      true,  true,  false, AI::Sdpa,  "query_key_value",                 true},
    {"RefinedWebModel", true,  true,  false, AI::Sdpa,  "query_key_value",                 true},
    {"gpt_neox",        true,  true,  false, AI::Sdpa,  "query_key_value",                 true},
    {"gptj",            false, true,  false, AI::Eager, "q_proj,v_proj",                   true},   // FA2 but no SDPA
    {"codegen",         false, false, false, AI::Eager, "qkv_proj",                        true},   // no kernel flags: eager only
    {"gpt_neo",         false, true,  false, AI::Eager, "q_proj,v_proj",                   true},   // FA2 but no SDPA
    {"phi",             true,  true,  false, AI::Sdpa,  "q_proj,v_proj,fc1,fc2",           true},
    {"biogpt",          true,  true,  false, AI::Sdpa,  "",                                true},
    {"bert",            true,  true,  false, AI::Sdpa,  "query,value",                     true},
    // Remote code. InternLM2: INTERNLM2_ATTENTION_CLASSES {eager, flash_attention_2}, chosen by
    // config.attn_implementation (default "eager"). ChatGLM2/3: CoreAttention calls
    // torch's scaled_dot_product_attention on PyTorch >= 2. Qwen (v1): flash-attn when that
    // package is installed, else its own eager _attn. Baichuan 2 (7B): scaled_dot_product_attention.
    {"internlm2",       false, true,  true,  AI::Eager, "",                                true},
    {"chatglm",         true,  false, true,  AI::Sdpa,  "query_key_value",                 true},
    {"qwen",            false, true,  true,  AI::Eager, "",                                true},
    {"baichuan",        true,  false, true,  AI::Sdpa,  "",                                true},
    {"yi",              true,  true,  false, AI::Sdpa,  "",                                true},
    {"phi-msft",        false, true,  true,  AI::Eager, "",                                true},
};
// clang-format on

/// Unknown model types: estimated as a Llama-style decoder that Transformers would run with SDPA.
constexpr FamilyTraits kUnknown = {"", true, true, false, AI::Sdpa, "", true};

}  // namespace

const FamilyTraits& family_traits(const std::string& model_type) {
  for (const FamilyTraits& f : kFamilies)
    if (model_type == f.model_type) return f;
  return kUnknown;
}

bool has_family_traits(const std::string& model_type) { return &family_traits(model_type) != &kUnknown; }

std::vector<std::string> split_targets(const char* list) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* c = list; *c; ++c) {
    if (*c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += *c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

}  // namespace memfit
