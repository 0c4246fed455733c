// memfit: what the user asks — a model plus a training or serving setup on some GPUs.
//
// The JSON request schema (the CLI, the wasm module and the page all speak it) maps 1:1 onto
// Request. Every field but the model is optional; `default_request()` holds the defaults,
// which follow what Hugging Face Transformers / PyTorch do when the user says nothing.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "memfit/checked.hpp"
#include "memfit/model.hpp"

namespace memfit {

enum class Task { Full, Lora, Qlora, Inference, Serve };
/// fp32: everything fp32. amp_*: fp32 master weights, autocast compute. bf16/fp16: pure half.
enum class Precision { Fp32, AmpBf16, AmpFp16, Bf16, Fp16 };
/// Nf4 / Nf4Double / Fp4: bitsandbytes 4-bit (Double: quantized absmax constants). Int8:
/// bitsandbytes LLM.int8(). GptqInt4 / AwqInt4: pre-quantized checkpoints (PEFT trains LoRA on them).
/// Fp8 / Mxfp4 / Nvfp4: serving checkpoints (inference and serve tasks).
enum class Quantization { None, Int8, Nf4, Nf4Double, Fp4, GptqInt4, AwqInt4, Fp8, Mxfp4, Nvfp4 };
enum class Optimizer {
  AdamW,           ///< torch.optim.AdamW, foreach implementation (PyTorch's default on CUDA)
  AdamWFused,      ///< torch.optim.AdamW(fused=True): no step temporaries
  AdamWLoop,       ///< per-tensor loop (foreach=False, or transformers' old AdamW "adamw_hf")
  AdamW8bit,       ///< bitsandbytes AdamW8bit (blockwise 8-bit states)
  PagedAdamW8bit,  ///< bitsandbytes PagedAdamW8bit: states in CUDA unified memory
  PagedAdamW,      ///< bitsandbytes PagedAdamW (32-bit states in unified memory)
  Sgd,
  SgdMomentum,
  Adafactor,       ///< transformers Adafactor defaults (factored second moment, no first moment)
  Lion,            ///< one momentum state
};
/// The training framework: it decides defaults (load dtype, LoRA targets and dropout, loss,
/// checkpointing) through the table in frameworks.cpp. "hf" is an alias of Transformers.
enum class Framework { Transformers, Trl, Torchtune, Litgpt, Axolotl, LlamaFactory, Swift, Unsloth };
/// Where the workload runs: CUDA (what users plan for) or CPU (the validator's exact
/// accounting, where some kernels keep other tensors).
enum class Device { Cuda, Cpu };

enum class ParallelMethod {
  Single, Ddp, Zero1, Zero2, Zero3, FsdpFullShard, FsdpShardGradOp, FsdpHybrid, Tp, Pp
};

struct LoraSetup {
  u64 rank = 16;
  double alpha = 32;
  /// Module names. Default: the framework's (PEFT: its per-model_type mapping; see frameworks.cpp).
  std::vector<std::string> targets = {"q_proj", "v_proj"};
  bool all_linear = false;     ///< "all-linear": every Linear in the decoder layers
  /// lora_dropout: with p > 0 every adapted Linear keeps its own dropped copy of its input for
  /// backward. Default: the framework's (PEFT LoraConfig: 0.0).
  double dropout = 0;
  /// Adapter weight dtype: PEFT upcasts adapters to fp32 (autocast_adapter_dtype=True);
  /// torchtune keeps them in the model dtype. 0 = follow the precision (PEFT behaviour).
  u64 adapter_bytes = 0;
};

struct InferenceSetup {
  u64 batch_size = 1;
  u64 context_length = 4096;   ///< prompt + generated tokens the KV cache must hold
  u64 new_tokens = 0;          ///< generated tokens: the prompt (prefilled at once) is context_length - new_tokens
  u64 kv_cache_bits = 16;      ///< 16 (bf16/fp16), 8 (fp8/int8), 32
  bool expanded_mla_cache = false;  ///< Transformers caches per-head K/V for MLA; serving engines cache the latent
  bool full_prompt_logits = false;  ///< prefill computes logits for every prompt token (no logits_to_keep)
};

/// task "serve": a serving engine (vLLM, SGLang) sizing its KV cache at start-up. Field names
/// and defaults are the engines' own (see serving.hpp); 0 / "" = the engine version's default.
struct ServingSetup {
  std::string engine = "vllm";           ///< "vllm" | "sglang"
  std::string engine_version;            ///< e.g. "0.10.1"; "" = the newest version memfit models
  double gpu_memory_utilization = 0;     ///< vLLM; 0 = the version's default (0.9 / 0.92)
  double mem_fraction_static = 0;        ///< SGLang; 0 = its default (by TP size or GPU size)
  u64 max_model_len = 0;                 ///< 0 = the model's max_position_embeddings (vLLM) / context_length (SGLang)
  u64 max_num_seqs = 0;                  ///< vLLM; SGLang: max_running_requests
  u64 max_num_batched_tokens = 0;        ///< vLLM: tokens of the profile run
  u64 chunked_prefill_size = 0;          ///< SGLang
  u64 max_total_tokens = 0;              ///< SGLang: cap on the KV pool (0 = none)
  u64 block_size = 0;                    ///< vLLM: tokens per KV block (16); SGLang page_size (1)
  u64 kv_cache_bits = 0;                 ///< kv_cache_dtype: 0 = "auto" (the model dtype), 8 = fp8
  bool enforce_eager = false;            ///< vLLM: no CUDA graphs (SGLang: disable_cuda_graph)
  u64 tensor_parallel_size = 1;
  u64 pipeline_parallel_size = 1;
  u64 data_parallel_size = 1;
  bool enable_expert_parallel = false;   ///< MoE experts split over tp x dp ranks instead of TP-sharded
  bool llm_class = false;                ///< vLLM usage context: offline LLM(...) instead of `vllm serve`
};

struct GpuSetup {
  std::string name;            ///< catalog name, or "custom"
  u64 memory_bytes = 0;        ///< total device memory
};

struct Parallelism {
  ParallelMethod method = ParallelMethod::Single;
  u64 dp = 1, tp = 1, pp = 1, cp = 1;
  bool sequence_parallel = false;
  bool offload_optimizer = false;
  bool offload_params = false;
  u64 gpus_per_node = 8;
  bool gradient_as_bucket_view = false;  ///< DDP: gradients live in the buckets (no second copy)
  bool gpipe = false;                    ///< pipeline schedule GPipe (all micro-batches in flight) instead of 1F1B
  /// FSDP: the embedding and the output projection are units of their own, gathered one at a time
  /// (torchtune's custom_sharded_layers: ['tok_embeddings', 'output']); otherwise they sit in the root unit
  bool separate_embedding_units = false;
  /// FSDP1 with use_orig_params=True and one unit per decoder layer: the frozen base weights share
  /// a flat parameter with the layer's adapters, so backward fills a gradient for every weight of
  /// each unit that holds an adapter (LitGPT <= 0.5.7 FSDPStrategy(auto_wrap_policy={Block})).
  /// Default: the framework's (frameworks.cpp).
  bool frozen_in_trained_units = false;
  /// Gradient-accumulation micro-batches skip FSDP's reduce-scatter (no_sync()): every GPU keeps
  /// the unsharded gradients until the synchronising micro-batch (Lightning Fabric's
  /// no_backward_sync, which LitGPT's loops use). Default: the framework's.
  bool unsharded_grad_accumulation = false;
};

struct Runtime {
  /// CUDA context + loaded kernels, outside PyTorch's allocator. 0 = from the GPU's generation.
  u64 cuda_context_bytes = 0;
  /// True: the Hugging Face Trainer drops the model outputs (logits) before backward.
  /// False: a user loop that keeps `outputs` alive through backward.
  bool drop_outputs_before_backward = true;
  /// Only the first step reaches sequence_length; later micro-batches are shorter (lit-gpt's 2023
  /// finetune scripts force the longest sample into the first micro-batch only). A loop that keeps
  /// its outputs then never holds the previous step's graph next to a step as long as the first.
  bool later_steps_shorter = false;
  bool use_cache_in_training = false;  ///< model forward with use_cache=True while training
  /// zero_grad(set_to_none=True) (PyTorch >= 2.0 default): gradients do not exist during the
  /// forward. False: zeroed gradients stay allocated across steps (PyTorch 1.x default).
  bool zero_grad_to_none = true;
  /// Who runs the step (Transformers Trainer + PEFT by default): see frameworks.cpp.
  Framework framework = Framework::Transformers;
  /// The framework's version; "" = the version memfit's table was read from (reported back).
  std::string framework_version;
  /// PEFT prepare_model_for_kbit_training: the non-quantized parameters (norms, embeddings,
  /// head) are upcast to fp32, inputs get requires_grad and gradient checkpointing is switched
  /// on. Default: true for QLoRA under frameworks that call it (Transformers/TRL recipes).
  bool prepare_kbit = false;
  /// The bitsandbytes release (MAJOR.MINOR[.PATCH]): what its quantized Linears keep in their
  /// autograd contexts changed across releases (bitsandbytes.cpp). "" = the release memfit's
  /// CPU suite runs (reported back).
  std::string bitsandbytes_version;
  u64 loss_chunks = 0;                 ///< chunked cross-entropy (torchtune CEWithChunkedOutputLoss: 8)
  bool optimizer_in_backward = false;  ///< each parameter is stepped and its gradient freed during backward
  bool activation_offloading = false;  ///< saved activations are moved to CPU memory during forward
  /// torch.compile (Inductor): pointwise chains fuse and the partitioner recomputes cheap
  /// intermediates in backward instead of keeping them (norm internals, MLP activations, the
  /// loss's log-softmax).
  bool compile = false;
  /// PYTORCH_CUDA_ALLOC_CONF of the run ("expandable_segments:True", ...): the caching-allocator
  /// options the reserved-memory simulation follows. "" = PyTorch's defaults.
  std::string alloc_conf;
};

struct Request {
  std::string model_id;        ///< bundled-library id, or "" for an inline config
  ModelSpec model;
  Task task = Task::Full;
  LoraSetup lora;
  Precision precision = Precision::AmpBf16;
  Quantization quantization = Quantization::None;
  Optimizer optimizer = Optimizer::AdamW;
  u64 micro_batch_size = 4;
  u64 sequence_length = 2048;
  u64 gradient_accumulation_steps = 1;
  bool gradient_checkpointing = false;
  u64 frozen_layers = 0;       ///< full fine-tuning: the embeddings and the first N decoder layers are frozen
  AttentionImpl attention = AttentionImpl::Sdpa;  ///< resolved: "auto" never reaches the estimator
  InferenceSetup inference;
  ServingSetup serving;
  GpuSetup gpu;
  u64 num_gpus = 1;
  u64 headroom_permille = 50;  ///< planner: memory kept free on every GPU (cluster.headroom, default 0.05)
  Parallelism parallelism;
  Runtime runtime;
  Device device = Device::Cuda;
  /// What the user should act on or weigh before trusting "fits": emulated kernels, a context past
  /// the model's positions, figures not measured, a default the framework would reject.
  std::vector<std::string> warnings;
  std::vector<std::string> notes;  ///< what the request resolved to (framework defaults), for the record
};

/// Parses a request object. `config_for_id` resolves {"model": {"id": ...}} to a config.json
/// (the bundled library); it returns false for unknown ids. Throws Error naming the field.
using ConfigLookup = bool (*)(const std::string& id, nlohmann::json& config);
[[nodiscard]] Request parse_request(const nlohmann::json& request, ConfigLookup config_for_id);

/// The accepted values of every enumerated request field, from the tables the parser uses.
[[nodiscard]] nlohmann::json request_options();

/// What each precision value means, in the words of the frameworks' own switches.
[[nodiscard]] nlohmann::json precision_meanings();

/// The request as JSON, every default filled in (what the page shows and the URL stores).
[[nodiscard]] nlohmann::json request_to_json(const Request& r);

/// What to weigh before trusting a figure for `r`: the model's warnings, then the request's.
[[nodiscard]] std::vector<std::string> warnings_of(const Request& r);

[[nodiscard]] const char* to_string(Task t);
[[nodiscard]] const char* to_string(Precision p);
[[nodiscard]] const char* to_string(Quantization q);
[[nodiscard]] const char* to_string(Optimizer o);
[[nodiscard]] const char* to_string(AttentionImpl a);
[[nodiscard]] const char* to_string(ParallelMethod m);
[[nodiscard]] const char* to_string(Framework f);

}  // namespace memfit
