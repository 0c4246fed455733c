// memfit: what each model family's implementation supports, as data (one row per model_type in
// family_traits.cpp). model_config.cpp copies a row into ModelSpec's typed fields.
#pragma once

#include <string>
#include <vector>

#include "memfit/model.hpp"

namespace memfit {

struct FamilyTraits {
  const char* model_type;
  bool sdpa;                  ///< Transformers has an SDPA path (`_supports_sdpa`)
  bool flash_attention_2;     ///< Transformers has a FlashAttention-2 path (`_supports_flash_attn`)
  bool remote_code;           ///< trust_remote_code model: its own file picks the kernel
  AttentionImpl runs_by_default;  ///< what runs when the user names no kernel
  const char* peft_lora_targets;  ///< PEFT's default target_modules, comma-separated ("" = none)
  bool norm_topk_prob;        ///< MoE: the config class's default when the file leaves it out
};

/// The row for a model_type; a default row (SDPA, no PEFT targets) for unknown types.
[[nodiscard]] const FamilyTraits& family_traits(const std::string& model_type);
[[nodiscard]] bool has_family_traits(const std::string& model_type);
[[nodiscard]] std::vector<std::string> split_targets(const char* list);

}  // namespace memfit
