// The planner: enumerate layouts, search the largest micro-batch of each, estimate step time.
//
// Step time = compute + exposed communication + offload traffic, per optimizer step:
//  - compute: training FLOPs per token 6 x N_active for full fine-tuning (forward 2N, backward
//    4N; Kaplan et al. 2020 / Narayanan et al. 2021) plus causal attention 6 x L x s x d_attn;
//    LoRA skips weight gradients (4 x N); activation checkpointing re-runs the forward (+2 x N).
//    Divided over the GPUs at a model-FLOPs utilisation of the GPU's dense half-precision peak
//    that grows with the tokens of one micro-batch per GPU (small matrix multiplications leave
//    the tensor cores idle): kMfu x T / (T + kHalfSaturationTokens), and stretched by the
//    pipeline bubble (pp - 1) / micro-batches.
//  - communication (ring collectives move 2 (n-1)/n of the buffer per GPU for all-reduce,
//    (n-1)/n for all-gather / reduce-scatter): DDP / ZeRO-1/2 all-reduce the half gradients;
//    ZeRO-3 / FSDP all-gather parameters in forward and backward and reduce-scatter gradients;
//    tensor parallelism all-reduces [b, s, h] activations 4 times per layer (2 forward, 2
//    backward). Data-parallel traffic overlaps with backward (kOverlap); TP traffic does not.
//    Links: NVLink/xGMI inside a node, the NIC between nodes (gpu catalog).
//  - offload: optimizer states on the CPU move gradients down and parameters up over PCIe each
//    step, and CPU Adam updates kCpuAdamParamsPerS parameters per second per rank.
#include "memfit/planner.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "memfit/error.hpp"
#include "memfit/gpus.hpp"
#include "parallel.hpp"

