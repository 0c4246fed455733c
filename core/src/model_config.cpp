// config.json -> ModelSpec, one builder per Transformers implementation family.
//
// Each builder lists the parameter tensors that the Transformers modeling file of that family
// creates (module names as in the modeling file, so LoRA targets match), with the defaults of
// the family's configuration class for keys a config.json may omit. Sources: the modeling_*.py
// and configuration_*.py files of huggingface/transformers (v4.40-v5.x) and, for remote-code
// checkpoints (RefinedWeb, phi-msft, ChatGLM, QWen v1), the modeling file shipped in the Hub repo.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "config_reader.hpp"
#include "family_traits.hpp"
#include "memfit/error.hpp"
#include "memfit/model.hpp"

namespace memfit {

using detail::ConfigReader;
using nlohmann::json;

namespace {

u64 norm_params(NormKind kind, u64 width) {
  switch (kind) {
    case NormKind::RMSNorm:
    case NormKind::LayerNormNoBias: return width;
    case NormKind::LayerNorm: return mul(2, width);
    case NormKind::NonParametric: return 0;
  }
  return 0;
}

Linear col(std::string name, u64 in, u64 out, bool bias, LinearInput input = LinearInput::AttnIn) {
  return {std::move(name), in, out, bias, 1, TpSplit::Column, false, input};
}
Linear row(std::string name, u64 in, u64 out, bool bias, LinearInput input = LinearInput::AttnOut) {
  return {std::move(name), in, out, bias, 1, TpSplit::Row, false, input};
}
Linear rep(std::string name, u64 in, u64 out, bool bias, LinearInput input = LinearInput::AttnIn) {
  return {std::move(name), in, out, bias, 1, TpSplit::Replicated, false, input};
}

/// Standard q/k/v/o projections with the given module names.
void add_attention(std::vector<Linear>& out, u64 h, u64 heads, u64 kv, u64 hd, bool qkv_bias, bool o_bias,
                   const char* q = "q_proj", const char* k = "k_proj", const char* v = "v_proj", const char* o = "o_proj") {
  out.push_back(col(q, h, mul(heads, hd), qkv_bias));
  out.push_back(col(k, h, mul(kv, hd), qkv_bias));
  out.push_back(col(v, h, mul(kv, hd), qkv_bias));
  out.push_back(row(o, mul(heads, hd), h, o_bias));
}

void add_gated_mlp(std::vector<Linear>& out, u64 h, u64 i, bool bias, const char* gate = "gate_proj",
                   const char* up = "up_proj", const char* down = "down_proj") {
  out.push_back(col(gate, h, i, bias, LinearInput::MlpIn));
  out.push_back(col(up, h, i, bias, LinearInput::MlpIn));
  out.push_back(row(down, i, h, bias, LinearInput::MlpHidden));
}

void add_plain_mlp(std::vector<Linear>& out, u64 h, u64 i, bool bias, const char* up, const char* down) {
  out.push_back(col(up, h, i, bias, LinearInput::MlpIn));
  out.push_back(row(down, i, h, bias, LinearInput::MlpHidden));
}

/// Adds one layer (kind described by `g`, with count 1) to the model's groups, merging it into an
/// existing group of identical structure so that 10^6 layers cost a handful of groups, and to the
/// layer order (runs of consecutive layers of one group).
void add_layer(ModelSpec& m, LayerGroup g) {
  auto in_order = [&](size_t group, u64 count) {
    if (!m.layer_runs.empty() && m.layer_runs.back().group == group) m.layer_runs.back().count += count;
    else m.layer_runs.push_back({group, count});
  };
  std::vector<LayerGroup>& groups = m.groups;
  for (LayerGroup& e : groups) {
    bool same = e.moe == g.moe && e.sliding_window == g.sliding_window && e.attention_chunk == g.attention_chunk &&
                e.rope == g.rope && e.other_params == g.other_params &&
                e.mlp_intermediate == g.mlp_intermediate && e.experts == g.experts &&
                e.experts_per_token == g.experts_per_token && e.shared_intermediate == g.shared_intermediate &&
                e.linears.size() == g.linears.size();
    for (size_t i = 0; same && i < e.linears.size(); ++i) {
      const Linear& a = e.linears[i];
      const Linear& b = g.linears[i];
      same = a.name == b.name && a.in == b.in && a.out == b.out && a.bias == b.bias && a.copies == b.copies &&
             a.stored_with_next == b.stored_with_next;
    }
    if (same) {
      e.count = add(e.count, g.count);
      in_order(static_cast<size_t>(&e - groups.data()), g.count);
      return;
    }
  }
  in_order(groups.size(), g.count);
  groups.push_back(std::move(g));
}

/// Which layers use sliding-window attention: the explicit `layer_types` list where the config
/// has one (Transformers >= 4.53 writes it), else the family's rule.
struct WindowRule {
  u64 window = 0;                ///< 0: no sliding window anywhere
  enum { All, EvenLayers, EveryNthFull, FromLayer, List } kind = All;
  u64 n = 0;                     ///< EveryNthFull: pattern length; FromLayer: first sliding layer
  std::vector<bool> list;        ///< List: sliding per layer
  [[nodiscard]] u64 at(u64 idx) const {
    if (window == 0) return 0;
    switch (kind) {
      case All: return window;
      case EvenLayers: return idx % 2 == 0 ? window : 0;
      case EveryNthFull: return (n != 0 && (idx + 1) % n == 0) ? 0 : window;
      case FromLayer: return idx >= n ? window : 0;
      case List: return idx < list.size() && list[idx] ? window : 0;
    }
    return 0;
  }
};

WindowRule read_layer_types(const ConfigReader& r, u64 window, WindowRule fallback) {
  auto it = r.json().find("layer_types");
  if (it == r.json().end() || !it->is_array()) {
    fallback.window = window;
    return fallback;
  }
  WindowRule rule;
  rule.window = window;
  rule.kind = WindowRule::List;
  for (const json& t : *it) rule.list.push_back(t.is_string() && t.get<std::string>() == "sliding_attention");
  return rule;
}

/// Which layers apply rotary embeddings, from a `no_rope_layers` list (1 = RoPE, 0 = NoPE), or
/// when it is absent or empty, a NoPE layer every `no_rope_layer_interval` layers (the rule of
/// SmolLM3Config and Llama4TextConfig: layer i uses RoPE iff (i + 1) % interval != 0).
std::vector<bool> read_rope_layers(const ConfigReader& r, u64 layers, u64 default_interval) {
  std::vector<bool> rope(layers, true);
  auto it = r.json().find("no_rope_layers");
  if (it != r.json().end() && it->is_array() && !it->empty()) {
    for (u64 i = 0; i < layers && i < it->size(); ++i) rope[i] = !((*it)[i].is_number() && (*it)[i].get<double>() == 0);
    return rope;
  }
  const u64 interval = r.size_or({"no_rope_layer_interval"}, default_interval);
  for (u64 i = 0; i < layers && interval > 0; ++i) rope[i] = (i + 1) % interval != 0;
  return rope;
}

bool tie_default(const std::string& type) {
  // PretrainedConfig defaults tie_word_embeddings to true; these configuration classes override
  // it to false (checked in each configuration_*.py).
  static const std::set<std::string> untied = {
      "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi", "phi3", "gptj",
      "codegen", "gpt_neox", "stablelm", "olmo", "olmo2", "deepseek_v2", "deepseek_v3", "internlm2",
      "chatglm", "qwen", "baichuan", "cohere", "granite", "phi-msft", "yi"};
  return untied.count(type) == 0;
}

struct Builder {
  ConfigReader r;
  ModelSpec m;

  Builder(const json& j, std::string where) : r(j, std::move(where)) {}

  bool tied() const { return r.flag_or({"tie_word_embeddings"}, tie_default(m.model_type)); }

