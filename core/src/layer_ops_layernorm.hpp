// The tensor lists of the LayerNorm families (GPT-NeoX, ...): a LayerNorm (native_layer_norm
// saves its input, mean and rstd), an ungated MLP (fc1 -> activation -> fc2), biases, fused
// q/k/v projections, partial rotary embeddings and parallel attention + MLP blocks, written as
// edits of the same entries layer_ops.hpp defines. schedule.cpp's family table picks them.
#pragma once

#include "layer_ops.hpp"
#include "schedule.hpp"

namespace memfit::sched {

/// GPT-NeoX (modeling_gpt_neox.py): fused query_key_value, partial rotary, parallel residual.
extern const FamilyLists kGptNeoxLists;
/// Falcon (modeling_falcon.py), new_decoder_architecture: fused query_key_value with GQA
/// broadcast to every head, full rotary, two norms in parallel, no biases.
extern const FamilyLists kFalconLists;
/// Phi (modeling_phi.py): separate q/k/v with biases, partial rotary, one norm read by the
/// parallel attention and MLP, gelu_new, residual dropout.
extern const FamilyLists kPhiLists;
/// Starcoder2 (modeling_starcoder2.py): the Llama layer with LayerNorms, biases, gelu MLP.
extern const FamilyLists kStarcoder2Lists;
/// StableLM (modeling_stablelm.py): the Llama layer with LayerNorms and partial rotary.
extern const FamilyLists kStableLmLists;
/// OPT (modeling_opt.py): pre-norm, q scaled, learned positions, relu MLP, dropout.
extern const FamilyLists kOptLists;
/// GPT-2 (modeling_gpt2.py): fused c_attn, learned positions, gelu_new, attention / residual /
/// embedding dropout (SDPA with dropout runs the math path on CPU).
extern const FamilyLists kGpt2Lists;
/// GPTBigCode (modeling_gpt_bigcode.py): GPT-2 with multi-query attention and F.gelu.
extern const FamilyLists kGptBigCodeLists;
/// BLOOM (modeling_bloom.py): alibi, fused query_key_value, embedding layer norm, bloom_gelu.
extern const FamilyLists kBloomLists;
/// BioGPT (modeling_biogpt.py): OPT-like pre-norm layers with gelu, scaled embeddings, dropout.
extern const FamilyLists kBioGptLists;
/// GPT-Neo (modeling_gpt_neo.py): eager attention in fp32, local / global layers, gelu_new.
extern const FamilyLists kGptNeoLists;
/// GPT-J (modeling_gptj.py): parallel block, interleaved partial rotary, eager attention in fp32.
extern const FamilyLists kGptjLists;
/// CodeGen (modeling_codegen.py): GPT-J's block with a fused qkv_proj split in 4 groups and fp32
/// rotary tables.
extern const FamilyLists kCodeGenLists;

/// The family fields of a LayerNorm family's setup, from the request: the parameter tensors
/// (ModelSpec's Linears and norms, LoRA adapters on every Linear), the fused q/k/v and rotary
/// widths, the activation and the dropouts.
void complete_layernorm_setup(const Request& r, StepSetup& s);
/// Falcon: K is broadcast to every query head before the rotary embedding.
void complete_falcon_setup(const Request& r, StepSetup& s);
/// GPT-J: the rotary sin / cos table has max_positions rows.
void complete_gptj_setup(const Request& r, StepSetup& s);
/// CodeGen: whether _split_heads copies q, k and v (more than one head per group of 4).
void complete_codegen_setup(const Request& r, StepSetup& s);

/// The edits, exposed for tests.
void edit_layernorm_lora(OpList& l, bool half);
void edit_layernorm_input_needs_no_grad(OpList& l);

}  // namespace memfit::sched