namespace memfit {

namespace {

constexpr double kMfu = 0.45;
constexpr double kHalfSaturationTokens = 1024;
constexpr double kOverlap = 0.5;
constexpr double kCpuAdamParamsPerS = 1.0e9;
constexpr u64 kMaxMicroBatch = 1 << 14;

struct LayoutSpec {
  std::string label;
  Parallelism p;
};

std::vector<LayoutSpec> layouts(const Request& r) {
  std::vector<LayoutSpec> out;
  const u64 n = r.num_gpus;
  const u64 node = std::max<u64>(1, r.parallelism.gpus_per_node);
  auto add_layout = [&](std::string label, ParallelMethod m, u64 tp, u64 pp, bool off_opt, bool off_params) {
    Parallelism p = r.parallelism;
    p.method = m;
    p.tp = tp;
    p.pp = pp;
    p.cp = 1;
    p.dp = n / (tp * pp);
    p.offload_optimizer = off_opt;
    p.offload_params = off_params;
    p.sequence_parallel = tp > 1;
    out.push_back({std::move(label), p});
  };
  if (n == 1) {
    add_layout("single GPU", ParallelMethod::Single, 1, 1, false, false);
    add_layout("zero2 + cpu optimizer offload", ParallelMethod::Zero2, 1, 1, true, false);
    add_layout("zero3 + cpu offload (optimizer and parameters)", ParallelMethod::Zero3, 1, 1, true, true);
    return out;
  }
  add_layout("ddp", ParallelMethod::Ddp, 1, 1, false, false);
  add_layout("zero1", ParallelMethod::Zero1, 1, 1, false, false);
  add_layout("zero2", ParallelMethod::Zero2, 1, 1, false, false);
  add_layout("zero3", ParallelMethod::Zero3, 1, 1, false, false);
  add_layout("fsdp_full_shard", ParallelMethod::FsdpFullShard, 1, 1, false, false);
  add_layout("fsdp_shard_grad_op", ParallelMethod::FsdpShardGradOp, 1, 1, false, false);
  if (n > node) add_layout("fsdp_hybrid", ParallelMethod::FsdpHybrid, 1, 1, false, false);
  add_layout("zero2 + cpu optimizer offload", ParallelMethod::Zero2, 1, 1, true, false);
  add_layout("zero3 + cpu offload (optimizer and parameters)", ParallelMethod::Zero3, 1, 1, true, true);
  add_layout("fsdp_full_shard + cpu offload", ParallelMethod::FsdpFullShard, 1, 1, true, true);
  // bitsandbytes-quantized weights run with data parallelism (DDP, FSDP-QLoRA, ZeRO-3) but not
  // with Megatron-style tensor or pipeline parallelism: no TP/PP layouts for QLoRA.
  if (r.task == Task::Qlora) return out;
  for (u64 tp = 2; tp <= std::min(n, node); tp *= 2) {
    if (n % tp != 0 || !detail::whole_heads(r.model, tp)) continue;
    const u64 dp = n / tp;
    add_layout(dp > 1 ? "tp " + std::to_string(tp) + " x dp " + std::to_string(dp) : "tp " + std::to_string(tp),
               ParallelMethod::Tp, tp, 1, false, false);
    if (dp > 1) add_layout("fsdp_full_shard x tp " + std::to_string(tp), ParallelMethod::FsdpFullShard, tp, 1, false, false);
  }
  for (u64 pp = 2; pp <= n && pp <= r.model.layers; pp *= 2) {
    if (n % pp != 0) continue;
    const u64 rest = n / pp;
    add_layout(rest > 1 ? "pp " + std::to_string(pp) + " x dp " + std::to_string(rest) : "pp " + std::to_string(pp),
               ParallelMethod::Pp, 1, pp, false, false);
    if (rest > 1 && rest <= node && rest % 2 == 0 && detail::whole_heads(r.model, rest))
      add_layout("tp " + std::to_string(rest) + " x pp " + std::to_string(pp), ParallelMethod::Tp, rest, pp, false, false);
  }
  return out;
}

struct StepTime {
  double compute = 0, comm = 0, offload = 0;
  [[nodiscard]] double total() const { return compute + comm + offload; }
};

StepTime step_time(const Request& r, const Parallelism& p, const ParamCounts& pc, u64 trainable_params, u64 micro) {
  const GpuSpec* gpu = find_gpu(r.gpu.name);
  const double tflops = gpu ? gpu->bf16_tflops : 100.0;
  const double intra = (gpu ? gpu->intra_node_gbs : 32.0) * 1e9;
  const double inter = (gpu ? gpu->inter_node_gbs : 12.5) * 1e9;
  const double host = (gpu ? gpu->host_link_gbs : 16.0) * 1e9;
  const ModelSpec& m = r.model;
  const double seq = static_cast<double>(r.sequence_length);
  const double ga = static_cast<double>(r.gradient_accumulation_steps);
  const double dp = static_cast<double>(p.dp), tp = static_cast<double>(p.tp), pp = static_cast<double>(p.pp);
  const double tokens_per_rank = static_cast<double>(micro) * seq * ga;
  const double n_active = static_cast<double>(pc.active_per_token) - static_cast<double>(m.embedding_params);
  const double attn = 6.0 * static_cast<double>(m.layers) * seq * static_cast<double>(m.heads * m.head_dim);
  const bool lora = r.task == Task::Lora || r.task == Task::Qlora;
  double per_token = (lora ? 4.0 : 6.0) * n_active + attn;
  if (r.gradient_checkpointing) per_token += 2.0 * n_active + attn / 3.0;
  const double bubble = 1.0 + (pp - 1.0) / std::max(1.0, ga);
  StepTime t;
  const double micro_tokens = static_cast<double>(micro) * seq;
  const double mfu = kMfu * micro_tokens / (micro_tokens + kHalfSaturationTokens);
  t.compute = per_token * tokens_per_rank / (tp * pp) / (tflops * 1e12 * mfu) * bubble;

  const double node = static_cast<double>(std::max<u64>(1, p.gpus_per_node));
  const double dp_bw = dp * tp * pp > node ? inter : intra;
  const double trainable = static_cast<double>(trainable_params);
  const double grad_bytes = 2.0 * trainable / (tp * pp);
  const double param_bytes = 2.0 * static_cast<double>(pc.total) / (tp * pp);
  double dp_traffic = 0;
  if (dp > 1) {
    const double ring = (dp - 1.0) / dp;
    switch (p.method) {
      case ParallelMethod::Zero3:
      case ParallelMethod::FsdpFullShard:
      case ParallelMethod::FsdpHybrid: dp_traffic = ring * (2.0 * param_bytes * ga + grad_bytes); break;
      case ParallelMethod::FsdpShardGradOp: dp_traffic = ring * (param_bytes + grad_bytes); break;
      default: dp_traffic = 2.0 * ring * grad_bytes;
    }
  }
  double tp_traffic = 0;
  if (tp > 1)
    tp_traffic = 4.0 * static_cast<double>(m.layers) / pp * 2.0 * (tp - 1.0) / tp * static_cast<double>(micro) * seq *
                 static_cast<double>(m.hidden) * 2.0 * ga;
  t.comm = dp_traffic / dp_bw * (1.0 - kOverlap) + tp_traffic / intra;
  if (p.offload_optimizer) {
    const double local = trainable / (dp * tp * pp);
    t.offload = (2.0 * local + 2.0 * local) / host + local / kCpuAdamParamsPerS;
  }
  if (p.offload_params) t.offload += 2.0 * param_bytes / dp * ga / host * 2.0;
  return t;
}

std::string gib(u64 bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / 1073741824.0);
  return buf;
}

std::string fixed(double x, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

/// GPU memory one layout may use: the capacity less the planner's headroom (allocator spikes,
/// other processes).
u64 budget(const Request& r) { return r.gpu.memory_bytes - detail::scale(r.gpu.memory_bytes, r.headroom_permille, 1000); }

/// The layout of `r` with the smallest device total at micro-batch 1; bytes 0 when every layout
/// fails to estimate.
struct Closest {
  std::string label;
  u64 bytes = 0;
};
Closest closest_at_one(Request r) {
  Closest best;
  r.micro_batch_size = 1;
  for (const LayoutSpec& ls : layouts(r)) {
    r.parallelism = ls.p;
    try {
      const u64 bytes = estimate(r).device_total_bytes;
      if (best.bytes == 0 || bytes < best.bytes) best = {ls.label, bytes};
    } catch (const Error&) {
      // a layout that does not apply to the changed request is no answer
    }
  }
  return best;
}

std::optional<Suggestion> try_change(Change change, u64 value, std::string text, const Request& changed) {
  const Closest c = closest_at_one(changed);
  if (c.bytes == 0) return std::nullopt;
  return Suggestion{change, value, std::move(text), c.label, c.bytes, c.bytes <= budget(changed)};
}

/// Halves (sequence length) or doubles (GPU count) until something fits: the first value that
/// fits. When none does, the first value that gets closest, and only if it gets closer than the
/// request itself: more GPUs do not shrink a replicated model, and "4096 GPUs, still too big"
/// helps nobody.
template <class Apply>
std::optional<Suggestion> search_change(Change change, u64 from, bool halve, u64 limit, const Request& r, Apply apply) {
  std::optional<Suggestion> best;
  for (u64 v = halve ? from / 2 : from * 2; halve ? v >= limit : v <= limit; v = halve ? v / 2 : v * 2) {
    Request changed = r;
    apply(changed, v);
    const std::string text = change == Change::SequenceLength
                                 ? "sequence length " + std::to_string(v) + " instead of " + std::to_string(from)
                                 : std::to_string(v) + " GPUs instead of " + std::to_string(from);
    if (auto s = try_change(change, v, text, changed)) {
      if (s->fits) return s;
      if (!best || s->per_gpu_bytes < best->per_gpu_bytes) best = s;
    }
  }
  const Closest now = closest_at_one(r);
  if (best && now.bytes != 0 && best->per_gpu_bytes >= now.bytes) return std::nullopt;
  return best;
}

/// The single changes worth trying when nothing fits, skipping what the request already does.
/// CPU offload is not among them: the plan's offload layouts already try it.
std::vector<Suggestion> suggestions(const Request& r) {
  std::vector<std::optional<Suggestion>> found;
  if (!r.gradient_checkpointing) {
    Request c = r;
    c.gradient_checkpointing = true;
    found.push_back(try_change(Change::Checkpointing, 0, "turn on activation checkpointing", c));
  }
  if (r.task == Task::Full) {
    Request c = r;
    c.task = Task::Lora;
    found.push_back(try_change(Change::Lora, 0, "train LoRA adapters instead of every weight", c));
  }
  if (r.task == Task::Full || r.task == Task::Lora) {
    Request c = r;
    c.task = Task::Qlora;
    c.quantization = Quantization::Nf4;
    found.push_back(try_change(Change::Qlora, 0, "QLoRA: LoRA adapters over 4-bit (NF4) base weights", c));
  }
  found.push_back(search_change(Change::SequenceLength, r.sequence_length, true, 128, r,
                                [](Request& c, u64 v) { c.sequence_length = v; }));
  found.push_back(search_change(Change::NumGpus, r.num_gpus, false, std::max<u64>(r.num_gpus, 1) * 1024, r,
                                [](Request& c, u64 v) { c.num_gpus = v; }));
  std::vector<Suggestion> out;
  for (auto& s : found)
    if (s) out.push_back(std::move(*s));
  std::stable_partition(out.begin(), out.end(), [](const Suggestion& s) { return s.fits; });
  return out;
}

/// Which layout misses by least, by how much, and what would make something fit.
NothingFits nothing_fits(const Plan& p, const Request& r) {
  NothingFits nf;
  for (size_t i = 1; i < p.candidates.size(); ++i)
    if (p.candidates[i].at_max.device_total_bytes < p.candidates[nf.closest].at_max.device_total_bytes) nf.closest = i;
  nf.missing_bytes = p.candidates[nf.closest].at_max.device_total_bytes - p.budget_bytes;
  nf.suggestions = suggestions(r);
  return nf;
}

std::string nothing_fits_text(const Plan& p, const NothingFits& nf) {
  const PlanCandidate& c = p.candidates[nf.closest];
  std::string text = "nothing fits at micro-batch 1: the closest layout, " + c.label + ", needs " +
                     gib(c.at_max.device_total_bytes) + " per GPU, " + gib(nf.missing_bytes) + " over the " +
                     gib(p.budget_bytes) + " budget";
  std::string fixes;
  for (const Suggestion& s : nf.suggestions)
    if (s.fits) fixes += (fixes.empty() ? "" : "; ") + s.text + " (" + s.layout + ", " + gib(s.per_gpu_bytes) + ")";
  return text + (fixes.empty() ? "; no single change fits: combine them, or use GPUs with more memory"
                               : "; any one of these fits: " + fixes);
}

/// The largest micro-batch of `r` (its layout set) that fits `budget`, its estimate, and the
/// device total at each grid micro-batch, into c. Throws the core's Error for a layout that does
/// not apply to the model.
void search_micro_batch(Request r, u64 budget, const std::vector<u64>& grid_batches, PlanCandidate& c) {
  // Each micro-batch is estimated once: the search's powers of two are also grid columns.
  std::map<u64, Estimate> memo;
  auto at = [&](u64 micro) -> const Estimate& {
    auto it = memo.find(micro);
    if (it != memo.end()) return it->second;
    r.micro_batch_size = micro;
    return memo.emplace(micro, estimate(r)).first->second;
  };
  const u64 mem = budget;
  auto fits = [&](u64 micro) { return at(micro).device_total_bytes <= mem; };
  // largest fitting micro-batch: memory grows monotonically with the micro-batch
  u64 lo = 0, hi = 1;
  while (hi <= kMaxMicroBatch && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  if (hi > kMaxMicroBatch) hi = kMaxMicroBatch + 1;
  while (lo > 0 && hi - lo > 1) {
    const u64 mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  c.max_micro_batch = lo;
  c.at_max = at(std::max<u64>(1, lo));
  for (u64 b : grid_batches) c.grid_device_bytes.push_back(at(b).device_total_bytes);
}

/// Step time (compute, communication, offload) and throughput of a candidate at its largest
/// micro-batch.
void time_candidate(const Request& base, const ParamCounts& pc, PlanCandidate& c) {
  const Parallelism& p = c.parallelism;
  const StepTime t = step_time(base, p, pc, c.at_max.trainable_params, c.max_micro_batch);
  c.compute_s = t.compute;
  c.communication_s = t.comm;
  c.offload_s = t.offload;
  c.step_time_s = t.total();
  const double tokens = static_cast<double>(c.max_micro_batch) * static_cast<double>(base.sequence_length) *
                        static_cast<double>(p.dp) * static_cast<double>(base.gradient_accumulation_steps);
  c.tokens_per_s = c.step_time_s > 0 ? tokens / c.step_time_s : 0;
}

/// Share of its GPU's memory a candidate uses at its largest micro-batch.
double memory_used(const PlanCandidate& c) {
  return static_cast<double>(c.at_max.device_total_bytes) / static_cast<double>(std::max<u64>(1, c.at_max.gpu_memory_bytes));
}

/// Index of the recommended candidate; candidates are ranked and the first one fits.
size_t pick_recommended(const std::vector<PlanCandidate>& candidates) {
  // The fastest layout, unless one within 3 % of its throughput leaves more memory free.
  size_t pick = 0;
  const double fastest = candidates.front().tokens_per_s;
  for (size_t i = 1; i < candidates.size(); ++i) {
    const PlanCandidate& c = candidates[i];
    if (c.max_micro_batch == 0 || c.tokens_per_s < 0.97 * fastest) break;
    if (memory_used(c) < memory_used(candidates[pick]) - 0.05) pick = i;
  }
  return pick;
}

/// Why `best` (at index `pick`) is recommended over `next`, the runner-up or the faster layout
/// passed over.
std::string reason_over(const PlanCandidate& best, const PlanCandidate& next, size_t pick) {
  if (pick != 0)
    return "it is within 3 % of the fastest and leaves more memory free (" + fixed(100 * (1 - memory_used(best)), 0) +
           " % vs " + fixed(100 * (1 - memory_used(next)), 0) + " %)";
  if (best.max_micro_batch > next.max_micro_batch)
    return "it fits a larger micro-batch (" + std::to_string(best.max_micro_batch) + " vs " +
           std::to_string(next.max_micro_batch) + ")";
  if (best.communication_s + best.offload_s < next.communication_s + next.offload_s)
    return "it moves less data per step (" + fixed(best.communication_s + best.offload_s, 3) + " s vs " +
           fixed(next.communication_s + next.offload_s, 3) + " s of communication/offload)";
  if (best.tokens_per_s == next.tokens_per_s) return "the two tie on compute and communication";
  return "its compute per GPU per step is lower";
}

/// The recommendation in a sentence: the choice, its throughput and memory, and how it compares
/// with the other layout worth naming.
std::string recommendation_text(const std::vector<PlanCandidate>& candidates, size_t pick) {
  const PlanCandidate& best = candidates[pick];
  std::string why = best.label + ", micro-batch " + std::to_string(best.max_micro_batch) + ": " +
                    fixed(best.tokens_per_s, 0) + " tokens/s, " + gib(best.at_max.device_total_bytes) + " of " +
                    gib(best.at_max.gpu_memory_bytes) + " per GPU";
  const size_t other = pick == 0 ? 1 : 0;  // the runner-up, or the faster layout passed over
  if (candidates.size() > 1 && candidates[other].max_micro_batch > 0) {
    const PlanCandidate& next = candidates[other];
    const double ratio = next.tokens_per_s > 0 ? best.tokens_per_s / next.tokens_per_s : 0;
    const std::string reason = reason_over(best, next, pick);
    why += "; " + fixed(ratio, 2) + "x the throughput of " + next.label + " at micro-batch " +
           std::to_string(next.max_micro_batch) + ": " + reason;
  }
  return why;
}

/// What LLMem's selection rule would pick among the candidates (Plan::llmem_choice).
std::string llmem_choice(const std::vector<PlanCandidate>& candidates, const Request& base) {
  // LLMem (Kim et al. 2024, Algorithm 1): eval = CDP: bs*gpus*1.5, ADP (ZeRO-3): bs*gpus,
  // TP: bs, DP+TP: bs*dp; pick the largest.
  double best_eval = 0;
  std::string choice;
  for (const PlanCandidate& c : candidates) {
    const ParallelMethod m = c.parallelism.method;
    double eval = 0;
    const double bs = static_cast<double>(c.max_micro_batch);
    if (c.parallelism.offload_optimizer || c.parallelism.pp > 1) continue;
    if (m == ParallelMethod::Ddp) eval = bs * static_cast<double>(base.num_gpus) * 1.5;
    else if (m == ParallelMethod::Zero3) eval = bs * static_cast<double>(base.num_gpus);
    else if (m == ParallelMethod::Tp) eval = c.parallelism.dp > 1 ? bs * static_cast<double>(c.parallelism.dp) : bs;
    else continue;
    if (eval > best_eval) {
      best_eval = eval;
      choice = c.label + " (micro-batch " + std::to_string(c.max_micro_batch) + ")";
    }
  }
  if (choice.empty()) choice = "none fits: LLMem recommends CPU offloading";
  return choice;
}

}  // namespace

Plan plan(const Request& base) {
  if (base.task == Task::Inference) throw Error("the planner sizes training; for serving layouts use task \"serve\" (vLLM / SGLang: TP x PP x replicas), for one generate() call `memfit estimate` (task \"inference\")");
  Plan out;
  out.mfu = kMfu;
  const ParamCounts pc = count_params(base.model);
  for (u64 b = 1; b <= 512; b *= 2) out.grid_batches.push_back(b);
  out.budget_bytes = budget(base);
  for (const LayoutSpec& ls : layouts(base)) {
    Request r = base;
    r.parallelism = ls.p;
    PlanCandidate c;
    c.label = ls.label;
    c.parallelism = ls.p;
    try {
      search_micro_batch(r, out.budget_bytes, out.grid_batches, c);
    } catch (const Error& e) {
      out.skipped.push_back({ls.label, e.what()});  // this layout does not apply to the model
      continue;
    }
    if (c.max_micro_batch > 0) time_candidate(base, pc, c);
    out.candidates.push_back(std::move(c));
  }
  // An error no layout escapes is the request's, not a fit: say it (e.g. LoRA targets that match
  // no layer of this model) rather than "nothing fits".
  if (out.candidates.empty() && !out.skipped.empty()) throw Error(out.skipped.front().error);
  std::stable_sort(out.candidates.begin(), out.candidates.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    if ((a.max_micro_batch > 0) != (b.max_micro_batch > 0)) return a.max_micro_batch > 0;
    return a.tokens_per_s > b.tokens_per_s;
  });
  if (!out.candidates.empty() && out.candidates.front().max_micro_batch > 0) {
    const size_t pick = pick_recommended(out.candidates);
    out.recommended = static_cast<int>(pick);
    out.recommendation = recommendation_text(out.candidates, pick);
  } else if (!out.candidates.empty()) {
    out.nothing_fits = nothing_fits(out, base);
    out.recommendation = nothing_fits_text(out, *out.nothing_fits);
  }
  out.llmem_choice = llmem_choice(out.candidates, base);
  return out;
}

}  // namespace memfit