  void finish_head(u64 in_width, bool head_bias) {
    m.tied_embeddings = tied();
    m.lm_head = rep("lm_head", in_width, m.vocab, head_bias);
  }
};

/// The sizes every multi-head-attention family has, under the family's key names: hidden width,
/// layers, heads (key/value heads = heads, head_dim = hidden / heads) and vocabulary.
u64 read_dims(Builder& b, std::initializer_list<const char*> hidden, std::initializer_list<const char*> layers,
              std::initializer_list<const char*> heads) {
  ModelSpec& m = b.m;
  const u64 h = m.hidden = b.r.size(hidden);
  m.layers = b.r.size(layers);
  m.heads = m.kv_heads = b.r.size(heads);
  m.head_dim = m.v_head_dim = h / m.heads;
  m.vocab = b.r.size({"vocab_size"});
  return h;
}

/// read_dims plus what the GQA families written against Transformers 5 configs share: KV heads,
/// an explicit head_dim, learned-position limit, attention dropout and an untied embedding.
u64 read_gqa_dims(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  const u64 h = read_dims(b, {"hidden_size"}, {"num_hidden_layers"}, {"num_attention_heads"});
  m.kv_heads = r.size_or({"num_key_value_heads"}, m.heads);
  m.head_dim = m.v_head_dim = r.size_or({"head_dim"}, h / m.heads);
  m.max_positions = r.size_or({"max_position_embeddings"}, 0);
  m.attention_dropout = r.real_or({"attention_dropout"}, 0.0);
  m.embedding_params = mul(m.vocab, h);
  return h;
}

/// A value a config class names under some keys, and the class's default when none is present
/// (no keys: always the default).
template <class T>
struct Named {
  std::initializer_list<const char*> keys;
  T fallback;
};

/// What the LayerNorm decoders with a plain MLP (fc, activation, fc) read alike, each under its
/// own config class's key names: the activation and the dropout probabilities.
struct PlainDecoderKeys {
  Named<const char*> activation;
  Named<double> attention_dropout, hidden_dropout, embedding_dropout{{}, 0.0};
};

/// Sets what those decoders share (LayerNorm, the plain MLP, activation, dropouts, the embedding
/// matrix) and returns their one layer group (every layer, MLP width `mlp_width`), for the builder
/// to add its Linears to. Call after read_dims.
LayerGroup plain_decoder(Builder& b, const PlainDecoderKeys& k, u64 mlp_width) {
  ModelSpec& m = b.m;
  m.norm = NormKind::LayerNorm;
  m.mlp = MlpKind::Plain;
  m.activation = b.r.text_or(k.activation.keys, k.activation.fallback);
  m.attention_dropout = b.r.real_or(k.attention_dropout.keys, k.attention_dropout.fallback);
  m.hidden_dropout = b.r.real_or(k.hidden_dropout.keys, k.hidden_dropout.fallback);
  m.embedding_dropout = b.r.real_or(k.embedding_dropout.keys, k.embedding_dropout.fallback);
  m.embedding_params = mul(m.vocab, m.hidden);
  LayerGroup g;
  g.count = m.layers;
  g.mlp_intermediate = mlp_width;
  return g;
}

// ---------------------------------------------------------------------------------------------
// Llama and its look-alikes: pre-norm decoder, RMSNorm, rotary positions, gated MLP.
// Covers llama, mistral, mixtral, qwen2(_moe), qwen3(_moe), yi, olmo(2), gemma(2/3), phi3,
// starcoder2, stablelm, internlm2, baichuan, deepseek_v2/v3 (MLA + MoE).

/// The Llama-like sizes: hidden width, layers, heads and key/value heads, head_dim, vocabulary,
/// position limit, activation, attention dropout and the embedding matrix.
void read_llama_dims(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = m.model_type;
  const u64 h = m.hidden = r.size({"hidden_size"});
  m.layers = r.size({"num_hidden_layers"});
  m.heads = r.size({"num_attention_heads"});
  m.kv_heads = r.size_or({"num_key_value_heads"}, m.heads);
  if (m.kv_heads == 0) m.kv_heads = m.heads;
  m.vocab = r.size({"vocab_size"});
  m.head_dim = r.size_or({"head_dim"}, 0);
  if (m.head_dim == 0) m.head_dim = h / m.heads;
  m.v_head_dim = m.head_dim;
  m.max_positions = r.size_or({"max_position_embeddings"}, 0);
  m.activation = r.text_or({"hidden_act", "hidden_activation"}, "silu");
  m.attention_dropout = r.real_or({"attention_dropout"}, 0.0);
  m.embedding_params = mul(m.vocab, h);
}

/// What a Llama-like layer has besides its Linears' sizes: biases, norms, sliding windows and
/// which layers apply rotary embeddings.
struct LlamaLayerKind {
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  u64 layer_norms = 2;      // input_layernorm + post_attention_layernorm
  u64 extra_per_layer = 0;  // q/k norms
  NormKind norm = NormKind::RMSNorm;
  WindowRule window;
  std::vector<bool> rope;  ///< per layer
};

/// Qwen2 / Qwen3 with use_sliding_window: sliding from layer max_window_layers on.
WindowRule qwen_window(const ConfigReader& r, u64 layers) {
  WindowRule w;
  w.kind = WindowRule::FromLayer;
  w.n = r.size_or({"max_window_layers"}, layers);
  return read_layer_types(r, r.size_or({"sliding_window"}, 0), w);
}

/// The families' departures from Llama's layer (biases, norms, windows, activation, softcapping).
void read_family_layer_kind(Builder& b, LlamaLayerKind& k) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  const std::string& t = m.model_type;
  const u64 hd = m.head_dim;
  if (t == "qwen2" || t == "qwen2_moe") {
    k.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o_proj without
    k.o_bias = false;
    if (r.flag_or({"use_sliding_window"}, false)) k.window = qwen_window(r, m.layers);
  } else if (t == "qwen3" || t == "qwen3_moe") {
    k.extra_per_layer = mul(2, hd);  // q_norm and k_norm, RMSNorm(head_dim) each
    if (r.flag_or({"use_sliding_window"}, false)) k.window = qwen_window(r, m.layers);
  } else if (t == "mistral" || t == "mixtral" || t == "phi3") {
    k.window = read_layer_types(r, r.size_or({"sliding_window"}, 0), WindowRule{});
  } else if (t == "gemma") {
    m.activation = r.text_or({"hidden_activation", "hidden_act"}, "gelu_pytorch_tanh");
  } else if (t == "gemma2") {
    k.layer_norms = 4;  // + pre_feedforward_layernorm, post_feedforward_layernorm
    m.activation = r.text_or({"hidden_activation", "hidden_act"}, "gelu_pytorch_tanh");
    WindowRule w;
    w.kind = WindowRule::EvenLayers;  // Gemma2: layer_idx % 2 == 0 is sliding
    k.window = read_layer_types(r, r.size_or({"sliding_window"}, 4096), w);
    m.final_logit_softcapping = r.real_or({"final_logit_softcapping"}, 0) > 0;
    m.attn_logit_softcapping = r.real_or({"attn_logit_softcapping"}, 0) > 0;
  } else if (t == "gemma3_text") {
    k.layer_norms = 4;
    k.extra_per_layer = mul(2, hd);  // q_norm, k_norm
    m.activation = r.text_or({"hidden_activation", "hidden_act"}, "gelu_pytorch_tanh");
    WindowRule w;
    w.kind = WindowRule::EveryNthFull;
    w.n = r.size_or({"sliding_window_pattern"}, 6);
    k.window = read_layer_types(r, r.size_or({"sliding_window"}, 4096), w);
    m.final_logit_softcapping = r.real_or({"final_logit_softcapping"}, 0) > 0;
  } else if (t == "olmo") {
    k.norm = NormKind::NonParametric;  // OlmoLayerNorm has no weight or bias
  } else if (t == "olmo2") {
    k.layer_norms = 2;  // post_attention_layernorm + post_feedforward_layernorm
    k.extra_per_layer = add(mul(m.heads, hd), mul(m.kv_heads, hd));  // q_norm/k_norm over all heads
  } else if (t == "stablelm") {
    k.norm = NormKind::LayerNorm;
    // StableLmAttention: rotary_ndims = int(head_dim * partial_rotary_factor) (default 0.25)
    m.rotary_dim = static_cast<u64>(static_cast<double>(hd) * r.real_or({"partial_rotary_factor"}, 0.25));
    k.qkv_bias = r.flag_or({"use_qkv_bias"}, false);
    k.o_bias = false;
    if (r.flag_or({"use_parallel_residual"}, false)) k.layer_norms = 1;
    if (r.flag_or({"qk_layernorm"}, false)) k.extra_per_layer = mul(add(m.heads, m.kv_heads), hd);  // per-head LN, no bias
  } else if (t == "starcoder2") {
    k.norm = NormKind::LayerNorm;
    k.qkv_bias = k.o_bias = r.flag_or({"use_bias"}, true);
  }
}

/// The layer's kind (call after read_llama_dims); sets the model's norm, MLP kind and activation.
LlamaLayerKind read_llama_layer_kind(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  const std::string& t = m.model_type;
  LlamaLayerKind k;
  k.qkv_bias = r.flag_or({"attention_bias"}, false);
  k.o_bias = k.qkv_bias;
  k.mlp_bias = r.flag_or({"mlp_bias"}, false);
  read_family_layer_kind(b, k);
  if (t == "starcoder2") k.window = read_layer_types(r, r.size_or({"sliding_window"}, 0), WindowRule{});
  // SmolLM3: every 4th layer is NoPE (SmolLM3Config no_rope_layers); no other family here has NoPE.
  k.rope = t == "smollm3" ? read_rope_layers(r, m.layers, 4) : std::vector<bool>(m.layers, true);
  m.norm = k.norm;
  m.mlp = t == "starcoder2" ? MlpKind::Plain : MlpKind::Gated;
  if (t == "starcoder2") m.activation = r.text_or({"hidden_act"}, "gelu_pytorch_tanh");
  return k;
}

/// A Llama-like layer's MLP: the dense width and, for the MoE families, the experts' layout.
struct LlamaMlp {
  u64 dense_i = 0;
  u64 experts = 0, topk = 0, moe_i = 0, shared_i = 0;
  bool shared_gate = false;    // Qwen2-MoE: sigmoid gate (Linear h->1) on the shared expert
  bool router_bias_param = false;  // DeepSeek-V3 e_score_correction_bias
  u64 first_dense = 0, moe_freq = 1, sparse_step = 1;
  std::set<u64> mlp_only;
};

LlamaMlp read_llama_mlp(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  const std::string& t = m.model_type;
  LlamaMlp mlp;
  mlp.dense_i = r.size({"intermediate_size"});

  // MoE layout: which layers are sparse, how many experts, how wide.
  if (t == "mixtral") {
    mlp.experts = r.size({"num_local_experts"});
    mlp.topk = r.size({"num_experts_per_tok"});
    mlp.moe_i = mlp.dense_i;
  } else if (t == "qwen2_moe" || t == "qwen3_moe") {
    // Transformers 5 writes Qwen3-MoE's num_experts as num_local_experts (the config class's
    // attribute_map), so config.json files saved by it carry the other name.
    mlp.experts = r.size_or({"num_experts", "num_local_experts"}, 0);
    mlp.topk = r.size_or({"num_experts_per_tok"}, 0);
    mlp.moe_i = r.size_or({"moe_intermediate_size"}, 0);
    mlp.sparse_step = r.size_or({"decoder_sparse_step"}, 1);
    if (t == "qwen2_moe") {
      mlp.shared_i = r.size_or({"shared_expert_intermediate_size"}, 0);
      mlp.shared_gate = mlp.shared_i > 0;
    }
    auto it = r.json().find("mlp_only_layers");
    if (it != r.json().end() && it->is_array())
      for (const json& v : *it)
        if (v.is_number_unsigned()) mlp.mlp_only.insert(v.get<u64>());
  } else if (t == "deepseek_v2" || t == "deepseek_v3") {
    mlp.experts = r.size_or({"n_routed_experts"}, 0);
    mlp.topk = r.size_or({"num_experts_per_tok"}, 0);
    mlp.moe_i = r.size_or({"moe_intermediate_size"}, 0);
    mlp.shared_i = mul(mlp.moe_i, r.size_or({"n_shared_experts"}, 0));
    mlp.first_dense = r.size_or({"first_k_dense_replace"}, 0);
    mlp.moe_freq = r.size_or({"moe_layer_freq"}, 1);
    mlp.router_bias_param = r.text_or({"topk_method"}, "") == "noaux_tc";
    m.router_groups = r.size_or({"n_group"}, 0);
    m.router_topk_groups = r.size_or({"topk_group"}, 0);
    if (r.size_or({"num_nextn_predict_layers"}, 0) > 0)
      m.notes.push_back("the multi-token-prediction layer(s) stored in the checkpoint are not counted: Transformers does not load them");
  }
  return mlp;
}

/// Whether layer idx of a family `t` model has the sparse (MoE) MLP.
bool is_moe_layer(const std::string& t, const LlamaMlp& mlp, u64 idx) {
  if (mlp.experts == 0) return false;
  if (t == "qwen2_moe" || t == "qwen3_moe")
    return mlp.mlp_only.count(idx) == 0 && mlp.sparse_step != 0 && (idx + 1) % mlp.sparse_step == 0;
  if (t == "deepseek_v2" || t == "deepseek_v3")
    return idx >= mlp.first_dense && mlp.moe_freq != 0 && idx % mlp.moe_freq == 0;
  return true;
}

/// DeepSeek's attention projections; sets the model's MLA sizes and adds the latent norms to
/// k.extra_per_layer.
std::vector<Linear> latent_attention(Builder& b, LlamaLayerKind& k) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  const u64 h = m.hidden;
  std::vector<Linear> attn;
  // Multi-head latent attention (DeepSeek-V2 paper, sec. 2.1): queries optionally through a
  // low-rank q_a/q_b pair, keys/values through a shared kv_lora_rank latent plus a decoupled
  // rope key, expanded per head by kv_b_proj.
  m.attention = AttentionKind::MultiLatent;
  m.q_lora_rank = r.size_or({"q_lora_rank"}, 0);
  m.kv_lora_rank = r.size({"kv_lora_rank"});
  m.qk_rope_head_dim = r.size({"qk_rope_head_dim"});
  m.qk_nope_head_dim = r.size({"qk_nope_head_dim"});
  m.v_head_dim = r.size({"v_head_dim"});
  m.head_dim = add(m.qk_rope_head_dim, m.qk_nope_head_dim);
  m.kv_heads = m.heads;
  const u64 qk = m.head_dim;
  if (m.q_lora_rank > 0) {
    attn.push_back(rep("q_a_proj", h, m.q_lora_rank, k.qkv_bias));
    k.extra_per_layer = add(k.extra_per_layer, m.q_lora_rank);  // q_a_layernorm
    attn.push_back(col("q_b_proj", m.q_lora_rank, mul(m.heads, qk), false, LinearInput::Latent));
  } else {
    attn.push_back(col("q_proj", h, mul(m.heads, qk), false));
  }
  attn.push_back(rep("kv_a_proj_with_mqa", h, add(m.kv_lora_rank, m.qk_rope_head_dim), k.qkv_bias));
  k.extra_per_layer = add(k.extra_per_layer, m.kv_lora_rank);  // kv_a_layernorm
  attn.push_back(col("kv_b_proj", m.kv_lora_rank, mul(m.heads, add(m.qk_nope_head_dim, m.v_head_dim)), false,
                     LinearInput::Latent));
  attn.push_back(row("o_proj", mul(m.heads, m.v_head_dim), h, k.qkv_bias));
  return attn;
}

