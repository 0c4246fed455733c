// Weights, gradients and optimizer states of the whole model, in bytes, before any sharding.
//
// Bytes per parameter follow what each engine allocates:
//  - fp32: weights 4, grads 4, AdamW states 2 x 4.
//  - pure bf16/fp16 (model.to(bf16), torch optimizers): weights 2, grads 2, states 2 x 2
//    (torch.optim.AdamW creates its states with zeros_like(param)).
//  - autocast (torch.amp, HF Trainer bf16/fp16=True): weights/grads/states as fp32 plus a
//    half cast of each Linear weight saved for backward.
//  - DeepSpeed ZeRO / Megatron ("HalfMaster"): weights 2, grads 2, fp32 master 4 + states 8 in
//    the optimizer (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1: 2+2+12 bytes for Adam).
//  - FSDP mixed precision ("ShardedFp32"): sharded fp32 params (4) are the master, gradients
//    reduced to fp32 (4), states 8; half copies exist only for gathered units.
// Quantized base weights (QLoRA, quantized inference): see quantized_bits_x1024.
#include <algorithm>

#include "memfit/error.hpp"
#include "memfit/model.hpp"
#include "activations.hpp"
#include "frameworks.hpp"
#include "states.hpp"

namespace memfit::detail {

bool lora_targets(const Request& r, const std::string& name) {
  if (r.lora.all_linear) return true;
  for (const std::string& t : r.lora.targets) {
    if (name == t) return true;
    // PEFT matches target names as module-name suffixes: "c_proj" hits "attn.c_proj" and "mlp.c_proj".
    if (name.size() > t.size() && name.ends_with(t) && name[name.size() - t.size() - 1] == '.') return true;
  }
  return false;
}

namespace {

/// Bits per parameter (x1024, to stay in integers) of quantized Linear weights, the
/// quantization constants included. bitsandbytes NF4: 4-bit codes + an fp32 absmax per
/// 64-element block (0.5 bit); double quantization stores the absmax in 8 bits (0.125 bit)
/// plus an fp32 per 256 blocks (QLoRA, Dettmers et al., arXiv 2305.14314, sec. 3). LLM.int8:
/// int8 codes (+ an fp32 scale per output row, added per tensor). GPTQ / AWQ, group size 128:
/// 4-bit codes, an fp16 scale (16/128 bit) and a 4-bit zero (4/128 bit) per group. FP8
/// (e4m3, as DeepSeek-V3 ships): 8-bit values and an fp32 scale per 128 x 128 block.
u64 quantized_bits_x1024(Quantization q) {
  switch (q) {
    case Quantization::Nf4:
    case Quantization::Fp4: return 4 * 1024 + 512;  // bitsandbytes FP4: same codes and absmax layout as NF4
    case Quantization::Nf4Double: return 4 * 1024 + 128 + 2;
    case Quantization::Int8: return 8 * 1024;
    case Quantization::GptqInt4:
    case Quantization::AwqInt4: return 4 * 1024 + 128 + 32;
    case Quantization::Fp8: return 8 * 1024 + 2;
    // OCP MXFP4: 4-bit values + an 8-bit (E8M0) scale per 32 elements; NVFP4: 4-bit values + an
    // FP8 (E4M3) scale per 16 elements (the per-tensor fp32 scale is negligible).
    case Quantization::Mxfp4: return 4 * 1024 + 256;
    case Quantization::Nvfp4: return 4 * 1024 + 512;
    case Quantization::None: return 0;
  }
  return 0;
}

/// Bytes of bitsandbytes' quantization constants held beside each quantized Linear weight besides
/// the per-block absmax counted in quantized_bits_x1024 (functional.py quantize_4bit, 0.50.2): the
/// 4-bit code table (16 fp32) of its QuantState; double quantization adds state2's 8-bit dynamic
/// map (256 fp32, created per call of quantize_blockwise) and the fp32 absmax offset.
u64 quant_state_constants(Quantization q) {
  switch (q) {
    case Quantization::Nf4:
    case Quantization::Fp4: return 16 * 4;
    case Quantization::Nf4Double: return 16 * 4 + 256 * 4 + 4;
    default: return 0;
  }
}

/// bitsandbytes 8-bit optimizer states of one trainable tensor of `n` elements, `nstates` states
/// (optim/optimizer.py Optimizer2State / Optimizer1State.init_state, 0.50.2): a tensor under
/// min_8bit_size (4096 elements) keeps fp32 states; a larger one uint8 codes and an fp32 absmax
/// per 256-element block (blockwise=True). Same on CUDA and on the CPU backend.
u64 bnb8_tensor_states(u64 n, u64 nstates) {
  if (n < 4096) return mul(nstates, 4, n);
  return mul(nstates, add(n, mul(4, div_ceil(n, 256))));
}


/// How PEFT adapts one Linear of the model spec.
enum class Adapter { None, Module, Param };

/// Transformers 5 fuses the routed experts of MoE blocks into [E, ...] parameters (gate_up_proj,
/// down_proj) and makes the router a custom module, so neither is an nn.Linear that "all-linear" or a
/// module-name target can wrap. PEFT 0.21 rewrites the LoRA config of the model types that have a
/// v4 -> v5 checkpoint conversion (utils/transformers_weight_conversion.py, _convert_peft_config_moe):
/// Mixtral (added by PEFT) and the types Transformers' conversion_mapping.py maps onto the
/// "qwen2_moe" pattern (qwen3_moe, deepseek_v2, deepseek_v3, ...; not qwen2_moe itself, which is
/// the pattern's name, not a key). There a target naming a v4 expert / router projection
/// (_MOE_TARGET_MODULE_MAPPING: gate, w1, w3, w2 for Mixtral; gate, gate_proj, up_proj, down_proj
/// otherwise) becomes a target_parameters entry (gate.weight, gate_up_proj, down_proj) and leaves
/// target_modules: it adapts the fused experts and the router weight by parametrisation
/// (lora.ParamWrapper), and the ordinary Linears of the same name (a dense MLP, DeepSeek's shared
/// experts) are no longer adapted. gate_up_proj, fused from two v4 targets, gets rank 2r (and alpha 2a).
bool peft_converts_moe(const ModelSpec& m) {
  const std::string& t = m.model_type;
  return t == "mixtral" || t == "qwen3_moe" || t == "deepseek_v2" || t == "deepseek_v3";
}

bool is_router(const LayerGroup& g, const Linear& l) { return g.moe && !l.routed && l.name == "gate"; }

/// Whether a v4 projection name is among the targets (PEFT: `target == old or target.endswith("." + old)`).
bool names_v4_target(const Request& r, const std::string& old) {
  if (r.lora.all_linear) return true;  // "all-linear" resolves to every v4 Linear name
  for (const std::string& t : r.lora.targets)
    if (t == old || (t.size() > old.size() && t.ends_with(old) && t[t.size() - old.size() - 1] == '.')) return true;
  return false;
}

Adapter lora_adapter(const Request& r, const LayerGroup& g, const Linear& l) {
  const ModelSpec& m = r.model;
  if (!l.peft_module) return Adapter::None;  // no target can wrap a custom (non-Linear) module
  if (!g.moe && !peft_converts_moe(m)) return lora_targets(r, l.name) ? Adapter::Module : Adapter::None;
  if (!peft_converts_moe(m)) {
    // fused experts and the router are no nn.Linear: untouched (Qwen2-MoE: the shared expert and its
    // sigmoid gate are Linears)
    if (l.routed || is_router(g, l)) return Adapter::None;
    return lora_targets(r, l.name) ? Adapter::Module : Adapter::None;
  }
  const bool mixtral = m.model_type == "mixtral";
  const char* v4_gate = mixtral ? "w1" : "gate_proj";
  const char* v4_up = mixtral ? "w3" : "up_proj";
  const char* v4_down = mixtral ? "w2" : "down_proj";
  const bool v4_name = l.name == "gate" || l.name == v4_gate || l.name == v4_up || l.name == v4_down;
  if (!v4_name) return lora_targets(r, l.name) ? Adapter::Module : Adapter::None;
  if (!l.routed && !is_router(g, l)) return Adapter::None;  // its target became a parameter target
  if (l.routed && l.input == LinearInput::MlpIn) {
    const bool gate = names_v4_target(r, v4_gate), up = names_v4_target(r, v4_up);
    if (gate != up)
      throw Error(std::string("PEFT cannot adapt ") + (gate ? v4_gate : v4_up) + " without " + (gate ? v4_up : v4_gate) +
                  ": Transformers 5 fuses them into gate_up_proj; target both or neither");
    return gate ? Adapter::Param : Adapter::None;
  }
  return names_v4_target(r, l.name) ? Adapter::Param : Adapter::None;
}

/// Trainable adapter parameters on one Linear. lora.Linear: A [r, in], B [out, r] per module.
/// lora.ParamWrapper on an [E, ...] expert stack: A [r E, in], B [out, r E] (update_layer), with
/// rank 2r on gate_up_proj [E, 2i, h]: A [2r E, h], B [2i, 2r E], counted here half on each of the
/// two Linears (gate, up) the spec models it as.
u64 adapter_params(const Request& r, const LayerGroup& g, const Linear& l, Adapter a) {
  if (a == Adapter::None) return 0;
  if (a == Adapter::Param && l.routed && l.input == LinearInput::MlpIn)
    return mul(r.lora.rank, l.copies, add(l.in, mul(2, l.out)));
  (void)g;
  return mul(r.lora.rank, add(l.in, l.out), l.copies);
}

/// One Linear's adapter parameters under tensor parallelism: the part split across the TP ranks
/// and the part every rank holds whole. PEFT's LoraParallelLinear (peft/tuners/lora/tp_layer.py)
/// splits lora_B by columns under a column-parallel Linear and lora_A by rows under a row-parallel
/// one, so that the adapter's output matches the base's; the other matrix stays whole.
struct AdapterShares {
  u64 split = 0, whole = 0;
};

AdapterShares adapter_shares(const Request& r, const LayerGroup& g, const Linear& l, Adapter a) {
  const u64 total = adapter_params(r, g, l, a);
  if (l.split == TpSplit::Replicated) return {0, total};
  if (a != Adapter::Module) return {total, 0};  // expert parameters: split with their experts
  const u64 lora_a = mul(r.lora.rank, l.in, l.copies), lora_b = mul(r.lora.rank, l.out, l.copies);
  return l.split == TpSplit::Column ? AdapterShares{lora_b, lora_a} : AdapterShares{lora_a, lora_b};
}

/// The largest adapter tensor on one Linear (elements).
u64 largest_adapter(const Request& r, const Linear& l, Adapter a) {
  if (a == Adapter::Param && l.routed && l.input == LinearInput::MlpIn)
    return mul(2, r.lora.rank, l.copies, std::max(l.in, mul(2, l.out)));
  if (a == Adapter::Param) return mul(r.lora.rank, l.copies, std::max(l.in, l.out));
  return mul(r.lora.rank, std::max(l.in, l.out));
}

/// Elements of `total` parameters held in tensors of `width` (norm weights, biases): whole ones
/// and the remainder, for the per-tensor rule of bnb8_tensor_states.
u64 bnb8_vectors(u64 total, u64 width, u64 nstates) {
  if (total == 0) return 0;
  if (width == 0) return bnb8_tensor_states(total, nstates);
  return add(mul(total / width, bnb8_tensor_states(width, nstates)), bnb8_tensor_states(total % width, nstates));
}

/// bitsandbytes 8-bit optimizer states of the whole model, tensor by tensor (see
/// bnb8_tensor_states), plus the quantization maps the optimizer shares across tensors (one
/// 256-entry fp32 map per state kind: name2qmap "dynamic" / "udynamic").
u64 bnb8_states(const Request& r, u64 nstates) {
  const ModelSpec& m = r.model;
  const bool full = r.task == Task::Full;
  u64 st = 0;
  for (const LayerGroup& g : m.groups) {
    u64 per = 0;
    for (const Linear& l : g.linears) {
      // Transformers 5 fuses routed experts into one [E, ...] parameter; other Linears are one each
      const u64 tensors = l.copies > 1 && !l.routed ? l.copies : 1;
      if (full && !g.frozen) {
        per = add(per, mul(tensors, bnb8_tensor_states(l.weight_params() / tensors, nstates)));
        per = add(per, mul(tensors, bnb8_tensor_states(l.bias_params() / tensors, nstates)));
      }
      const Adapter a = full ? Adapter::None : lora_adapter(r, g, l);
      if (a == Adapter::Module)
        per = add(per, mul(l.copies, add(bnb8_tensor_states(mul(r.lora.rank, l.in), nstates),
                                         bnb8_tensor_states(mul(r.lora.rank, l.out), nstates))));
      else if (a == Adapter::Param) {
        const u64 rank_e = mul(r.lora.rank, l.copies), wide = l.input == LinearInput::MlpIn ? 2 : 1;
        per = add(per, add(bnb8_tensor_states(mul(rank_e, l.in), nstates),
                           bnb8_tensor_states(mul(wide, rank_e, l.out), nstates)));
      }
    }
    if (full && !g.frozen) per = add(per, bnb8_vectors(g.other_params, m.hidden, nstates));
    st = add(st, mul(g.count, per));
  }
  if (full) {
    if (r.frozen_layers == 0)
      st = add(st, add(bnb8_tensor_states(m.embedding_params, nstates), bnb8_tensor_states(m.position_params, nstates)));
    if (!m.tied_embeddings) st = add(st, bnb8_tensor_states(m.lm_head.weight_params(), nstates));
    st = add(st, bnb8_tensor_states(m.lm_head.bias_params(), nstates));
    st = add(st, bnb8_vectors(m.other_params, m.hidden, nstates));
  }
  return add(st, mul(nstates, 256 * 4));
}

/// What the request trains and the bytes per element its model states come in.
struct StateDtypes {
  bool inference = false, lora = false, full = false, fp32 = false;
  bool quantized = false;       ///< quantized base weights (QLoRA, quantized inference)
  u64 weight_bytes = 4;         ///< weights the model holds (trained ones of a full run)
  u64 frozen_bytes = 4;         ///< frozen weights
  u64 adapter_bytes = 4;        ///< LoRA adapter weights
  u64 quant_bits_x1024 = 0;     ///< quantized bits per weight (see quantized_bits_x1024)
  bool autocast_casts = false;  ///< autocast keeps a half cast of each Linear weight
};

StateDtypes state_dtypes(const Request& r, MixedMode mixed) {
  StateDtypes d;
  d.inference = r.task == Task::Inference;
  d.lora = r.task == Task::Lora || r.task == Task::Qlora;
  d.full = r.task == Task::Full;
  d.quantized = r.quantization != Quantization::None && (r.task == Task::Qlora || d.inference);
  d.fp32 = r.precision == Precision::Fp32;

  // Bytes per element of the weights the model holds.
  d.weight_bytes = d.fp32 ? 4 : 2;
  if (!d.inference && mixed == MixedMode::Autocast) d.weight_bytes = 4;
  if (!d.inference && mixed == MixedMode::ShardedFp32) d.weight_bytes = 4;  // the sharded fp32 params
  // frozen weights: the load dtype (autocast: fp32), fp32 once prepare_model_for_kbit_training upcast them
  d.frozen_bytes = (d.inference || mixed != MixedMode::Autocast) ? (d.fp32 ? 4 : 2) : d.weight_bytes;
  if (kbit_upcast(r) || (d.quantized && !d.inference && mixed == MixedMode::Autocast)) d.frozen_bytes = 4;
  // PEFT upcasts adapters to fp32 unless told otherwise (autocast_adapter_dtype=True).
  d.adapter_bytes = r.lora.adapter_bytes ? r.lora.adapter_bytes : 4;
  d.quant_bits_x1024 = quantized_bits_x1024(r.quantization);
  d.autocast_casts = !d.inference && mixed == MixedMode::Autocast && !d.quantized;
  return d;
}

/// Bytes of one Linear's weight and bias as the model holds them (quantized or in its dtype).
u64 linear_weight_bytes(const Request& r, const StateDtypes& d, const LayerGroup& g, const Linear& l) {
  // bitsandbytes replaces nn.Linear modules only: Transformers 5's fused expert parameters
  // ([E, ...], not Linears) stay in the load dtype, and prepare_kbit upcasts them with the rest
  // (measured, mixtral-tiny nf4_double: 2 layers x 4 experts x 3 x 128 x 448 in fp32 = 5,505,024 B
  // beside the 4-bit attention)
  const bool bnb = r.quantization == Quantization::Nf4 || r.quantization == Quantization::Nf4Double ||
                   r.quantization == Quantization::Fp4 || r.quantization == Quantization::Int8;
  if (d.quantized && !(bnb && g.moe && l.routed)) {
    u64 w = div_ceil(mul(l.weight_params(), d.quant_bits_x1024), 8 * 1024);
    if (r.quantization == Quantization::Int8) w = add(w, mul(4, l.out, l.copies));  // fp32 row scales
    w = add(w, mul(quant_state_constants(r.quantization), l.copies));
    return add(w, mul(d.frozen_bytes, l.bias_params()));
  }
  return mul(d.full ? d.weight_bytes : d.frozen_bytes, l.params());  // frozen layers of a full run are loaded alike
}

/// One layer of group g: its weight bytes and trainable parameters (TP-split and replicated), its
/// autocast casts, which Linears save their input for backward; the largest trained tensors go to
/// s. Returns whether LoRA targets any of its Linears.
bool add_layer_states(const Request& r, const StateDtypes& d, const LayerGroup& g, ModelStates& s) {
  TrainableLinears tl;
  tl.lora_rank = d.lora ? r.lora.rank : 0;
  GroupStates gs;
  bool any_target = false;
  const bool trained = d.full && !g.frozen;
  u64 previous = 0;  // the trained tensor before this Linear's weight (a layer starts after a norm's)
  for (size_t li = 0; li < g.linears.size(); ++li) {
    const Linear& l = g.linears[li];
    const Adapter adapter = d.lora ? lora_adapter(r, g, l) : Adapter::None;
    const bool target = adapter != Adapter::None;
    any_target = any_target || target;
    tl.saves_input.push_back(trained || target);
    tl.parametrized.push_back(adapter == Adapter::Param);
    const bool split = l.split != TpSplit::Replicated;
    const u64 w = linear_weight_bytes(r, d, g, l);
    u64 t = 0;
    if (trained) t = l.params();
    if (const bool second_half = li > 0 && g.linears[li - 1].stored_with_next; trained && !second_half) {
      // the optimizer steps parameters, not modules: fused experts are one [E, out, in] tensor,
      // gate and up one [E, 2 I, h] (measured, peak dumps of tuning cases
      // mixtral/h256-L3-V2048/full/fp32/gc/sdpa/b2s48/adafactor and
      // qwen3_moe/h384-L2-V1024/full/bf16/nogc/eager/b1s64/adafactor: Adafactor's fp32 copies of
      // the whole gate_up_proj stack)
      const u64 weight = l.stored_with_next ? add(l.weight_params(), g.linears[li + 1].weight_params()) : l.weight_params();
      s.largest_trainable_tensor = std::max(s.largest_trainable_tensor, weight);
      s.step_pair_x2 = std::max(s.step_pair_x2, add(mul(2, weight), previous));
      s.step_pair_x4 = std::max(s.step_pair_x4, add(mul(4, weight), previous));
      previous = l.bias_params() > 0 ? l.bias_params() : weight;
    }
    (split ? gs.w_split : gs.w_repl) = add(split ? gs.w_split : gs.w_repl, w);
    (split ? gs.t_split : gs.t_repl) = add(split ? gs.t_split : gs.t_repl, t);
    if (target) {
      const AdapterShares a = adapter_shares(r, g, l, adapter);
      gs.w_split = add(gs.w_split, mul(d.adapter_bytes, a.split));
      gs.w_repl = add(gs.w_repl, mul(d.adapter_bytes, a.whole));
      gs.t_split = add(gs.t_split, a.split);
      gs.t_repl = add(gs.t_repl, a.whole);
      s.largest_trainable_tensor = std::max(s.largest_trainable_tensor, largest_adapter(r, l, adapter));
    }
    // backward needs every Linear weight (frozen ones too, for the input gradient): autocast
    // keeps the half cast of each.
    // Fused experts run torch._grouped_mm, which CPU autocast does not cast (activations.cpp
    // fp32_experts): no half copy of them (measured, peak dump of tuning case
    // qwen2_moe/h256-L4-V8192/full/amp_bf16/gc/sdpa/b2s192/sgd_momentum: bf16 casts of every
    // attention, router and shared-expert weight, none of the [4, 384, 256] / [4, 256, 192] experts)
    const bool uncast_experts = g.moe && l.routed && !g.experts_on_every_token && r.device == Device::Cpu;
    if (d.autocast_casts && !g.frozen && !uncast_experts) gs.casts = add(gs.casts, mul(2, l.weight_params()));
  }
  gs.w_repl = add(gs.w_repl, mul(d.full ? d.weight_bytes : d.frozen_bytes, g.other_params));
  if (trained) gs.t_repl = add(gs.t_repl, g.other_params);
  s.trainable = add(s.trainable, mul(g.count, add(gs.t_split, gs.t_repl)));
  s.groups.push_back(gs);
  s.linears.push_back(std::move(tl));
  return any_target;
}

/// The layers' states, group by group; a LoRA run whose targets match no Linear is an error.
void add_layers_states(const Request& r, const StateDtypes& d, ModelStates& s) {
  const ModelSpec& m = r.model;
  bool any_target = false;
  for (const LayerGroup& g : m.groups) any_target = add_layer_states(r, d, g, s) || any_target;
  if (d.lora && !any_target) {
    std::string names;
    if (!m.groups.empty())
      for (const Linear& l : m.groups.front().linears) names += (names.empty() ? "" : ", ") + l.name;
    throw Error("none of the LoRA targets matches a Linear layer of this model; its layers have: " + names +
                " (or use \"all-linear\")");
  }
}

/// The weights outside the layers, and what of them trains: all in a full run, the LoRA adapters
/// on the outer Linears otherwise.
void add_outer_states(const Request& r, const StateDtypes& d, ModelStates& s) {
  const ModelSpec& m = r.model;
  const FrameworkTraits& fw = framework_traits(r.runtime.framework, r.runtime.framework_version);
  // Outside the layers: embeddings, head, norms (never quantized: bitsandbytes skips lm_head).
  const ParamCounts pc = count_params(m);
  const u64 ob = d.full ? d.weight_bytes : d.frozen_bytes;
  s.emb_w = mul(ob, pc.embedding);
  const u64 head_split = m.tied_embeddings ? 0 : m.lm_head.weight_params();
  s.head_w_split = mul(ob, head_split);
  // A framework that quantizes every Linear (LitGPT through Lightning's BitsandbytesPrecision)
  // quantizes lm_head too.
  const bool bnb4 = r.quantization == Quantization::Nf4 || r.quantization == Quantization::Nf4Double ||
                    r.quantization == Quantization::Fp4;
  if ((r.task == Task::Qlora || d.inference) && bnb4 && head_split > 0 && fw.bnb_quantizes_lm_head)
    s.head_w_split = add(div_ceil(mul(head_split, d.quant_bits_x1024), 8 * 1024), quant_state_constants(r.quantization));
  s.head_w_repl = mul(ob, add(pc.other, m.lm_head.bias_params()));
  if (d.full) {
    // frozen bottom layers come with frozen embeddings
    s.emb_t = r.frozen_layers > 0 ? 0 : pc.embedding;
    s.head_t_split = head_split;
    s.head_t_repl = add(pc.other, m.lm_head.bias_params());
    s.trainable = add(s.trainable, add(s.emb_t, add(head_split, s.head_t_repl)));
    s.largest_trainable_tensor = std::max(s.largest_trainable_tensor, m.embedding_params);
    // A learned position table comes right after the token table in module order (GPT2Model,
    // GPTNeoModel, OPT, BioGPT: wte then wpe), so Adafactor's `update` of the token table is alive
    // at the position table's (see the Adafactor step below; measured, peak dump of tuning case
    // gpt_neo/h256-L2-V1024/full/bf16/nogc/eager/b1s32/adafactor at the add: the previous fp32
    // [1024, 256] mul beside two fp32 copies, pow and add of the [1024, 256] position table)
    if (s.emb_t > 0 && m.position_params > 0) {
      s.step_pair_x2 = std::max(s.step_pair_x2, add(mul(2, m.position_params), m.embedding_params));
      s.step_pair_x4 = std::max(s.step_pair_x4, add(mul(4, m.position_params), m.embedding_params));
    }
    // LitGPT steps its own lm_head right before the token table (measured, peak dump of the
    // frameworks holdout's litgpt/llama/h256-L3-V16384/full/amp_bf16/nogc/sdpa/b1s192/adamw_loop at
    // wte's division: lm_head's [16384, 256] denom beside wte's sqrt and quotient)
    if (s.emb_t > 0 && head_split > 0 && fw.head_steps_before_embedding) {
      s.step_pair_x2 = std::max(s.step_pair_x2, add(mul(2, m.embedding_params), head_split));
      s.step_pair_x4 = std::max(s.step_pair_x4, add(mul(4, m.embedding_params), head_split));
    }
  }
  if (d.autocast_casts) s.head_casts = mul(2, m.lm_head.in, m.vocab);
  // LoRA adapters on the Linears outside the layers (measured, tuning case
  // bert/h128-L2-V1024/mlm/lora-r16-all/bf16/gc/eager/b2s128/adamw: "all-linear" wraps
  // cls.predictions.transform.dense, 4,096 more trainable parameters and their AdamW states)
  for (const Linear& l : m.outer_linears) {
    if (!d.lora || !lora_targets(r, l.name)) continue;
    const u64 p = mul(r.lora.rank, add(l.in, l.out));
    s.head_w_repl = add(s.head_w_repl, mul(d.adapter_bytes, p));
    s.head_t_repl = add(s.head_t_repl, p);
    s.trainable = add(s.trainable, p);
    s.largest_trainable_tensor = std::max(s.largest_trainable_tensor, mul(r.lora.rank, std::max(l.in, l.out)));
  }
}

/// transformers.Adafactor's states of the whole model and its step's temporaries.
/// `flat_bytes`: bytes per element of the flat partition DeepSpeed ZeRO would hand it instead.
void set_adafactor_states(const Request& r, const StateDtypes& d, u64 flat_bytes, ModelStates& s) {
  const ModelSpec& m = r.model;
  // transformers.Adafactor: factored second moment (fp32 row + column vectors) for matrices,
  // full for vectors; no first moment by default (beta1=None).
  u64 st = 0;
  for (size_t gi = 0; gi < m.groups.size(); ++gi) {
    const LayerGroup& g = m.groups[gi];
    u64 per = 0;
    for (const Linear& l : g.linears) {
      if (d.full) per = add(per, add(mul(4, add(l.in, l.out), l.copies), mul(4, l.bias_params())));
      else if (const Adapter a = d.lora ? lora_adapter(r, g, l) : Adapter::None; a == Adapter::Param && l.routed) {
        // A [r' E, in] and B [out', r' E] factored (r' = 2r, out' = 2 out for gate_up_proj: half on each)
        const bool gate_up = l.input == LinearInput::MlpIn;
        const u64 re = mul(gate_up ? 2 : 1, r.lora.rank, l.copies);
        per = add(per, gate_up ? mul(2, add(re, add(l.in, add(mul(2, l.out), re))))
                               : mul(4, add(add(re, l.in), add(re, l.out))));
      } else if (a != Adapter::None)
        per = add(per, mul(4, add(add(r.lora.rank, l.in), add(r.lora.rank, l.out)), l.copies));
    }
    if (d.full) per = add(per, mul(4, g.other_params));
    st = add(st, mul(g.count, per));
  }
  // the learned position table [positions, h] is a matrix too: factored (tuning case
  // gpt2/h128-L4-V1024/full/amp_bf16/gc/sdpa/b3s64/adafactor: [1024] + [128] fp32 for wpe)
  const u64 positions_factored = m.position_params > 0 ? add(m.position_params / std::max<u64>(1, m.hidden), m.hidden) : 0;
  if (d.full) st = add(st, mul(4, add(add(m.vocab, m.hidden), add(count_params(m).other, positions_factored))));
  s.state_bytes = st;
  // transformers.Adafactor.step on one tensor: update = grad**2 + eps and the row x column
  // product that replaces it, later update and -update: two fp32 copies of the largest tensor;
  // half-precision parameters add the fp32 copies of grad and parameter it makes
  // (grad.float(), p.float()): four (measured, tuning cases
  // phi3/h384-L4-V16384/full/fp32/nogc/eager/b3s48/adafactor: 2 x the [16384, 384] embedding;
  // gpt2/h384-L3-V32000/full/bf16/nogc/eager/b1s32/adafactor: 4 x [32000, 384] in fp32)
  // The loop's `update` of the previous tensor stays alive until `update = (grad**2) + eps`
  // of the next one is assigned (optimization.py Adafactor.step, lines 1261 and 1270): gate_proj
  // then up_proj of a gated MLP make three (five) copies of one size (measured, tuning case
  // qwen2/h336-L3-V2048/full/amp_bf16/gc/sdpa/b2s128/adafactor: the previous [1824, 336] mul
  // beside the current pow and add)
  const u64 per = s.grad_bytes < 4 ? 4 : 2;
  const u64 pair = per == 4 ? s.step_pair_x4 : s.step_pair_x2;
  s.step_temporary = mul(4, std::max(pair, mul(per, s.largest_trainable_tensor)));
  s.step_temporary_per_tensor = true;
  // A 1-D tensor is not factored (Adafactor._get_options: factored = len(grad_shape) >= 2): its
  // second moment is a full fp32 zeros_like(grad.float()), and the step's temporaries are those
  // of that one tensor (update = grad**2 + eps beside the pow; update = exp_avg_sq.rsqrt().mul_(grad)
  // beside the previous update; -update beside update: two fp32 copies, four for a half tensor).
  s.flat_state_bytes = mul(4, s.trainable);
  s.flat_step_bytes_per_element = mul(4, flat_bytes < 4 ? 4 : 2);
}

/// Gradient, master and optimizer-state bytes (and the step's temporaries) of the trainable
/// parameters counted in s.
void set_optimizer_states(const Request& r, const StateDtypes& d, MixedMode mixed, ModelStates& s) {
  // Gradient, master and optimizer-state bytes per trainable parameter.
  const bool half_params = !d.fp32 && mixed != MixedMode::Autocast && mixed != MixedMode::ShardedFp32;
  s.weight_bytes_per_trainable = d.full ? d.weight_bytes : d.adapter_bytes;
  s.grad_bytes = d.full ? (half_params ? 2 : 4) : d.adapter_bytes;
  if (d.full && mixed == MixedMode::HalfMaster) s.master_bytes = 4;
  // optimizer states follow the parameter dtype the optimizer sees (the fp32 master where
  // there is one).
  const u64 sb = (d.full && (mixed == MixedMode::HalfMaster)) ? 4 : s.grad_bytes;
  const u64 n = s.trainable;
  switch (r.optimizer) {
    case Optimizer::AdamW:
      s.state_bytes = mul(2, sb, n);
      s.step_temporary = mul(sb, n);  // torch._foreach_sqrt(exp_avg_sq) materialises one full copy
      break;
    case Optimizer::AdamWFused: s.state_bytes = mul(2, sb, n); break;
    case Optimizer::AdamWLoop:
      s.state_bytes = mul(2, sb, n);
      // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt) of one tensor: the sqrt and the
      // quotient are both alive at the division (torch/optim/adam.py _single_tensor_adam; measured,
      // peak dump of tuning case mixtral/h256-L2-V1024/full/bf16/nogc/sdpa/b1s64/adamw_loop at div),
      // and the loop's `denom` of the tensor before until the new one is assigned (step_pair_x2)
      s.step_temporary = mul(sb, std::max(mul(2, s.largest_trainable_tensor), s.step_pair_x2));
      s.step_temporary_per_tensor = true;
      s.flat_step_bytes_per_element = mul(2, sb);
      break;
    case Optimizer::AdamW8bit: s.state_bytes = bnb8_states(r, 2); break;  // step: one kernel per tensor, no temporaries
    case Optimizer::PagedAdamW8bit:
      // bitsandbytes' CPU backend has no paged memory: the states are ordinary tensors there
      (r.device == Device::Cpu ? s.state_bytes : s.paged_state_bytes) = bnb8_states(r, 2);
      break;
    case Optimizer::PagedAdamW: s.paged_state_bytes = mul(2, 4, n); break;
    case Optimizer::Sgd: break;
    case Optimizer::SgdMomentum: s.state_bytes = mul(sb, n); break;
    case Optimizer::Lion:
      // bitsandbytes.optim.Lion (what Trainer's optim="lion_32bit" builds): one fp32 state per
      // element whatever the parameter dtype (Optimizer1State.init_state, optim_bits=32), updated by
      // one kernel per tensor without temporaries (CUDA kernel; the CPU backend's custom op)
      s.state_bytes = mul(4, n);
      break;
    case Optimizer::Adafactor: set_adafactor_states(r, d, sb, s); return;
  }
  s.flat_state_bytes = s.state_bytes;  // an element-wise optimizer's states do not depend on shapes
}

}  // namespace

ModelStates model_states(const Request& r, MixedMode mixed) {
  ModelStates s;
  s.mixed = mixed;
  s.tied_embeddings = r.model.tied_embeddings;
  const StateDtypes d = state_dtypes(r, mixed);
  add_layers_states(r, d, s);
  add_outer_states(r, d, s);
  set_optimizer_states(r, d, mixed, s);
  return s;
}

}  // namespace memfit::detail
