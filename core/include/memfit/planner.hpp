// memfit: the planner — on N GPUs of a kind, which distributed methods fit, with what largest
// micro-batch, and which trains fastest.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "memfit/estimate.hpp"
#include "memfit/request.hpp"

namespace memfit {

/// One layout of the cluster and its best micro-batch.
struct PlanCandidate {
  std::string label;            ///< e.g. "zero3", "fsdp_full_shard + cpu offload", "tp 4 x dp 2"
  Parallelism parallelism;      ///< method and degrees (dp/tp/pp resolved)
  u64 max_micro_batch = 0;      ///< largest micro-batch that fits (0: not even 1)
  Estimate at_max;              ///< the estimate at max_micro_batch (at 1 when nothing fits)
  double step_time_s = 0;       ///< one optimizer step at max_micro_batch (0 when nothing fits)
  double tokens_per_s = 0;
  double compute_s = 0, communication_s = 0, offload_s = 0;  ///< parts of step_time_s
  std::vector<u64> grid_device_bytes;  ///< device total per micro-batch of Plan::grid_batches
};

/// A layout the core could not estimate for this model (e.g. a degree the model cannot split into).
struct SkippedLayout {
  std::string label;
  std::string error;  ///< the core's message
};

/// One change to the request, on its own, and what it does to the closest layout.
enum class Change { Checkpointing, Lora, Qlora, SequenceLength, NumGpus };
struct Suggestion {
  Change change = Change::Checkpointing;
  u64 value = 0;           ///< the new sequence length or GPU count (SequenceLength, NumGpus)
  std::string text;        ///< the change in words, e.g. "16 GPUs instead of 8"
  std::string layout;      ///< the layout closest to fitting after the change
  u64 per_gpu_bytes = 0;   ///< its device total at micro-batch 1
  bool fits = false;       ///< within the planner's budget
};

/// When no layout fits micro-batch 1: the one closest to fitting, by how much it misses, and
/// the single changes that would make something fit (never one the request already has).
struct NothingFits {
  size_t closest = 0;      ///< index into Plan::candidates
  u64 missing_bytes = 0;   ///< its device total minus the budget
  std::vector<Suggestion> suggestions;  ///< fitting ones first
};

struct Plan {
  std::vector<PlanCandidate> candidates;  ///< fitting ones first, fastest first
  std::vector<SkippedLayout> skipped;     ///< layouts that do not apply to this model, with why
  u64 budget_bytes = 0;                   ///< GPU memory a layout may use (capacity less the headroom)
  std::optional<NothingFits> nothing_fits;
  std::vector<u64> grid_batches;          ///< micro-batches of the grid columns
  int recommended = -1;                   ///< index into candidates (-1: nothing fits)
  std::string recommendation;             ///< the choice and why, in a sentence
  std::string llmem_choice;               ///< what LLMem's selection rule (Algorithm 1) would pick
  double mfu = 0;                         ///< model-FLOPs utilisation assumed for compute time
};

/// Enumerates the valid layouts for r.num_gpus GPUs of r.gpu (nodes of gpus_per_node), finds
/// each one's largest micro-batch by a monotone search, estimates the step time, and ranks.
/// An error every layout hits (e.g. LoRA targets that match no layer) is thrown, not reported as
/// "nothing fits"; an error only some layouts hit is listed in Plan::skipped.
[[nodiscard]] Plan plan(const Request& r);

}  // namespace memfit