/// A Llama-like layer's attention projections (fused q/k/v where the family fuses them).
std::vector<Linear> llama_attention(Builder& b, LlamaLayerKind& k) {
  ModelSpec& m = b.m;
  const std::string& t = m.model_type;
  const u64 h = m.hidden, hd = m.head_dim;
  // Attention projections.
  std::vector<Linear> attn;
  if (t == "deepseek_v2" || t == "deepseek_v3") {
    attn = latent_attention(b, k);
  } else if (t == "phi3") {
    attn.push_back(col("qkv_proj", h, mul(add(m.heads, mul(2, m.kv_heads)), hd), false));
    attn.push_back(row("o_proj", mul(m.heads, hd), h, false));
    m.fused_qkv = true;
  } else if (t == "internlm2") {
    bool bias = b.r.flag_or({"bias"}, false);
    attn.push_back(col("wqkv", h, mul(add(m.heads, mul(2, m.kv_heads)), hd), bias));
    attn.push_back(row("wo", mul(m.heads, hd), h, bias));
    m.fused_qkv = true;
  } else if (t == "baichuan") {
    attn.push_back(col("W_pack", h, mul(3, h), false));
    attn.push_back(row("o_proj", h, h, false));
    m.fused_qkv = true;
  } else {
    add_attention(attn, h, m.heads, m.kv_heads, hd, k.qkv_bias, k.o_bias);
  }
  return attn;
}

/// The sparse MLP of a family `t` layer: the router, the routed experts (fused [E, ...]
/// parameters) and the shared expert.
void add_moe_mlp(const std::string& t, u64 h, const LlamaMlp& mlp, LayerGroup& g) {
  g.moe = true;
  g.experts = mlp.experts;
  g.experts_per_token = mlp.topk;
  g.mlp_intermediate = mlp.moe_i;
  g.shared_intermediate = mlp.shared_i;
  g.linears.push_back(rep("gate", h, mlp.experts, false, LinearInput::MlpIn));  // router (all MoE families name it "gate")
  if (mlp.router_bias_param) g.other_params = add(g.other_params, mlp.experts);
  const char* n1 = t == "mixtral" ? "w1" : "gate_proj";
  const char* n3 = t == "mixtral" ? "w3" : "up_proj";
  const char* n2 = t == "mixtral" ? "w2" : "down_proj";
  // the experts are one module of fused parameters, gate and up stacked as gate_up_proj
  // [E, 2 I, h] and down_proj [E, h, I] (modeling_mixtral.py MixtralExperts, modeling_qwen2_moe.py
  // Qwen2MoeExperts): the optimizer sees two tensors, not 3 E
  for (const char* n : {n1, n3}) {
    Linear e = col(n, h, mlp.moe_i, false, LinearInput::MlpIn);
    e.copies = mlp.experts;
    e.routed = true;
    e.stored_with_next = n == n1;
    g.linears.push_back(e);
  }
  Linear down = row(n2, mlp.moe_i, h, false, LinearInput::MlpHidden);
  down.copies = mlp.experts;
  down.routed = true;
  g.linears.push_back(down);
  if (mlp.shared_i > 0) {
    add_gated_mlp(g.linears, h, mlp.shared_i, false);
    if (mlp.shared_gate) g.linears.push_back(rep("shared_expert_gate", h, 1, false, LinearInput::MlpIn));
  }
}

/// The dense MLP of a family `t` layer, `width` wide.
void add_dense_mlp(const std::string& t, u64 h, u64 width, const LlamaLayerKind& k, LayerGroup& g) {
  g.mlp_intermediate = width;
  if (t == "phi3") {
    g.linears.push_back(col("gate_up_proj", h, mul(2, width), false, LinearInput::MlpIn));
    g.linears.push_back(row("down_proj", width, h, false, LinearInput::MlpHidden));
  } else if (t == "internlm2") {
    add_gated_mlp(g.linears, h, width, false, "w1", "w3", "w2");
  } else if (t == "starcoder2") {
    add_plain_mlp(g.linears, h, width, k.qkv_bias, "c_fc", "c_proj");
  } else {
    add_gated_mlp(g.linears, h, width, k.mlp_bias);
  }
}

void build_llama_like(Builder& b) {
  ModelSpec& m = b.m;
  const std::string& t = m.model_type;
  read_llama_dims(b);
  const u64 h = m.hidden, L = m.layers;
  LlamaLayerKind k = read_llama_layer_kind(b);
  const LlamaMlp mlp = read_llama_mlp(b);
  const std::vector<Linear> attn = llama_attention(b, k);
  // norms of the layer plus q/k norms and (MLA) the latent norms
  const u64 attn_extra = add(mul(k.layer_norms, norm_params(k.norm, h)), k.extra_per_layer);

  for (u64 idx = 0; idx < L; ++idx) {
    LayerGroup g;
    g.count = 1;
    g.linears = attn;
    g.other_params = attn_extra;
    g.sliding_window = k.window.at(idx);
    g.rope = k.rope[idx];
    if (is_moe_layer(t, mlp, idx)) add_moe_mlp(t, h, mlp, g);
    else add_dense_mlp(t, h, mlp.dense_i, k, g);
    add_layer(m, std::move(g));
  }
  m.other_params = norm_params(k.norm, h);  // final norm
  b.finish_head(h, false);
}

// ---------------------------------------------------------------------------------------------
// GPT-2 and GPT-BigCode (SantaCoder/StarCoder): learned positions, LayerNorm, fused c_attn
// (Conv1D in GPT-2, Linear in BigCode), plain GELU MLP, tied head.
void build_gpt2(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = m.model_type;
  const u64 h = m.hidden = r.size({"n_embd", "hidden_size"});
  m.layers = r.size({"n_layer", "num_hidden_layers"});
  m.heads = r.size({"n_head", "num_attention_heads"});
  m.head_dim = m.v_head_dim = h / m.heads;
  const bool mqa = m.model_type == "gpt_bigcode" && r.flag_or({"multi_query"}, true);
  // GPTBigCodeModel registers bias = tril(ones(max_positions, max_positions, bool)) once.
  if (m.model_type == "gpt_bigcode") m.buffer_bytes = mul(r.size({"n_positions", "max_position_embeddings"}), r.size({"n_positions", "max_position_embeddings"}));
  m.kv_heads = mqa ? 1 : m.heads;
  m.vocab = r.size({"vocab_size"});
  m.max_positions = r.size({"n_positions", "max_position_embeddings"});
  const u64 inner = r.size_or({"n_inner"}, mul(4, h));
  LayerGroup g = plain_decoder(b, {{{"activation_function"}, "gelu_new"}, {{"attn_pdrop"}, 0.1},
                                   {{"resid_pdrop"}, 0.1}, {{"embd_pdrop"}, 0.1}}, inner);
  m.fused_qkv = true;
  m.learned_positions = true;
  m.position_params = mul(m.max_positions, h);
  g.linears.push_back(col("c_attn", h, add(h, mul(2, m.kv_heads, m.head_dim)), true));
  g.linears.push_back(row("c_proj", h, h, true));
  add_plain_mlp(g.linears, h, inner, true, "c_fc", "c_proj");
  g.linears.back().name = "mlp.c_proj";  // distinct from attn.c_proj for LoRA matching by suffix
  g.linears[1].name = "attn.c_proj";
  g.other_params = mul(2, norm_params(NormKind::LayerNorm, h));
  m.groups.push_back(std::move(g));
  m.other_params = norm_params(NormKind::LayerNorm, h);  // ln_f
  b.finish_head(h, false);
}

// OPT: learned positions with an offset of 2, optional project_in/out when
// word_embed_proj_dim != hidden_size (opt-350m), LayerNorm, ReLU MLP, tied head.
void build_opt(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = "opt";
  const u64 h = read_dims(b, {"hidden_size"}, {"num_hidden_layers"}, {"num_attention_heads"});
  m.max_positions = r.size({"max_position_embeddings"});
  const u64 ffn = r.size({"ffn_dim"});
  const u64 proj = r.size_or({"word_embed_proj_dim"}, h);
  const bool bias = r.flag_or({"enable_bias"}, true);
  const bool affine = r.flag_or({"layer_norm_elementwise_affine"}, true);
  LayerGroup g = plain_decoder(b, {{{"activation_function"}, "relu"}, {{"attention_dropout"}, 0.0},
                                   {{"dropout"}, 0.1}}, ffn);
  if (!affine) m.norm = NormKind::NonParametric;
  m.learned_positions = true;
  m.embedding_params = mul(m.vocab, proj);
  m.position_params = mul(add(m.max_positions, 2), h);  // OPTLearnedPositionalEmbedding offset 2
  add_attention(g.linears, h, m.heads, m.heads, m.head_dim, bias, bias, "q_proj", "k_proj", "v_proj", "out_proj");
  add_plain_mlp(g.linears, h, ffn, bias, "fc1", "fc2");
  g.other_params = mul(2, norm_params(m.norm, h));
  m.groups.push_back(std::move(g));
  const bool final_norm = r.flag_or({"do_layer_norm_before"}, true) && !r.flag_or({"_remove_final_layer_norm"}, false);
  m.other_params = final_norm ? norm_params(m.norm, h) : 0;
  if (proj != h) {
    m.extra_linears.push_back(rep("project_in", proj, h, false));
    m.extra_linears.push_back(rep("project_out", h, proj, false));
    for (const Linear& l : m.extra_linears) m.other_params = add(m.other_params, l.params());
  }
  b.finish_head(proj, false);
}

// BLOOM: ALiBi (no position parameters), LayerNorm after the embedding, fused query_key_value.
void build_bloom(Builder& b) {
  ModelSpec& m = b.m;
  m.family = "bloom";
  const u64 h = read_dims(b, {"hidden_size", "n_embed"}, {"n_layer", "num_hidden_layers"}, {"n_head", "num_attention_heads"});
  LayerGroup g = plain_decoder(b, {{{}, "bloom_gelu"}, {{"attention_dropout"}, 0.0}, {{"hidden_dropout"}, 0.0}},
                               mul(4, h));
  m.fused_qkv = true;
  m.alibi = true;
  g.linears.push_back(col("query_key_value", h, mul(3, h), true));
  g.linears.push_back(row("dense", h, h, true));
  add_plain_mlp(g.linears, h, mul(4, h), true, "dense_h_to_4h", "dense_4h_to_h");
  g.other_params = mul(2, norm_params(NormKind::LayerNorm, h));
  m.groups.push_back(std::move(g));
  m.other_params = mul(2, norm_params(NormKind::LayerNorm, h));  // word_embeddings_layernorm + ln_f
  b.finish_head(h, false);
}

// Falcon, in both Hub formats: the Transformers "falcon" type and the remote-code RefinedWeb
// (40B-style "new decoder architecture": grouped KV heads, ln_attn + ln_mlp) and
// RefinedWebModel (7B-style: multi-query, one input_layernorm, parallel attention).
void build_falcon(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = "falcon";
  const std::string& t = m.model_type;
  const u64 h = m.hidden = r.size({"hidden_size", "n_embed"});
  m.layers = r.size({"num_hidden_layers", "n_layer"});
  m.heads = r.size({"num_attention_heads", "n_head"});
  m.head_dim = m.v_head_dim = h / m.heads;
  m.vocab = r.size({"vocab_size"});
  const bool new_arch = r.flag_or({"new_decoder_architecture"}, t == "RefinedWeb");
  const bool multi_query = r.flag_or({"multi_query"}, true);
  if (new_arch) m.kv_heads = r.size({"num_kv_heads", "n_head_kv"});
  else m.kv_heads = multi_query ? 1 : m.heads;
  const bool parallel = r.flag_or({"parallel_attn"}, true);
  const bool bias = r.flag_or({"bias"}, false);
  if (r.flag_or({"alibi"}, false)) m.alibi = true;
  const u64 ffn = r.size_or({"ffn_hidden_size"}, mul(4, h));
  LayerGroup g = plain_decoder(b, {{{"activation"}, "gelu"}, {{"attention_dropout"}, 0.0}, {{"hidden_dropout"}, 0.0}},
                               ffn);
  // one LayerNorm feeds both branches (7B style), or ln_attn + ln_mlp over the same residual
  const u64 falcon_lns = new_arch ? r.size_or({"num_ln_in_parallel_attn"}, 2) : (parallel ? 1 : 2);
  m.parallel_block = parallel && falcon_lns == 1;
  m.parallel_two_norms = parallel && falcon_lns == 2;
  m.fused_qkv = true;
  const u64 qkv_out = new_arch ? mul(add(m.heads, mul(2, m.kv_heads)), m.head_dim)
                               : add(h, mul(2, m.kv_heads, m.head_dim));
  g.linears.push_back(col("query_key_value", h, qkv_out, bias));
  g.linears.push_back(row("dense", h, h, bias));
  add_plain_mlp(g.linears, h, ffn, bias, "dense_h_to_4h", "dense_4h_to_h");
  g.other_params = mul(falcon_lns, norm_params(NormKind::LayerNorm, h));
  m.groups.push_back(std::move(g));
  m.other_params = norm_params(NormKind::LayerNorm, h);
  b.finish_head(h, false);
}

// GPT-NeoX / Pythia (and StableLM-alpha): parallel residual by default, biases everywhere,
// untied embed_out.
void build_gpt_neox(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = "gpt_neox";
  const u64 h = read_dims(b, {"hidden_size"}, {"num_hidden_layers"}, {"num_attention_heads"});
  m.max_positions = r.size_or({"max_position_embeddings"}, 0);
  const u64 inter = r.size({"intermediate_size"});
  const bool bias = r.flag_or({"attention_bias"}, true);
  LayerGroup g = plain_decoder(b, {{{"hidden_act"}, "gelu"}, {{"attention_dropout"}, 0.0}, {{"hidden_dropout"}, 0.0}},
                               inter);
  m.parallel_two_norms = r.flag_or({"use_parallel_residual"}, true);
  m.fused_qkv = true;
  // GPTNeoXAttention: rotary_ndims = int(head_size * partial_rotary_factor), from rotary_pct
  // (GPTNeoXConfig default 0.25)
  m.rotary_dim = static_cast<u64>(static_cast<double>(m.head_dim) * r.real_or({"rotary_pct", "partial_rotary_factor"}, 0.25));
  g.linears.push_back(col("query_key_value", h, mul(3, h), bias));
  g.linears.push_back(row("dense", h, h, bias));
  add_plain_mlp(g.linears, h, inter, true, "dense_h_to_4h", "dense_4h_to_h");
  g.other_params = mul(2, norm_params(NormKind::LayerNorm, h));  // NeoX keeps both norms even in parallel mode
  m.groups.push_back(std::move(g));
  m.other_params = norm_params(NormKind::LayerNorm, h);
  m.tied_embeddings = b.tied();
  m.lm_head = rep("embed_out", h, m.vocab, false);
}

// GPT-J and CodeGen: parallel block with one ln_1, rotary, lm_head with bias; CodeGen fuses qkv
// and casts logits to fp32 inside the model.
void build_gptj(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = m.model_type;
  const u64 h = read_dims(b, {"n_embd", "hidden_size"}, {"n_layer", "num_hidden_layers"}, {"n_head", "num_attention_heads"});
  m.max_positions = r.size_or({"n_positions"}, 0);
  // every attention registers embed_positions: fp32 sin/cos [max_positions, rotary_dim or n_embd]
  m.buffer_bytes = mul(m.layers, m.max_positions, r.size_or({"rotary_dim"}, h), 4);
  m.rotary_dim = r.size_or({"rotary_dim"}, 0);  // GPTJAttention / CodeGenAttention: None = the whole head
  const u64 inner = r.size_or({"n_inner"}, mul(4, h));
  LayerGroup g = plain_decoder(b, {{{"activation_function"}, "gelu_new"}, {{"attn_pdrop"}, 0.0},
                                   {{"resid_pdrop"}, 0.0}, {{"embd_pdrop"}, 0.0}}, inner);
  m.parallel_block = true;
  if (m.model_type == "codegen") {
    m.fused_qkv = true;
    m.logits_fp32_in_model = true;
    g.linears.push_back(col("qkv_proj", h, mul(3, h), false));
    g.linears.push_back(row("out_proj", h, h, false));
  } else {
    add_attention(g.linears, h, m.heads, m.heads, m.head_dim, false, false, "q_proj", "k_proj", "v_proj", "out_proj");
  }
  add_plain_mlp(g.linears, h, inner, true, "fc_in", "fc_out");
  g.other_params = norm_params(NormKind::LayerNorm, h);
  m.groups.push_back(std::move(g));
  m.other_params = norm_params(NormKind::LayerNorm, h);
  b.finish_head(h, true);
}

// GPT-Neo: learned positions, alternating global/local (window 256) attention, q/k/v without
// bias, out_proj with bias, tied head, logits cast to fp32 in the model.
void build_gpt_neo(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = "gpt_neo";
  const u64 h = read_dims(b, {"hidden_size"}, {"num_layers", "num_hidden_layers"}, {"num_heads", "num_attention_heads"});
  m.max_positions = r.size({"max_position_embeddings"});
  // every GPTNeoSelfAttention registers bias = tril(ones(1, 1, max_positions, max_positions, bool))
  m.buffer_bytes = mul(m.layers, m.max_positions, m.max_positions);
  const u64 inner = r.size_or({"intermediate_size"}, mul(4, h));
  // every layer is its own group (local/global alternate): plain_decoder's group is the template
  const LayerGroup plain = plain_decoder(b, {{{"activation_function"}, "gelu_new"}, {{"attention_dropout"}, 0.0},
                                             {{"resid_dropout"}, 0.0}, {{"embed_dropout"}, 0.0}}, inner);
  m.learned_positions = true;
  m.logits_fp32_in_model = true;
  m.position_params = mul(m.max_positions, h);
  const u64 window = r.size_or({"window_size"}, 256);
  // attention_types: [[["global","local"], 12]] expands to the per-layer list.
  std::vector<bool> local;
  auto it = r.json().find("attention_types");
  if (it != r.json().end() && it->is_array())
    for (const json& item : *it)
      if (item.is_array() && item.size() == 2 && item[0].is_array() && item[1].is_number_unsigned())
        for (u64 rep_i = 0; rep_i < item[1].get<u64>() && local.size() < m.layers; ++rep_i)
          for (const json& kind : item[0]) local.push_back(kind.is_string() && kind.get<std::string>() == "local");
  for (u64 idx = 0; idx < m.layers; ++idx) {
    LayerGroup g = plain;
    g.count = 1;
    add_attention(g.linears, h, m.heads, m.heads, m.head_dim, false, true, "q_proj", "k_proj", "v_proj", "out_proj");
    g.linears[0].bias = g.linears[1].bias = g.linears[2].bias = false;
    add_plain_mlp(g.linears, h, inner, true, "c_fc", "c_proj");
    g.other_params = mul(2, norm_params(NormKind::LayerNorm, h));
    g.sliding_window = idx < local.size() && local[idx] ? window : 0;
    add_layer(m, std::move(g));
  }
  m.other_params = norm_params(NormKind::LayerNorm, h);
  b.finish_head(h, false);
}

// Phi-1/1.5/2: the Transformers "phi" layout and the remote-code "phi-msft" layout (same
// tensors, other names): parallel block, LayerNorm, biases everywhere, lm_head with bias.
void build_phi(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = "phi";
  const bool msft = m.model_type == "phi-msft";
  const u64 h = m.hidden = r.size({"hidden_size", "n_embd"});
  m.layers = r.size({"num_hidden_layers", "n_layer"});
  m.heads = r.size({"num_attention_heads", "n_head"});
  m.kv_heads = r.size_or({"num_key_value_heads", "n_head_kv"}, m.heads);
  if (m.kv_heads == 0) m.kv_heads = m.heads;
  m.head_dim = m.v_head_dim = h / m.heads;
  m.vocab = r.size({"vocab_size"});
  m.max_positions = r.size_or({"max_position_embeddings", "n_positions"}, 0);
  const u64 inner = msft ? r.size_or({"n_inner"}, mul(4, h)) : r.size({"intermediate_size"});
  LayerGroup g = plain_decoder(b, {{{"hidden_act", "activation_function"}, "gelu_new"},
                                   {{"attention_dropout", "attn_pdrop"}, 0.0}, {{"resid_pdrop"}, 0.0},
                                   {{"embd_pdrop"}, 0.0}}, inner);
  m.parallel_block = true;
  // PhiAttention: rotary_ndims = int(head_dim * partial_rotary_factor) (PhiConfig default 0.5)
  m.rotary_dim = static_cast<u64>(static_cast<double>(m.head_dim) * r.real_or({"partial_rotary_factor"}, 0.5));
  if (msft) {
    m.fused_qkv = true;
    g.linears.push_back(col("Wqkv", h, mul(add(m.heads, mul(2, m.kv_heads)), m.head_dim), true));
    g.linears.push_back(row("out_proj", h, h, true));
  } else {
    add_attention(g.linears, h, m.heads, m.kv_heads, m.head_dim, true, true, "q_proj", "k_proj", "v_proj", "dense");
  }
  add_plain_mlp(g.linears, h, inner, true, "fc1", "fc2");
  u64 other = norm_params(NormKind::LayerNorm, h);
  if (!msft && r.flag_or({"qk_layernorm"}, false)) other = add(other, mul(2, norm_params(NormKind::LayerNorm, m.head_dim)));
  g.other_params = other;
  m.groups.push_back(std::move(g));
  m.other_params = norm_params(NormKind::LayerNorm, h);  // final_layernorm (phi) or lm_head.ln (phi-msft)
  b.finish_head(h, true);
}

// BioGPT: BART-style decoder with learned positions (offset 2), LayerNorm, GELU, tied head.
void build_biogpt(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = "biogpt";
  const u64 h = read_dims(b, {"hidden_size"}, {"num_hidden_layers"}, {"num_attention_heads"});
  m.max_positions = r.size({"max_position_embeddings"});
  const u64 inter = r.size({"intermediate_size"});
  // the summed token and position embeddings go through the same dropout as the residual
  // stream (modeling_biogpt.py BioGptModel.forward: nn.functional.dropout(inputs_embeds + positions, p=self.dropout))
  LayerGroup g = plain_decoder(b, {{{"hidden_act"}, "gelu"}, {{"attention_probs_dropout_prob"}, 0.1},
                                   {{"hidden_dropout_prob"}, 0.1}, {{"hidden_dropout_prob"}, 0.1}}, inter);
  m.learned_positions = true;
  m.position_params = mul(add(m.max_positions, 2), h);
  add_attention(g.linears, h, m.heads, m.heads, m.head_dim, true, true, "q_proj", "k_proj", "v_proj", "out_proj");
  add_plain_mlp(g.linears, h, inter, true, "fc1", "fc2");
  g.other_params = mul(2, norm_params(NormKind::LayerNorm, h));
  m.groups.push_back(std::move(g));
  m.other_params = norm_params(NormKind::LayerNorm, h);
  b.finish_head(h, false);
}

// ChatGLM2/3 (remote code): fused query_key_value with multi-query groups, SwiGLU through one
// dense_h_to_4h of width 2*ffn, RMSNorm, untied output_layer.
void build_chatglm(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = "chatglm";
  const u64 h = m.hidden = r.size({"hidden_size"});
  m.layers = r.size({"num_layers", "num_hidden_layers"});
  m.heads = r.size({"num_attention_heads"});
  m.head_dim = m.v_head_dim = r.size_or({"kv_channels"}, h / m.heads);
  m.kv_heads = r.flag_or({"multi_query_attention"}, false) ? r.size({"multi_query_group_num"}) : m.heads;
  m.vocab = r.size({"padded_vocab_size", "vocab_size"});
  m.max_positions = r.size_or({"seq_length"}, 0);
  const u64 ffn = r.size({"ffn_hidden_size"});
  const bool bias = r.flag_or({"add_bias_linear"}, false);
  const bool qkv_bias = r.flag_or({"add_qkv_bias"}, false);
  m.norm = r.flag_or({"rmsnorm"}, true) ? NormKind::RMSNorm : NormKind::LayerNorm;
  m.fused_qkv = true;
  m.attention_dropout = r.real_or({"attention_dropout"}, 0.0);
  m.hidden_dropout = r.real_or({"hidden_dropout"}, 0.0);
  m.embedding_params = mul(m.vocab, h);
  LayerGroup g;
  g.count = m.layers;
  g.mlp_intermediate = ffn;
  const u64 q = mul(m.heads, m.head_dim);
  g.linears.push_back(col("query_key_value", h, add(q, mul(2, m.kv_heads, m.head_dim)), qkv_bias));
  g.linears.push_back(row("dense", q, h, bias));
  g.linears.push_back(col("dense_h_to_4h", h, mul(2, ffn), bias, LinearInput::MlpIn));
  g.linears.push_back(row("dense_4h_to_h", ffn, h, bias, LinearInput::MlpHidden));
  g.other_params = mul(2, norm_params(m.norm, h));
  m.groups.push_back(std::move(g));
  m.other_params = r.flag_or({"post_layer_norm"}, true) ? norm_params(m.norm, h) : 0;
  m.tied_embeddings = false;
  m.lm_head = rep("output_layer", h, m.vocab, false);
}

// QWen v1 (remote code "qwen"): fused c_attn with bias, c_proj without, SwiGLU through w1/w2
// of width intermediate_size/2 each, RMSNorm, untied lm_head. The first Hub revision used
// Megatron-style key names (n_embd, n_layer, ffn_hidden_size, padded_vocab_size).
void build_qwen_v1(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = "qwen";
  const u64 h = m.hidden = r.size({"hidden_size", "n_embd"});
  m.layers = r.size({"num_hidden_layers", "n_layer"});
  m.heads = m.kv_heads = r.size({"num_attention_heads", "n_head"});
  m.head_dim = m.v_head_dim = r.size_or({"kv_channels"}, h / m.heads);
  m.vocab = r.size({"vocab_size", "padded_vocab_size"});
  m.max_positions = r.size_or({"seq_length"}, 0);
  const u64 ff = r.size({"intermediate_size", "ffn_hidden_size"}) / 2;
  m.fused_qkv = true;
  m.embedding_params = mul(m.vocab, h);
  LayerGroup g;
  g.count = m.layers;
  g.mlp_intermediate = ff;
  g.linears.push_back(col("c_attn", h, mul(3, h), true));
  g.linears.push_back(row("attn.c_proj", h, h, false));
  add_gated_mlp(g.linears, h, ff, false, "w2", "w1", "mlp.c_proj");
  g.other_params = mul(2, h);
  m.groups.push_back(std::move(g));
  m.other_params = h;
  m.tied_embeddings = false;
  m.lm_head = rep("lm_head", h, m.vocab, false);
}

// BERT encoder (encoder-only, bidirectional). The head follows the architecture named in the
// config: BertForMaskedLM (transform + tied decoder with bias) or a pooler + 2-label classifier
// for sequence classification (what the HF Trainer benchmarks in the calibration data use).
void build_bert(Builder& b, const std::string& head) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = "bert";
  m.causal = false;
  const u64 h = read_dims(b, {"hidden_size"}, {"num_hidden_layers"}, {"num_attention_heads"});
  m.max_positions = r.size({"max_position_embeddings"});
  const u64 inter = r.size({"intermediate_size"});
  m.norm = NormKind::LayerNorm;
  m.mlp = MlpKind::Plain;
  m.activation = r.text_or({"hidden_act"}, "gelu");
  m.learned_positions = true;
  m.attention_dropout = r.real_or({"attention_probs_dropout_prob"}, 0.1);
  m.hidden_dropout = r.real_or({"hidden_dropout_prob"}, 0.1);
  m.embedding_dropout = m.hidden_dropout;
  m.embedding_params = mul(m.vocab, h);
  m.position_params = mul(add(m.max_positions, r.size_or({"type_vocab_size"}, 2)), h);
  // BertEmbeddings registers position_ids and token_type_ids, int64 [1, max_positions] each
  m.buffer_bytes = mul(2, m.max_positions, 8);
  LayerGroup g;
  g.count = m.layers;
  g.mlp_intermediate = inter;
  add_attention(g.linears, h, m.heads, m.heads, m.head_dim, true, true, "query", "key", "value", "attention.output.dense");
  add_plain_mlp(g.linears, h, inter, true, "intermediate.dense", "output.dense");
  g.other_params = mul(2, norm_params(NormKind::LayerNorm, h));
  m.groups.push_back(std::move(g));
  m.other_params = norm_params(NormKind::LayerNorm, h);  // embeddings.LayerNorm
  if (head == "classification") {
    // BertPooler dense (h x h + h) and the classifier (h x num_labels + num_labels).
    const u64 labels = 2;
    m.other_params = add(m.other_params, add(mul(h, h), h));
    m.outer_linears.push_back(rep("bert.pooler.dense", h, h, true));
    m.tied_embeddings = false;
    m.lm_head = rep("classifier", h, labels, true);
    m.notes.push_back("sequence-classification head with 2 labels (pooler + classifier); logits are [batch, 2]");
  } else {
    // cls.predictions.transform (dense h x h + h, LayerNorm) and a decoder tied to the
    // word embeddings with its own bias of `vocab` elements.
    m.other_params = add(m.other_params, add(add(mul(h, h), h), norm_params(NormKind::LayerNorm, h)));
    m.outer_linears.push_back(rep("cls.predictions.transform.dense", h, h, true));
    m.tied_embeddings = true;
    m.lm_head = rep("decoder", h, m.vocab, true);
  }
}

/// The llama-style fields an unknown decoder-only model must have to be estimated at all.
/// Architectures whose memory does not follow a transformer's layers: rejected by name, with what
/// they are, rather than estimated as something they are not (model_type as Transformers spells it).
const char* unsupported_architecture(const std::string& type) {
  static const std::pair<const char*, const char*> kinds[] = {
      {"t5", "an encoder-decoder model"},          {"mt5", "an encoder-decoder model"},
      {"umt5", "an encoder-decoder model"},        {"bart", "an encoder-decoder model"},
      {"mbart", "an encoder-decoder model"},       {"whisper", "an encoder-decoder model"},
      {"mamba", "a state-space model (no attention layers)"},
      {"mamba2", "a state-space model (no attention layers)"},
      {"falcon_mamba", "a state-space model (no attention layers)"},
      {"rwkv", "a recurrent model (RWKV: no attention layers)"},
      {"recurrent_gemma", "a recurrent model (Griffin: recurrent blocks beside local attention)"},
      {"jamba", "a hybrid of attention and state-space (Mamba) layers"},
      {"bamba", "a hybrid of attention and state-space (Mamba) layers"},
      {"zamba", "a hybrid of attention and state-space (Mamba) layers"},
      {"zamba2", "a hybrid of attention and state-space (Mamba) layers"},
      {"falcon_h1", "a hybrid of attention and state-space (Mamba) layers"},
      {"nemotron_h", "a hybrid of attention and state-space (Mamba) layers"},
  };
  for (const auto& [name, kind] : kinds)
    if (type == name) return kind;
  return nullptr;
}

void build_unknown(Builder& b) {
  // Without attention heads the Llama-style reading below would ask for a field the model does
  // not have; say what is wrong instead (a state-space or recurrent model under a new name).
  if (!b.r.has({"num_attention_heads", "n_head", "num_heads", "n_heads"}))
    throw Error("model_type \"" + b.m.model_type +
                "\" is not one memfit knows, and its config.json has no attention heads: it is not a transformer "
                "memfit can estimate as Llama-like. Supported model_types: `memfit models`");
  b.m.approximate = true;
  b.m.warnings.push_back("model_type \"" + b.m.model_type +
                      "\" is not one memfit models exactly: estimated as a Llama-style decoder from its standard "
                      "fields; parameter count and activations are approximate. For an exact figure pass the "
                      "config of a supported model_type (`memfit models`), or add the family to "
                      "core/src/family_traits.cpp and a builder in core/src/model_config.cpp");
  const std::string type = b.m.model_type;
  b.m.model_type = "llama";
  build_llama_like(b);
  b.m.model_type = type;
  b.m.family = "llama (approximate)";
}

// gpt-oss (Transformers modeling_gpt_oss.py): GQA attention with biases on q/k/v/o and one learned
// attention-sink logit per head ("sinks"); every layer MoE with a biased router and experts held
// as fused tensors (gate_up_proj [E, h, 2I] + bias, down_proj [E, I, h] + bias); alternating
// sliding-window / full layers from `layer_types`; untied head.
void build_gpt_oss(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = "gpt_oss";
  m.attention_sinks = true;
  const u64 h = read_gqa_dims(b);
  const u64 experts = r.size({"num_local_experts"});
  const u64 topk = r.size({"num_experts_per_tok", "experts_per_token"});
  const u64 inter = r.size({"intermediate_size"});
  const bool bias = r.flag_or({"attention_bias"}, true);
  WindowRule alternate;  // GptOssConfig default: even layers sliding
  alternate.kind = WindowRule::EvenLayers;
  const WindowRule window = read_layer_types(r, r.size_or({"sliding_window"}, 128), alternate);
  const bool mxfp4 = r.json().contains("quantization_config") && r.json()["quantization_config"].is_object() &&
                     r.json()["quantization_config"].value("quant_method", "") == "mxfp4";
  if (mxfp4) {
    // OCP MX FP4 (E2M1) codes, 32 per block sharing one E8M0 scale byte: 4 + 8/32 bits per
    // weight. modules_to_not_convert keeps attention, router, embeddings and head in bf16.
    m.checkpoint_quant = {"mxfp4", 32, 4 * 1024 + 8 * 1024 / 32};
    m.notes.push_back("the checkpoint stores the expert weights in MXFP4 (4.25 bits per weight); Transformers "
                      "dequantizes them to bf16 when it cannot run the MXFP4 kernels (and for training), so the "
                      "estimate uses the requested precision for every weight");
  }
  for (u64 idx = 0; idx < m.layers; ++idx) {
    LayerGroup g;
    g.count = 1;
    g.moe = true;
    g.experts = experts;
    g.experts_per_token = topk;
    g.mlp_intermediate = inter;
    g.clamped_glu_experts = true;  // GptOssExperts._apply_gate
    g.sliding_window = window.at(idx);
    add_attention(g.linears, h, m.heads, m.kv_heads, m.head_dim, bias, bias);
    Linear router = rep("router", h, experts, true, LinearInput::MlpIn);
    router.peft_module = false;  // GptOssTopKRouter: its own weight and bias, not an nn.Linear
    g.linears.push_back(router);
    Linear gate_up = col("experts.gate_up_proj", h, mul(2, inter), true, LinearInput::MlpIn);
    Linear down = row("experts.down_proj", inter, h, true, LinearInput::MlpHidden);
    for (Linear* e : {&gate_up, &down}) {
      e->copies = experts;
      e->routed = true;
      e->checkpoint_quantized = mxfp4;
      g.linears.push_back(*e);
    }
    g.other_params = add(mul(2, h), m.heads);  // two RMSNorms + the per-head sinks
    add_layer(m, std::move(g));
  }
  m.other_params = h;
  m.tied_embeddings = r.flag_or({"tie_word_embeddings"}, false);
  m.lm_head = rep("lm_head", h, m.vocab, false);
}

// Llama 4 text model (modeling_llama4.py): MoE layers (listed in `moe_layers`, else every
// `interleave_moe_layer_step`-th) hold a bias-free router, fused experts (gate_up_proj
// [E, h, 2I], down_proj [E, I, h]) and an always-on shared expert of width I; dense layers use
// intermediate_size_mlp. RoPE layers attend in chunks of attention_chunk_size; NoPE layers
// (no_rope_layers, default every 4th) attend fully. The qk L2 norm has no weight. Untied head.
void build_llama4_text(Builder& b) {
  ModelSpec& m = b.m;
  const ConfigReader& r = b.r;
  m.family = "llama4_text";
  const u64 h = read_gqa_dims(b);
  const u64 L = m.layers;
  const u64 experts = r.size({"num_local_experts"});
  const u64 topk = r.size_or({"num_experts_per_tok"}, 1);
  const u64 inter = r.size({"intermediate_size"});
  const u64 dense_i = r.size_or({"intermediate_size_mlp"}, inter);
  const u64 chunk = r.size_or({"attention_chunk_size"}, 8192);
  const bool bias = r.flag_or({"attention_bias"}, false);
  const std::vector<bool> rope = read_rope_layers(r, L, 4);
  std::set<u64> moe_layers;
  auto listed = r.json().find("moe_layers");
  if (listed != r.json().end() && listed->is_array()) {
    for (const json& v : *listed)
      if (v.is_number_unsigned()) moe_layers.insert(v.get<u64>());
  } else {
    const u64 step = r.size_or({"interleave_moe_layer_step"}, 1);
    for (u64 i = step - 1; step > 0 && i < L; i += step) moe_layers.insert(i);
  }
  for (u64 idx = 0; idx < L; ++idx) {
    LayerGroup g;
    g.count = 1;
    g.rope = rope[idx];
    g.attention_chunk = g.rope ? chunk : 0;
    // Llama4TextAttention has qk_norm (Llama4TextL2Norm) when config.use_qk_norm and the layer uses RoPE
    g.qk_l2_norm = g.rope && r.flag_or({"use_qk_norm"}, true);
    add_attention(g.linears, h, m.heads, m.kv_heads, m.head_dim, bias, bias);
    g.other_params = mul(2, h);
    if (moe_layers.count(idx) != 0) {
      g.moe = true;
      g.experts = experts;
      g.experts_per_token = topk;
      g.mlp_intermediate = inter;
      g.shared_intermediate = inter;
      // Llama4TextMoe.forward: routed_in = hidden_states.repeat(E, 1) * scores (zero off the
      // top-k), then Llama4TextExperts bmm's every expert over every token
      g.experts_on_every_token = true;
      g.linears.push_back(rep("router", h, experts, false, LinearInput::MlpIn));  // Llama4Router is an nn.Linear
      Linear gate_up = col("experts.gate_up_proj", h, mul(2, inter), false, LinearInput::MlpIn);
      Linear down = row("experts.down_proj", inter, h, false, LinearInput::MlpHidden);
      for (Linear* e : {&gate_up, &down}) {
        e->copies = experts;
        e->routed = true;
        g.linears.push_back(*e);
      }
      add_gated_mlp(g.linears, h, inter, false);  // shared_expert
    } else {
      g.mlp_intermediate = dense_i;
      add_gated_mlp(g.linears, h, dense_i, false);
    }
    add_layer(m, std::move(g));
  }
  m.other_params = h;
  m.tied_embeddings = r.flag_or({"tie_word_embeddings"}, false);
  m.lm_head = rep("lm_head", h, m.vocab, false);
}

// ---------------------------------------------------------------------------------------------
// Vision towers of multimodal wrappers, counted from their vision_config (plus the projector
// into the language model), so that the weights of the whole checkpoint are in the estimate.

/// SigLIP vision encoder (modeling_siglip.py), as Gemma 3 uses it: conv patch embedding with
/// bias, learned positions, pre-norm encoder layers (LayerNorm, biased q/k/v/out, fc1/fc2),
/// post_layernorm, and the attention-pooling head only if vision_use_head. Defaults are
/// SiglipVisionConfig's.
u64 siglip_params(const ConfigReader& v) {
  const u64 h = v.size_or({"hidden_size"}, 768);
  const u64 inter = v.size_or({"intermediate_size"}, 3072);
  const u64 layers = v.size_or({"num_hidden_layers"}, 12);
  const u64 channels = v.size_or({"num_channels"}, 3);
  const u64 image = v.size_or({"image_size"}, 224);
  const u64 patch = v.size_or({"patch_size"}, 16);
  if (patch == 0) throw Error("vision_config: patch_size must be positive");
  const u64 patches = mul(image / patch, image / patch);  // the stride-`patch` conv drops a remainder
  const u64 linear_hh = add(mul(h, h), h);
  const u64 mlp = add(add(mul(h, inter), inter), add(mul(inter, h), h));
  const u64 layer = add(add(mul(4, linear_hh), mlp), mul(4, h));  // + layer_norm1/2 (w + b)
  u64 p = add(add(mul(channels, patch, patch, h), h), mul(patches, h));
  p = add(add(p, mul(layers, layer)), mul(2, h));  // encoder + post_layernorm
  if (v.flag_or({"vision_use_head"}, true))  // probe, MultiheadAttention (in 3h x h, out h x h), LayerNorm, MLP
    p = add(p, add(add(h, add(mul(3, linear_hh), linear_hh)), add(mul(2, h), mlp)));
  return p;
}

/// Llama 4 vision model (modeling_llama4.py): unfolded-patch Linear without bias, class token,
/// positions for patches + 1, LayerNorm pre/post, encoder layers with biased attention and MLP,
/// the pixel-shuffle adapter MLP (fc1 intermediate -> projector_input_dim, fc2 projector_output_dim
/// square, no biases) and multi_modal_projector.linear_1 (vision_output_dim -> text hidden).
u64 llama4_vision_params(const ConfigReader& v, u64 text_hidden) {
  const u64 h = v.size({"hidden_size"});
  const u64 inter = v.size({"intermediate_size"});
  const u64 layers = v.size({"num_hidden_layers"});
  const u64 channels = v.size_or({"num_channels"}, 3);
  const u64 image = v.size({"image_size"});
  const u64 patch = v.size({"patch_size"});
  if (patch == 0) throw Error("vision_config: patch_size must be positive");
  const u64 patches = mul(image / patch, image / patch);  // (image_size // patch_size) ** 2
  const u64 attn = mul(4, add(mul(h, h), h));
  const u64 mlp = add(add(mul(h, inter), inter), add(mul(inter, h), h));
  const u64 layer = add(add(attn, mlp), mul(4, h));
  u64 p = add(add(mul(channels, patch, patch, h), h), mul(add(patches, 1), h));
  p = add(add(p, mul(4, h)), mul(layers, layer));
  const u64 proj_in = v.size({"projector_input_dim"});
  const u64 proj_out = v.size({"projector_output_dim"});
  p = add(p, add(mul(inter, proj_in), mul(proj_out, proj_out)));
  return add(p, mul(v.size({"vision_output_dim"}), text_hidden));
}

/// The vision tower + projector of a wrapper model_type, or 0 with `counted` false when memfit
/// does not know the wrapper's vision tower.
u64 vision_tower_params(const std::string& wrapper, const json& vision, u64 text_hidden, bool& counted) {
  const ConfigReader v(vision, "config.json (vision_config)");
  counted = true;
  if (wrapper == "gemma3") {
    // Gemma3MultiModalProjector: mm_input_projection_weight [vision h, text h] + mm_soft_emb_norm.
    const u64 vh = v.size_or({"hidden_size"}, 768);
    return add(siglip_params(v), add(mul(vh, text_hidden), vh));
  }
  if (wrapper == "llama4") return llama4_vision_params(v, text_hidden);
  counted = false;
  return 0;
}

/// Configuration-class defaults for keys that published files of a family omit (Transformers
/// fills them the same way when it loads the file). Gemma3TextConfig: the google/gemma-3-4b-it
/// file gives only hidden/intermediate/layers and relies on these.
const std::map<std::string, json>& class_defaults() {
  static const std::map<std::string, json> table = {
      {"gemma3_text",
       {{"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"head_dim", 256}, {"vocab_size", 262208}}},
  };
  return table;
}

using BuildFn = void (*)(Builder&);

const std::map<std::string, BuildFn>& builders() {
  static const std::map<std::string, BuildFn> table = {
      {"llama", build_llama_like},       {"mistral", build_llama_like},     {"mixtral", build_llama_like},
      {"qwen2", build_llama_like},       {"qwen2_moe", build_llama_like},   {"qwen3", build_llama_like},
      {"qwen3_moe", build_llama_like},   {"yi", build_llama_like},          {"olmo", build_llama_like},
      {"olmo2", build_llama_like},       {"gemma", build_llama_like},       {"gemma2", build_llama_like},
      {"gemma3_text", build_llama_like}, {"phi3", build_llama_like},        {"starcoder2", build_llama_like},
      {"stablelm", build_llama_like},    {"internlm2", build_llama_like},   {"baichuan", build_llama_like},
      {"deepseek_v2", build_llama_like}, {"deepseek_v3", build_llama_like}, {"gpt2", build_gpt2},
      {"gpt_bigcode", build_gpt2},       {"opt", build_opt},                {"bloom", build_bloom},
      {"falcon", build_falcon},          {"RefinedWeb", build_falcon},      {"RefinedWebModel", build_falcon},
      {"gpt_neox", build_gpt_neox},      {"gptj", build_gptj},              {"codegen", build_gptj},
      {"gpt_neo", build_gpt_neo},        {"phi", build_phi},                {"phi-msft", build_phi},
      {"biogpt", build_biogpt},          {"chatglm", build_chatglm},        {"qwen", build_qwen_v1},
      {"smollm3", build_llama_like},     {"gpt_oss", build_gpt_oss},        {"llama4_text", build_llama4_text},
  };
  return table;
}

/// model_type from the config, or inferred from `architectures` for files that lack it
/// (several published subsets keep only the architecture name).
std::string infer_model_type(const json& j) {
  auto mt = j.find("model_type");
  if (mt != j.end() && mt->is_string()) return mt->get<std::string>();
  auto ar = j.find("architectures");
  if (ar != j.end() && ar->is_array() && !ar->empty() && (*ar)[0].is_string()) {
    static const std::map<std::string, std::string> by_arch = {
        {"LlamaForCausalLM", "llama"},          {"MistralForCausalLM", "mistral"},
        {"MixtralForCausalLM", "mixtral"},      {"Qwen2ForCausalLM", "qwen2"},
        {"GPT2LMHeadModel", "gpt2"},            {"GPTNeoXForCausalLM", "gpt_neox"},
        {"GPTJForCausalLM", "gptj"},            {"OPTForCausalLM", "opt"},
        {"BloomForCausalLM", "bloom"},          {"FalconForCausalLM", "falcon"},
        {"RWForCausalLM", "RefinedWebModel"},   {"GPTBigCodeForCausalLM", "gpt_bigcode"},
        {"GemmaForCausalLM", "gemma"},          {"Gemma2ForCausalLM", "gemma2"},
        {"PhiForCausalLM", "phi"},              {"Phi3ForCausalLM", "phi3"},
        {"QWenLMHeadModel", "qwen"},            {"BaichuanForCausalLM", "baichuan"},
        {"BertForMaskedLM", "bert"},            {"BertForSequenceClassification", "bert"},
        {"BertModel", "bert"},                  {"T5ForConditionalGeneration", "t5"},
        {"MT5ForConditionalGeneration", "mt5"}, {"CodeGenForCausalLM", "codegen"},
        {"GPTNeoForCausalLM", "gpt_neo"},       {"BioGptForCausalLM", "biogpt"},
        {"StableLmForCausalLM", "stablelm"},    {"Starcoder2ForCausalLM", "starcoder2"},
        {"ChatGLMModel", "chatglm"},            {"ChatGLMForConditionalGeneration", "chatglm"},
        {"Olmo2ForCausalLM", "olmo2"},          {"SmolLM3ForCausalLM", "smollm3"},
        {"GptOssForCausalLM", "gpt_oss"},       {"Gemma3ForCausalLM", "gemma3_text"},
        {"Llama4ForCausalLM", "llama4_text"},
    };
    auto it = by_arch.find((*ar)[0].get<std::string>());
    if (it != by_arch.end()) return it->second;
  }
  return "";
}

/// Counts the vision tower of a multimodal wrapper into the model (other_params, vision_params)
/// and says so in a note, or says that it is left out.
void add_vision_tower(ModelSpec& m, const std::string& wrapper, const json& config) {
  auto vc = config.find("vision_config");
  bool counted = false;
  const u64 vision = vc != config.end() && vc->is_object() ? vision_tower_params(wrapper, *vc, m.hidden, counted) : 0;
  if (counted) {
    m.vision_params = vision;
    m.other_params = add(m.other_params, vision);
    m.notes.push_back("multimodal config (" + wrapper + "): the vision tower and projector (" + std::to_string(vision) +
                      " parameters) are counted in the weights; activations are those of text-only inputs");
  } else {
    m.warnings.push_back("multimodal config (" + wrapper + "): the language model (text_config, " + m.model_type +
                      ") is estimated; the vision tower and projector are not counted");
  }
}

/// What Transformers rejects at the first forward (or at construction): query heads that do
/// not split into key/value groups (repeat_kv's num_key_value_groups), and a hidden width that
/// does not split into heads when the config gives no head_dim (the head reshape).
void check_attention_shape(const Builder& b) {
  const ModelSpec& m = b.m;
  if (m.attention != AttentionKind::Standard) return;
  const std::string where = "config.json (" + m.model_type + "): ";
  if (m.kv_heads == 0 || m.kv_heads > m.heads || m.heads % m.kv_heads != 0)
    throw Error(where + std::to_string(m.heads) + " attention heads do not split into " + std::to_string(m.kv_heads) +
                " key/value heads (Transformers needs num_attention_heads to be a multiple of num_key_value_heads): "
                "fix num_key_value_heads");
  if (!b.r.has({"head_dim"}) && m.hidden % m.heads != 0)
    throw Error(where + "hidden size " + std::to_string(m.hidden) + " is not divisible by " + std::to_string(m.heads) +
                " attention heads (Transformers reshapes the projections into heads of hidden / heads): fix the head "
                "count or give head_dim");
}

/// Copies the model_type's row of family_traits.cpp into typed fields, with the config fields
/// that override a family default (norm_topk_prob; a remote-code model's attn_implementation).
void apply_family_traits(Builder& b) {
  ModelSpec& m = b.m;
  const FamilyTraits& f = family_traits(m.model_type);
  m.supports_sdpa = f.sdpa;
  m.supports_flash_attention_2 = f.flash_attention_2;
  m.remote_code = f.remote_code;
  m.default_attention = f.runs_by_default;
  m.peft_lora_targets = split_targets(f.peft_lora_targets);
  m.norm_topk_prob = b.r.flag_or({"norm_topk_prob"}, f.norm_topk_prob);
  m.checkpoint_dtype = b.r.text_or({"dtype", "torch_dtype"}, "");
  if (f.remote_code) {
    const std::string chosen = b.r.text_or({"attn_implementation"}, "");
    if (chosen == "flash_attention_2" && f.flash_attention_2) m.default_attention = AttentionImpl::FlashAttention2;
    if (chosen == "eager") m.default_attention = AttentionImpl::Eager;
  }
}

}  // namespace

u64 LayerGroup::params_per_layer() const {
  u64 p = other_params;
  for (const Linear& l : linears) p = add(p, l.params());
  return p;
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const auto& [name, fn] : builders()) out.push_back(name);
  out.push_back("bert");
  out.push_back("gemma3");
  out.push_back("llama4");
  return out;
}

ModelSpec parse_model_config(const json& config, const std::string& head) {
  if (head != "auto" && head != "lm" && head != "classification")
    throw Error("model.head must be \"auto\", \"lm\" or \"classification\", got \"" + head + "\"");
  if (!config.is_object()) throw Error("config.json must be a JSON object ({...}), got " + std::string(config.type_name()));
  std::string type = infer_model_type(config);

  // Multimodal files nest the language model under text_config; the vision tower is counted
  // from vision_config where memfit knows it (vision_tower_params), else said to be left out.
  const json* cfg = &config;
  std::string wrapper;
  auto tc = config.find("text_config");
  if (tc != config.end() && tc->is_object()) {
    std::string inner = infer_model_type(*tc);
    if (inner.empty()) inner = type == "gemma3" ? "gemma3_text" : type == "llama4" ? "llama4_text" : type == "llava" ? "llama" : "";
    if (inner.empty())
      throw Error("config.json nests a text_config without a model_type: add \"model_type\" to text_config");
    cfg = &*tc;
    wrapper = type;
    type = inner;
  }
  json with_defaults;
  if (auto d = class_defaults().find(type); d != class_defaults().end()) {
    with_defaults = *cfg;
    for (const auto& [key, value] : d->second.items())
      if (!with_defaults.contains(key) || with_defaults[key].is_null()) with_defaults[key] = value;
    cfg = &with_defaults;
  }
  if (type.empty())
    throw Error("config.json has neither \"model_type\" nor a known \"architectures\" entry: add \"model_type\"");
  if (const char* kind = unsupported_architecture(type))
    throw Error("model_type \"" + type + "\" is " + kind +
                "; memfit estimates decoder-only and encoder-only transformers, so no figure it gives for this "
                "model would be right");

  Builder b(*cfg, "config.json (" + type + ")");
  b.m.model_type = type;
  if (type == "bert") {
    std::string arch;
    auto ar = cfg->find("architectures");
    if (ar != cfg->end() && ar->is_array() && !ar->empty() && (*ar)[0].is_string()) arch = (*ar)[0].get<std::string>();
    bool classify = head == "classification" || (head == "auto" && arch == "BertForSequenceClassification");
    build_bert(b, classify ? "classification" : "lm");
  } else {
    auto it = builders().find(type);
    if (it != builders().end()) it->second(b);
    else build_unknown(b);
  }
  if (b.m.heads == 0 || b.m.hidden == 0 || b.m.layers == 0) throw Error("config.json describes an empty model");
  check_attention_shape(b);
  apply_family_traits(b);
  if (!wrapper.empty()) add_vision_tower(b.m, wrapper, config);
  return b.m;
}

ParamCounts count_params(const ModelSpec& m) {
  ParamCounts c;
  c.embedding = add(m.embedding_params, m.position_params);
  for (const LayerGroup& g : m.groups) c.layers = add(c.layers, g.params());
  c.lm_head = m.tied_embeddings ? m.lm_head.bias_params() : m.lm_head.params();
  c.other = m.other_params;
  c.vision = m.vision_params;
  c.total = add(add(c.embedding, c.layers), add(c.lm_head, c.other));

  // Active parameters per token: routed experts count top-k of `experts` copies.
  u64 active = add(add(c.embedding, c.lm_head), c.other);
  for (const LayerGroup& g : m.groups) {
    u64 per = g.other_params;
    for (const Linear& l : g.linears) {
      if (l.routed && g.experts > 0) per = add(per, mul(l.params() / l.copies, g.experts_per_token));
      else per = add(per, l.params());
    }
    active = add(active, mul(per, g.count));
  }
  c.active_per_token = active;
  return c;
}

}  // namespace memfit

namespace memfit {

u64 checkpoint_weight_bytes(const ModelSpec& m, u64 float_bytes) {
  const ParamCounts c = count_params(m);
  u64 quantized = 0, quantized_weights = 0;
  for (const LayerGroup& g : m.groups)
    for (const Linear& l : g.linears)
      if (l.checkpoint_quantized) {
        quantized = add(quantized, mul(g.count, l.weight_params()));
        quantized_weights = add(quantized_weights, mul(g.count, bytes_of_bits(l.weight_params(), m.checkpoint_quant.bits_x1024) / 1024));
      }
  return add(mul(c.total - quantized, float_bytes), quantized_weights);
}

}  // namespace memfit
