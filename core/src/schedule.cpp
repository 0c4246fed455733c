// The schedule pass over the tensor lists (see schedule.hpp). Sources of the step's order:
//  - torch/optim/adamw.py (_multi_tensor_adamw): state (exp_avg, exp_avg_sq) created as
//    zeros_like at the first step; the foreach path allocates one temporary per parameter
//    (_foreach_sqrt(exp_avg_sq)) and frees it when the step ends; fused=True allocates none.
//  - torch/optim/optimizer.py zero_grad(set_to_none=True): every gradient is freed.
//  - torch/utils/checkpoint.py: a checkpointed layer keeps only its input during the forward and
//    re-runs its forward right before its backward.
//  - autograd: a saved tensor is released once its op's backward has run; a parameter's
//    gradient is created by the first backward that reaches it and lives until zero_grad.
#include "schedule.hpp"

#include <algorithm>
#include <map>
#include <functional>
#include <span>

#include "layer_ops_layernorm.hpp"
#include "layer_ops_rms.hpp"
#include "memfit/model.hpp"

namespace memfit::sched {

namespace {

/// An allocation the pass makes besides the lists' own tensors, and the component it counts in.
struct EventKind {
  std::string_view name;
  Part part;
};
constexpr EventKind kParameter{"parameter", Part::Weights};
constexpr EventKind kInputIds{"input_ids", Part::Activations};  // the batch (labels: the same tensor)
constexpr EventKind kWorkspace{"workspace", Part::CublasWorkspace};
// A weight's new gradient is a temporary of its node until AccumulateGrad, which the engine runs
// right after the node returns, makes it the .grad (alive until zero_grad): backward() retags it then.
constexpr EventKind kWeightGrad{"weight_grad", Part::TemporaryBuffers};
constexpr EventKind kBiasGrad{"bias_grad", Part::TemporaryBuffers};
constexpr EventKind kWeightGradNew{"weight_grad_new", Part::TemporaryBuffers};  // a later micro-batch's, added into .grad
constexpr EventKind kBiasGradNew{"bias_grad_new", Part::TemporaryBuffers};
constexpr EventKind kDenseEmbedGrad{"embed.weight_grad", Part::TemporaryBuffers};  // a tied table's, summed with the head's
// that sum: the table's .grad in the first micro-batch (retagged), added into it in a later one
constexpr EventKind kTiedGrad{"tied_weight_grad", Part::TemporaryBuffers};
constexpr EventKind kOptimizerStep{"optimizer_step", Part::OptimizerStates};
constexpr EventKind kOptimizerState{"optimizer_state", Part::OptimizerStates};
constexpr EventKind kOptimizerTemp{"optimizer_temp", Part::TemporaryBuffers};

using Parts = std::array<u64, kParts>;
using PhasePeaks = std::array<u64, kPhases>;

/// The largest live bytes so far, its first moment's components and phase, and each phase's largest.
struct Best {
  u64 bytes = 0;
  Parts parts{};
  Phase phase = Phase::Forward;
  PhasePeaks phases{};
};

/// Receives allocations and frees; `repeat` runs a per-layer loop.
class Sink {
 public:
  /// `names`: record each allocation's name too (step_trace's callers that ask for them); `parts`:
  /// record each allocation's component and phase (trace_step_peak).
  Sink(bool record, bool round_512, bool names = false, bool parts = false)
      : record_(record), round_(round_512), names_on_(names), parts_on_(parts) {
    if (!record_) held_.reserve(1024);  // a few hundred allocations (one layer per loop): one allocation
  }

  /// `what` names the tensor in a recorded trace (the per-tensor comparison and debugging). The
  /// trace sink only records (the peak is the trace's reader's business).
  int alloc(u64 bytes, Part part, std::string_view what, std::string_view of = {}) {
    if (bytes == 0) return -1;
    if (names_on_) names_.push_back(of.empty() ? std::string(what) : std::string(what) + ":" + std::string(of));
    if (record_) {
      trace_.push_back(static_cast<std::int64_t>(bytes));
      if (parts_on_) trace_parts_.push_back(part), trace_phases_.push_back(phase_);
      return allocations_++;
    }
    const u64 b = round_ ? round_up(bytes, 512) : bytes;
    held_.push_back({b, part});
    live_ = add(live_, b);
    live_parts_[static_cast<size_t>(part)] += b;
    if (live_ > best_.bytes) best_.bytes = live_, best_.parts = live_parts_, best_.phase = phase_;
    u64& in_phase = best_.phases[static_cast<size_t>(phase_)];
    in_phase = std::max(in_phase, live_);
    return static_cast<int>(held_.size() - 1);
  }
  int alloc(u64 bytes, const EventKind& k, std::string_view of = {}) { return alloc(bytes, k.part, k.name, of); }
  void free(int id) {
    if (id < 0) return;
    if (record_) {
      trace_.push_back(-static_cast<std::int64_t>(id) - 1);
      return;
    }
    const size_t i = static_cast<size_t>(id);
    live_ -= held_[i].bytes;
    live_parts_[static_cast<size_t>(held_[i].part)] -= held_[i].bytes;
  }
  /// Allocation `id` now counts in component `p` (same bytes: no new moment).
  void retag(int id, Part p) {
    if (id < 0) return;
    if (record_) {
      if (parts_on_) retags_.push_back({trace_.size(), id, p});
      return;
    }
    const size_t i = static_cast<size_t>(id);
    live_parts_[static_cast<size_t>(held_[i].part)] -= held_[i].bytes;
    live_parts_[static_cast<size_t>(p)] += held_[i].bytes;
    held_[i].part = p;
  }
  void phase(Phase p) { phase_ = p; }
  /// Runs body(k) for k = 0..n-1 (trace sink), or body(0) once and extrapolates (peak sink): the
  /// iterations are identical, so the moments of iteration k are those of the first raised by k d
  /// (d: an iteration's net change, d_c per component); the largest of a phase (and the peak) is
  /// the first iteration's plus (n - 1) d if d > 0, else the first iteration's.
  void repeat(u64 n, const std::function<void(u64)>& body) {
    if (n == 0) return;
    if (record_) {
      const size_t first = trace_.size();
      size_t length = 0;
      bool equal = true;
      for (u64 k = 0; k < n; ++k) {
        const size_t before = trace_.size();
        body(k);
        if (k == 0) length = trace_.size() - before;
        equal = equal && trace_.size() - before == length;
      }
      if (equal && length > 0 && n >= 3) loops_.push_back({first, length, static_cast<size_t>(n)});
      return;
    }
    const u64 before = live_;
    const Parts before_parts = live_parts_;
    const Best outer = best_;
    best_ = Best{live_, live_parts_, phase_, {}};  // the first iteration's own moments
    body(0);
    const Best first = best_;
    best_ = outer;
    const std::int64_t delta = static_cast<std::int64_t>(live_) - static_cast<std::int64_t>(before);
    const u64 rises = delta > 0 ? n - 1 : 0;  // iterations after the first that raise its moments
    const u64 rise = mul(static_cast<u64>(std::max<std::int64_t>(delta, 0)), n - 1);
    // a component's value at a moment of iteration k: its value at the first iteration's moment + k d_c
    auto shifted = [&](size_t c, u64 first_value, u64 k) {
      const std::int64_t d = static_cast<std::int64_t>(live_parts_[c]) - static_cast<std::int64_t>(before_parts[c]);
      return static_cast<u64>(static_cast<std::int64_t>(first_value) + d * static_cast<std::int64_t>(k));
    };
    if (add(first.bytes, rise) > outer.bytes) {
      best_.bytes = add(first.bytes, rise);
      best_.phase = first.phase;
      for (size_t c = 0; c < kParts; ++c) best_.parts[c] = shifted(c, first.parts[c], rises);
    }
    for (size_t p = 0; p < kPhases; ++p)
      if (first.phases[p] > 0) best_.phases[p] = std::max(outer.phases[p], add(first.phases[p], rise));
    live_ = static_cast<u64>(static_cast<std::int64_t>(before) + delta * static_cast<std::int64_t>(n));
    for (size_t c = 0; c < kParts; ++c) live_parts_[c] = shifted(c, before_parts[c], n);
  }
  /// Index of the state slot iteration k uses (the peak sink keeps one slot).
  [[nodiscard]] u64 slot(u64 k) const { return record_ ? k : 0; }
  [[nodiscard]] const Best& best() const { return best_; }  ///< the peak sink's
  [[nodiscard]] bool tracing() const { return record_; }  ///< the trace sink (every iteration runs)
  std::vector<std::int64_t> take_trace() { return std::move(trace_); }
  /// Room for the trace sink's events (growing a vector of tens of thousands of events copies it
  /// several times over).
  void reserve(size_t events) { trace_.reserve(events); }
  std::vector<std::string> take_names() { return std::move(names_); }
  std::vector<Loop> take_loops() { return std::move(loops_); }
  /// The trace sink's component and phase of each allocation (with `parts`).
  [[nodiscard]] const std::vector<Part>& trace_parts() const { return trace_parts_; }
  [[nodiscard]] const std::vector<Phase>& trace_phases() const { return trace_phases_; }
  /// The trace sink's retags (with `parts`): before event `at`, allocation `id` counts in `part`.
  struct Retag {
    size_t at;
    int id;
    Part part;
  };
  [[nodiscard]] const std::vector<Retag>& retags() const { return retags_; }

 private:
  bool record_, round_, names_on_, parts_on_;
  /// The peak sink's allocations: bytes (rounded) and component (one array: one append per allocation)
  struct Held {
    u64 bytes;
    Part part;
  };
  std::vector<Held> held_;
  std::vector<std::int64_t> trace_;
  std::vector<Part> trace_parts_;
  std::vector<Phase> trace_phases_;
  std::vector<Retag> retags_;
  std::vector<std::string> names_;
  std::vector<Loop> loops_;  ///< the per-layer loops of the trace (iterations of equal length)
  int allocations_ = 0;      ///< the trace sink's allocation count
  Phase phase_ = Phase::Forward;
  u64 live_ = 0;
  Parts live_parts_{};
  Best best_;
};

/// (no tensor: 0 without the call, most of a list's weight, bias and gradient shapes are none)
u64 bytes_of(const StepSetup& s, const Shape& sh, Dt dt) { return sh.empty ? 0 : mul(sh.elements(s.dims), s.dtypes.of(dt)); }

constexpr size_t kKeep = static_cast<size_t>(-1);

/// Per group g (an entry of a list), a run of entry indexes, kept in one flat array: resolve()
/// builds two of these for every list, and a vector per entry cost an allocation each.
class IndexGroups {
 public:
  IndexGroups() = default;
  /// From (group, member) pairs; each group's members keep the pairs' order.
  IndexGroups(size_t groups, const std::vector<std::pair<size_t, size_t>>& pairs) : start_(groups + 1, 0) {
    for (const auto& [g, m] : pairs) ++start_[g + 1];
    for (size_t g = 0; g < groups; ++g) start_[g + 1] += start_[g];
    members_.resize(pairs.size());
    // start_[g] serves as group g's cursor, which ends at group g + 1's start; then shifted back
    for (const auto& [g, m] : pairs) members_[start_[g]++] = m;
    for (size_t g = groups; g-- > 1;) start_[g] = start_[g - 1];
    if (groups > 0) start_[0] = 0;
  }
  [[nodiscard]] std::span<const size_t> of(size_t g) const {
    return {members_.data() + start_[g], start_[g + 1] - start_[g]};
  }
  /// Every group's members, group after group.
  [[nodiscard]] std::vector<size_t> members() && { return std::move(members_); }

 private:
  std::vector<size_t> start_, members_;
};

/// One entry of a list resolved for a setup: its sizes, the entries its lifetime and gradients
/// refer to (indexes, kKeep: none), and the components it counts in.
struct ResolvedEntry {
  u64 bytes = 0, grad_bytes = 0, weight_bytes = 0, bias_bytes = 0;
  u64 sum_bytes = 0;        ///< a gradient of the entry's tensor (for residual sums)
  u64 cast_bytes = 0;       ///< residual adds: the cast of the gradient the waiting operand gets (0: none)
  size_t skip_to = kKeep;   ///< residual adds: the entry their skip gradient reaches
  size_t branch_from = kKeep;  ///< parallel branches: the entry whose gradient this one reads
  size_t dies_at = kKeep;   ///< index of the last consumer; kKeep: saved or carried out
  bool carried = false;     ///< the entry stands for the list's input ("carried": allocates nothing)
  Part forward_part = Part::ByLifetime;   ///< the component the entry's tensor counts in
  Part backward_part = Part::ByLifetime;  ///< the component of the gradients its backward makes (not the weights')
};

/// A list resolved for the pass: its entries, and for each entry the index after whose creation it dies.
struct Resolved {
  const OpList* ops = nullptr;
  std::vector<ResolvedEntry> at;  ///< per entry of *ops
  /// per entry i: the earlier entries b whose branch_from is i, ascending (backward's hot loop
  /// reads them for every entry; a scan of all earlier entries made the backward quadratic)
  IndexGroups branch_readers;
  IndexGroups released_at;  ///< per entry: the saved tensors its backward releases
  std::vector<size_t> death_order;  ///< the entries that die in the forward, by dies_at
  size_t loss_from = kKeep;  ///< the first entry of the loss phase (the logits; none: kKeep)
  /// the entry handed to the next list: the last that dies at "layer_out", else the last entry
  /// (the Llama embedding list's lookup, made before the model's set-up that follows it)
  size_t out = 0;
  size_t weight_grads = 0;   ///< the weight and bias gradients a first micro-batch's backward makes
};

/// A lifetime that outlasts the list's forward, named rather than by a consumer entry: handed to
/// the next list ("layer_out"), held until the decoder stack returns ("decoder_end") or until the
/// backward is over ("backward_end").
bool outlives_list(std::string_view dies_after) {
  return dies_after == "layer_out" || dies_after == "decoder_end" || dies_after == "backward_end";
}

/// Name lookups relative to an entry, by a scan from that entry outward: the names resolve() looks
/// up (a consumer, a residual's operand, a releasing entry) lie a few entries away, so a scan stops
/// soon, and it needs no index of the list built for every estimate (a map of the names cost more
/// than all the scans).
class NamePositions {
 public:
  explicit NamePositions(const OpList& l) : l_(l) {}
  /// The last entry before `i` named `n` (kKeep: none).
  [[nodiscard]] size_t last_before(std::string_view n, size_t i) const {
    for (size_t j = n.empty() ? 0 : i; j-- > 0;)
      if (l_[j].name == n) return j;
    return kKeep;
  }
  /// The first entry after `i` named `n` (kKeep: none).
  [[nodiscard]] size_t first_after(std::string_view n, size_t i) const {
    for (size_t j = i + 1; !n.empty() && j < l_.size(); ++j)
      if (l_[j].name == n) return j;
    return kKeep;
  }
  /// The last entry after `i` named `n` (kKeep: none).
  [[nodiscard]] size_t last_after(std::string_view n, size_t i) const {
    for (size_t j = n.empty() ? i + 1 : l_.size(); j-- > i + 1;)
      if (l_[j].name == n) return j;
    return kKeep;
  }

 private:
  const OpList& l_;
};

/// Entry i's sizes and the entries it refers to (resolve's per-entry part).
ResolvedEntry resolve_entry(const StepSetup& s, const OpList& l, const NamePositions& names, size_t i) {
  const TensorOp& t = l[i];
  ResolvedEntry e;
  e.carried = t.op == "carried";
  e.bytes = e.carried ? 0 : bytes_of(s, t.shape, t.dtype);
  e.grad_bytes = bytes_of(s, t.grad_input, t.grad_dtype);
  e.weight_bytes = bytes_of(s, t.weight, t.weight_dtype);
  e.bias_bytes = bytes_of(s, t.bias, t.weight_dtype);
  e.sum_bytes = bytes_of(s, t.shape, Dt::Model);
  e.skip_to = names.last_before(t.residual_of, i);
  e.branch_from = names.last_after(t.branch_of, i);
  const size_t skip = e.skip_to;
  const bool cast = skip != kKeep && l[skip].dtype != t.dtype && s.dtypes.of(l[skip].dtype) != s.dtypes.of(t.dtype);
  e.cast_bytes = cast ? bytes_of(s, l[skip].shape, l[skip].dtype) : 0;
  if (!t.saved && !outlives_list(t.dies_after)) {
    // dies_after naming the entry itself: a result read at once and dropped (dies where it is made)
    const size_t consumer = t.dies_after == t.name ? i : names.first_after(t.dies_after, i);
    e.dies_at = std::min(consumer == kKeep ? i + 1 : consumer, l.size() - 1);
  }
  const bool kept = t.saved || t.dies_after == "layer_out" || t.dies_after == "decoder_end" || t.dies_after == "next_layer";
  const Part by_lifetime = kept ? Part::Activations : Part::TemporaryBuffers;
  e.forward_part = t.part == Part::ByLifetime ? by_lifetime : t.part;
  e.backward_part = t.part == Part::LogitsLoss ? Part::LogitsLoss : Part::TemporaryBuffers;
  return e;
}

Resolved resolve(const StepSetup& s, const OpList& l) {
  Resolved r;
  r.ops = &l;
  const size_t n = l.size();
  const NamePositions names(l);
  r.at.reserve(n);
  for (size_t i = 0; i < n; ++i) r.at.push_back(resolve_entry(s, l, names, i));
  r.out = n - 1;
  for (size_t i = n; i-- > 0;)
    if (l[i].dies_after == "layer_out") {
      r.out = i;
      break;
    }
  for (size_t i = 0; i < n && r.loss_from == kKeep; ++i)
    if (l[i].part == Part::LogitsLoss) r.loss_from = i;
  std::vector<std::pair<size_t, size_t>> pairs;
  pairs.reserve(n);
  for (size_t b = 0; b < n; ++b)
    if (r.at[b].branch_from != kKeep) pairs.emplace_back(r.at[b].branch_from, b);
  r.branch_readers = IndexGroups(n, pairs);
  pairs.clear();
  for (size_t j = 0; j < n; ++j) {
    if (l[j].dies_after == "backward_end") continue;  // run() frees it when the backward is over
    const size_t by = names.last_after(l[j].released_by, j);
    pairs.emplace_back(by == kKeep ? j : by, j);
  }
  r.released_at = IndexGroups(n, pairs);
  // the dying entries by dies_at, ascending entries among equal ones: grouped by dies_at (a
  // counting sort, where a stable sort allocated a buffer for every list)
  pairs.clear();
  for (size_t j = 0; j < n; ++j) {
    if (r.at[j].dies_at != kKeep) pairs.emplace_back(r.at[j].dies_at, j);
    r.weight_grads += (r.at[j].weight_bytes > 0) + (r.at[j].bias_bytes > 0);
  }
  r.death_order = IndexGroups(n, pairs).members();
  return r;
}

/// The tensors of one list alive after its forward: id per entry (-1 = none / freed).
struct ListState {
  std::vector<int> ids;
  int out = -1;  ///< the carried output (last entry)
  int returned = -1;  ///< a checkpointed list's tensor the caller keeps until the next list ends
  std::vector<int> weight_grads;
  std::vector<int> cached;  ///< a checkpointed list's autocast weight casts, alive until autocast exits
};

/// Forward of one list. `input` is the carried tensor entry 0 stands for ("carried" entries).
/// `checkpointed`: everything but the input dies with the list (torch.utils.checkpoint).
ListState forward(Sink& sink, const Resolved& r, int input, bool checkpointed, bool keep_input) {
  const OpList& l = *r.ops;
  ListState st;
  st.ids.assign(l.size(), -1);
  size_t next_death = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    if (i == r.loss_from) sink.phase(Phase::Loss);
    st.ids[i] = r.at[i].carried ? input : sink.alloc(r.at[i].bytes, r.at[i].forward_part, l[i].name);
    for (; next_death < r.death_order.size() && r.at[r.death_order[next_death]].dies_at == i; ++next_death) {
      const size_t j = r.death_order[next_death];
      if ((j != 0 || !keep_input) && st.ids[j] >= 0) sink.free(st.ids[j]), st.ids[j] = -1;
    }
  }
  st.out = st.ids[r.out];
  for (size_t j = 0; j + 1 < l.size(); ++j)
    if (r.at[j].dies_at != kKeep && r.at[j].dies_at >= l.size() - 1 && st.ids[j] >= 0 && j != 0 && j != r.out)
      sink.free(st.ids[j]), st.ids[j] = -1;
  if (checkpointed) {
    // torch.autocast caches the cast of every weight that needs a gradient until the outermost
    // autocast region exits (autocast_mode.cpp cached_cast; clear_cache on exit), which the
    // Trainer's compute_loss_context_manager leaves after the loss: the checkpoint's forward
    // keeps no cast for backward, the cache does (measured, peak dump of holdout 16's
    // qwen3/h384-L3-V2048/full/amp_bf16/gc/sdpa/b2s384/adamw/gas2 at micro-batch 2's nll_loss:
    // every layer's bf16 weight copies beside the kept fp32 gradients)
    for (size_t j = 1; j < l.size(); ++j) {
      if (st.ids[j] < 0 || j == r.out) continue;
      if (l[j].dies_after == "next_layer") st.returned = st.ids[j];  // the layer returns it
      else if (r.at[j].forward_part == Part::AutocastWeightCopies) st.cached.push_back(st.ids[j]);
      else sink.free(st.ids[j]);
      st.ids[j] = -1;
    }
  }
  st.ids[r.out] = -1;  // handed to the next list
  return st;
}

/// A gradient waiting at an earlier entry of the list, where autograd sums it with another.
struct Pending {
  size_t target;
  int id;
  /// a parked branch gradient nothing else reads: autograd adds the other one into it in place
  /// (InputBuffer::accumulate steals a buffer it holds alone); a residual's skip gradient is still
  /// read by its branch, so that sum is a new tensor
  bool in_place = false;
  /// held for the branch entry `target`, which reads it (not summed there)
  bool read = false;
};

/// Entry i ends the branch autograd runs second (attention beside an MLP): the gradient the
/// first branch produced goes to the branches' common input, and entry i reads the gradient
/// that reached `source` (the branches' sum). If a gradient already waits at that input, autograd
/// adds the new one to it: in place into a parked gradient, out of place into a residual's skip
/// gradient (still read by entry i).
void branch_switch(Sink& sink, const Resolved& r, size_t i, std::vector<Pending>& pending, int& grad) {
  auto read = std::find_if(pending.begin(), pending.end(), [&](const Pending& p) { return p.read && p.target == i; });
  const int source = read == pending.end() ? -1 : read->id;
  if (read != pending.end()) pending.erase(read);
  const size_t join = r.at[i].skip_to;
  auto waiting = std::find_if(pending.begin(), pending.end(), [&](const Pending& p) { return !p.read && p.target == join; });
  if (waiting != pending.end() && grad >= 0 && waiting->in_place) {
    sink.free(grad);  // added into the parked gradient
  } else if (waiting != pending.end() && grad >= 0) {
    const int sum = sink.alloc(r.at[join].sum_bytes, r.at[join].backward_part, "grad_sum");
    sink.free(grad);
    const int old = waiting->id;
    waiting->id = sum;
    waiting->in_place = true;  // nothing else reads the sum
    if (old != source && std::none_of(pending.begin(), pending.end(), [&](const Pending& p) { return p.id == old; }))
      sink.free(old);
  } else if (grad >= 0) {
    pending.push_back({join, grad, true});
  }
  grad = source;
}

/// The recomputation of a checkpointed list: torch.utils.checkpoint(use_reentrant=False) stops
/// it once the last tensor the backward needs is recomputed (checkpoint early stop, on by
/// default), so the ops after the last saved entry do not run again; what is not saved dies.
ListState recompute_forward(Sink& sink, const Resolved& r, int input) {
  const OpList& l = *r.ops;
  size_t end = 0;
  for (size_t i = 1; i < l.size(); ++i)
    if (l[i].saved) end = i + 1;
  ListState st;
  st.ids.assign(l.size(), -1);
  st.ids[0] = input;
  size_t next_death = 0;
  for (size_t i = 1; i < end; ++i) {
    st.ids[i] = sink.alloc(r.at[i].bytes, r.at[i].forward_part, l[i].name);
    for (; next_death < r.death_order.size() && r.at[r.death_order[next_death]].dies_at <= i; ++next_death) {
      const size_t j = r.death_order[next_death];
      if (j != 0 && st.ids[j] >= 0) sink.free(st.ids[j]), st.ids[j] = -1;
    }
  }
  for (size_t j = 1; j < end; ++j)
    if (!l[j].saved && st.ids[j] >= 0) sink.free(st.ids[j]), st.ids[j] = -1;
  return st;
}

bool held(const std::vector<Pending>& pending, int id) {
  return std::any_of(pending.begin(), pending.end(), [&](const Pending& p) { return p.id == id; });
}

/// The gradients waiting at entry i meet the one arriving there (`grad`): a residual's skip
/// gradient is summed with it (a new tensor), a parked branch gradient takes it in place, and
/// beside a LoRA adapter the frozen base Linear's backward runs on the waiting gradient before
/// its input gradient is summed with the chain's. Returns whether entry i's input gradient was
/// made (that last case).
bool meet_waiting(Sink& sink, const Resolved& r, size_t i, std::vector<Pending>& pending, int& grad) {
  const OpList& l = *r.ops;
  bool own_made = false;
  for (size_t p = 0; p < pending.size();) {
    if (pending[p].target != i || pending[p].read) {
      ++p;
      continue;
    }
    const int skip = pending[p].id;
    const bool in_place = pending[p].in_place;
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(p));
    if (r.at[i].grad_bytes > 0 && grad >= 0 && !in_place && !l[i].sums_first) {
      const int own = sink.alloc(r.at[i].grad_bytes, r.at[i].backward_part, "grad_in", l[i].name);
      if (!held(pending, skip)) sink.free(skip);  // a residual add further up may share it
      const int sum = sink.alloc(r.at[i].grad_bytes, r.at[i].backward_part, "grad_sum");
      sink.free(own);
      if (!held(pending, grad)) sink.free(grad);
      grad = sum;
      own_made = true;
    } else if (in_place && grad != skip && grad >= 0) {
      if (!held(pending, grad)) sink.free(grad);
      grad = skip;
    } else if (grad != skip && grad >= 0) {
      // branch + skip, summed by autograd (in the tensor's own dtype where two readers' gradients meet)
      const int sum = sink.alloc(l[i].sums_first ? r.at[i].bytes : r.at[i].sum_bytes, r.at[i].backward_part, "grad_sum");
      if (!held(pending, skip)) sink.free(skip);
      if (!held(pending, grad)) sink.free(grad);
      grad = sum;
    } else {
      grad = skip;
    }
  }
  return own_made;
}

/// How a list's backward treats the weight gradients it makes.
struct WeightGrads {
  /// true: the first micro-batch (each gradient becomes the parameter's .grad, alive until
  /// zero_grad); false: a later one (the .grad exists, the new gradient is added into it)
  bool first = true;
  /// a later micro-batch: the entry whose new gradient waits in autograd's input buffer rather
  /// than being accumulated at once (a tied head's, summed with the embedding's; kKeep: none)
  size_t waits = static_cast<size_t>(-1);
};

/// What entry i's backward creates: its weight (and bias) gradient in the first micro-batch, the
/// skip gradient a residual add hands back (cast when the waiting operand has another dtype: a
/// half base output beside an fp32 adapter sum), and its input gradient (beside the temporaries
/// its backward holds), which replaces the incoming one. In a later micro-batch the node makes a
/// new weight gradient after its input gradient (derivatives.yaml: mm's self before mat2), and
/// AccumulateGrad adds it into the existing .grad in place and frees it as soon as the node has
/// returned (torch/csrc/autograd/functions/accumulate_grad.h: `variable_grad += new_grad` when
/// grad mode is off; the engine runs AccumulateGrad nodes first, sequence_nr UINT64_MAX).
void entry_gradients(Sink& sink, const Resolved& r, size_t i, ListState& st, std::vector<Pending>& pending,
                     int& grad, WeightGrads wg, bool input_grad_made) {
  const OpList& l = *r.ops;
  if (r.at[i].weight_bytes > 0 && (wg.first || wg.waits == i))
    st.weight_grads.push_back(sink.alloc(r.at[i].weight_bytes, kWeightGrad, l[i].name));
  if (r.at[i].bias_bytes > 0 && wg.first) st.weight_grads.push_back(sink.alloc(r.at[i].bias_bytes, kBiasGrad, l[i].name));
  if (r.at[i].skip_to != kKeep && r.at[i].branch_from == kKeep && grad >= 0) {
    const bool cast = r.at[i].cast_bytes > 0;
    const int part = cast ? sink.alloc(r.at[i].cast_bytes, r.at[i].backward_part, "grad_cast") : grad;
    // autograd adds a gradient into the input buffer it reaches as soon as it is made: where a
    // residual's skip gradient already waits (an fp32 RMSNorm's input, read by the residual add,
    // pow and the x_hat mul), the two are summed now, out of place
    auto waiting = std::find_if(pending.begin(), pending.end(), [&](const Pending& p) {
      return p.target == r.at[i].skip_to && !p.read && !p.in_place && p.id != part;
    });
    if (waiting == pending.end()) {
      pending.push_back({r.at[i].skip_to, part});
    } else {
      const int sum = sink.alloc(r.at[r.at[i].skip_to].sum_bytes, r.at[r.at[i].skip_to].backward_part, "grad_sum");
      const int old = waiting->id;
      waiting->id = sum;
      if (!held(pending, old)) sink.free(old);
      if (part != grad) sink.free(part);
    }
  }
  auto accumulated = [&] {  // a later micro-batch's new weight (and bias) gradient, added into .grad
    std::vector<int> added;
    if (!wg.first && wg.waits != i) {
      added.push_back(sink.alloc(r.at[i].bias_bytes, kBiasGradNew, l[i].name));
      added.push_back(sink.alloc(r.at[i].weight_bytes, kWeightGradNew, l[i].name));
    }
    return added;
  };
  if (r.at[i].grad_bytes == 0 || input_grad_made) {
    for (int a : accumulated()) sink.free(a);
    return;
  }
  std::vector<int> temps;
  for (std::uint8_t k = 0; k < l[i].backward_temps; ++k) temps.push_back(sink.alloc(r.at[i].grad_bytes, r.at[i].backward_part, "grad_temp", l[i].name));
  const int g = sink.alloc(r.at[i].grad_bytes, r.at[i].backward_part, "grad_in", l[i].name);
  for (int t : temps) sink.free(t);
  const std::vector<int> added = accumulated();
  if (!held(pending, grad)) sink.free(grad);
  for (int a : added) sink.free(a);
  grad = g;
}

/// Backward of one list: in reverse order, each op creates its input gradient (the incoming one
/// is released), its weight gradient if trained, and releases what it saved.
/// `grad` is the gradient flowing in; returns the one flowing out.
/// `recompute` (checkpointing): torch.utils.checkpoint(use_reentrant=False) re-runs the forward
/// when the backward first unpacks a saved tensor, so the ops at the end of the list that keep
/// nothing (adds, casts, the LoRA scaling) run before it; it is called before the first entry
/// whose predecessor is saved (its input, what its backward needs).
int backward(Sink& sink, const Resolved& r, ListState& st, int grad, WeightGrads wg,
             const std::function<void()>& recompute = {}) {
  const OpList& l = *r.ops;
  std::vector<Pending> pending;  // gradients waiting at an earlier entry (residual skips, branches)
  st.weight_grads.reserve(st.weight_grads.size() + r.weight_grads);  // one allocation, not one per doubling
  bool recomputed = !recompute;
  for (size_t i = l.size(); i-- > 0;) {
    if (!recomputed && (i == 0 || l[i - 1].saved)) recompute(), recomputed = true;
    const bool input_grad_made = meet_waiting(sink, r, i, pending, grad);
    // a branch entry further down reads the gradient arriving here: hold it until then
    for (size_t b : r.branch_readers.of(i))
      if (b < i && grad >= 0) pending.push_back({b, grad, false, true});
    if (r.at[i].branch_from != kKeep) branch_switch(sink, r, i, pending, grad);
    const size_t made = st.weight_grads.size();
    entry_gradients(sink, r, i, st, pending, grad, wg, input_grad_made);
    for (size_t j : r.released_at.of(i))
      if (st.ids[j] >= 0) sink.free(st.ids[j]), st.ids[j] = -1;
    // the node has returned: AccumulateGrad makes its new weight gradients the .grad (not one that
    // waits in autograd's input buffer for another's)
    if (i != wg.waits)
      for (size_t k = made; k < st.weight_grads.size(); ++k) sink.retag(st.weight_grads[k], Part::Gradients);
  }
  for (size_t p = 0; p < pending.size(); ++p) {
    const int id = pending[p].id;
    const bool again = std::any_of(pending.begin() + static_cast<std::ptrdiff_t>(p) + 1, pending.end(),
                                   [&](const Pending& q) { return q.id == id; });
    if (id != grad && !again) sink.free(id);
  }
  return grad;
}

/// Parameter tensors of one decoder layer, in module order (bytes), and which are trained.
/// From the ModelSpec's Linears: each weight (and bias), the norms, then the adapters (PEFT's
/// A [r, in] and B [out, r] per target, in the adapter dtype).
std::vector<ParamTensor> spec_layer_params(const StepSetup& s) {
  const u64 m = s.dtypes.model, ad = s.dtypes.adapter;
  std::vector<ParamTensor> p;
  for (const StepSetup::LayerLinear& l : s.linears) {
    p.push_back({mul(l.in, l.out, m), s.layer.full});
    if (l.bias) p.push_back({mul(l.out, m), s.layer.full});
  }
  for (u64 left = s.norm_params; left > 0;) {  // one tensor per hidden-wide norm
    const u64 n = std::min(left, s.dims.h);
    p.push_back({mul(n, m), s.layer.full});
    left -= n;
  }
  for (const StepSetup::LayerLinear& l : s.linears)
    if (l.adapted) p.push_back({mul(s.dims.r, l.in, ad), true}), p.push_back({mul(l.out, s.dims.r, ad), true});
  return p;
}

std::vector<ParamTensor> layer_params(const StepSetup& s) {
  if (!s.layer_weights.empty()) return s.layer_weights;
  if (!s.linears.empty()) return spec_layer_params(s);
  const Dims& d = s.dims;
  const u64 m = s.dtypes.model, ad = s.dtypes.adapter;
  const bool full = s.layer.full;
  std::vector<ParamTensor> p;
  auto w = [&](u64 elems) { p.push_back({mul(elems, m), full}); };
  w(d.h);  // input_layernorm
  w(mul(d.h, d.q));
  if (s.qkv_bias) w(d.q);
  w(mul(d.h, d.kv));
  if (s.qkv_bias) w(d.kv);
  w(mul(d.h, d.kv));
  if (s.qkv_bias) w(d.kv);
  w(mul(d.q, d.h));
  w(d.h);  // post_attention_layernorm
  w(mul(d.h, d.i));
  w(mul(d.h, d.i));
  w(mul(d.i, d.h));
  if (!full) {
    // LoRA A [r, in] and B [out, r] per target, in the adapter dtype (PEFT)
    auto lora = [&](u64 in, u64 out) {
      p.push_back({mul(d.r, in, ad), true});
      p.push_back({mul(out, d.r, ad), true});
    };
    lora(d.h, d.q);
    if (s.layer.lora_all) lora(d.h, d.kv);
    lora(d.h, d.kv);
    if (s.layer.lora_all) {
      lora(d.q, d.h);
      lora(d.h, d.i);
      lora(d.h, d.i);
      lora(d.i, d.h);
    }
  }
  return p;
}

std::vector<ParamTensor> outer_params(const StepSetup& s) {
  if (!s.outer_weights.empty()) return s.outer_weights;
  const u64 m = s.dtypes.model;
  std::vector<ParamTensor> p{{mul(s.dims.v, s.dims.h, m), s.layer.full}, {mul(s.dims.h, m), s.layer.full}};
  if (!s.tied_embeddings) p.push_back({mul(s.dims.v, s.dims.h, m), s.layer.full});
  return p;
}

/// The optimizer's step: its state at the first step, then the foreach temporaries (one per
/// parameter), in module order: the leading outer parameters, each group's layers, the rest.
void optimizer_step(Sink& sink, const StepSetup& s, const std::vector<ParamTensor>& op, size_t lead,
                    const std::vector<std::pair<u64, const std::vector<ParamTensor>*>>& module_layers, bool first) {
  auto trained = [&](const std::vector<ParamTensor>& ps) {
    std::vector<u64> b;
    for (const ParamTensor& t : ps)
      if (t.trained) b.push_back(t.bytes);
    return b;
  };
  const std::vector<u64> to_lead = trained({op.begin(), op.begin() + static_cast<std::ptrdiff_t>(lead)}),
                         to = trained({op.begin() + static_cast<std::ptrdiff_t>(lead), op.end()});
  std::vector<std::vector<u64>> tl;
  for (const auto& ml : module_layers) tl.push_back(trained(*ml.second));
  if (first) {
    // per parameter, in the order the optimizer walks them (module order): the step counter, then
    // exp_avg and exp_avg_sq (torch/optim/adam.py _init_group). The counter is a 0-d fp32 tensor on
    // the parameter's device with fused=True; foreach without capturable keeps it on the CPU
    // ("special device hosting for step"), off the GPU.
    const u64 counter = s.optimizer == StepOptimizer::AdamWFused ? 4 : 0;
    auto state = [&](u64 b) {
      sink.alloc(counter, kOptimizerStep);
      sink.alloc(b, kOptimizerState), sink.alloc(b, kOptimizerState);
    };
    for (u64 b : to_lead) state(b);
    for (size_t g = 0; g < tl.size(); ++g)
      sink.repeat(module_layers[g].first, [&](u64) { for (u64 b : tl[g]) state(b); });
    for (u64 b : to) state(b);
  }
  if (s.optimizer != StepOptimizer::AdamWForeach) return;
  std::vector<int> tmp;
  for (u64 b : to_lead) tmp.push_back(sink.alloc(b, kOptimizerTemp));
  std::vector<std::vector<std::vector<int>>> ltmp(tl.size());
  for (size_t g = 0; g < tl.size(); ++g) {
    ltmp[g].resize(module_layers[g].first);
    sink.repeat(module_layers[g].first, [&](u64 k) { for (u64 b : tl[g]) ltmp[g][sink.slot(k)].push_back(sink.alloc(b, kOptimizerTemp)); });
  }
  for (u64 b : to) tmp.push_back(sink.alloc(b, kOptimizerTemp));
  for (int t : tmp) sink.free(t);
  for (size_t g = 0; g < tl.size(); ++g)
    sink.repeat(module_layers[g].first, [&](u64 k) { for (int t : ltmp[g][sink.slot(k)]) sink.free(t); });
}

/// The setup decoder group g is sized by: a copy of `s` carrying the group's list choices, sizes
/// and parameters.
StepSetup group_setup(const StepSetup& s, size_t g) {
  const StepSetup::Group& x = s.groups[g];
  StepSetup c = s;
  c.groups.clear();
  c.layer = x.layer, c.dims = x.dims, c.linears = x.linears, c.norm_params = x.norm_params, c.layers = x.count;
  return c;
}
std::vector<StepSetup> group_setups(const StepSetup& s) {
  std::vector<StepSetup> out;
  for (size_t g = 0; g < s.groups.size(); ++g) out.push_back(group_setup(s, g));
  return out;
}

/// A decoder list resolved for its group, and that group's parameter tensors (shared by the runs
/// of one kind).
struct ResolvedLayers {
  Resolved r;
  std::vector<ParamTensor> params;
};

/// One run of identical decoder layers as the pass walks it: its resolved list and parameters,
/// and per layer the state its forward leaves and the weight gradients its backward makes.
struct LayerRun {
  const ResolvedLayers* layers = nullptr;
  u64 count = 0;
  size_t kind = StepSetup::Group::kNoKind;
  std::vector<ListState> states;
  std::vector<std::vector<int>> grads;
};

/// The decoder's runs, their lists resolved once per kind of group.
std::vector<LayerRun> layer_runs(const StepSetup& s, const StepLists& lists, std::vector<ResolvedLayers>& store) {
  store.reserve(lists.layers.size());
  std::vector<LayerRun> runs;
  std::vector<std::pair<size_t, const ResolvedLayers*>> by_kind;
  for (const StepLists::Layers& l : lists.layers) {
    if (l.count == 0) continue;
    const auto known = std::find_if(by_kind.begin(), by_kind.end(), [&](const auto& k) {
      return l.kind != StepSetup::Group::kNoKind && k.first == l.kind;
    });
    const ResolvedLayers* r = known != by_kind.end() ? known->second : nullptr;
    if (!r) {
      const StepSetup gs = s.groups.empty() ? StepSetup{} : group_setup(s, l.group);
      const StepSetup& g = s.groups.empty() ? s : gs;
      store.push_back({resolve(g, l.list), layer_params(g)});
      r = &store.back();
      by_kind.push_back({l.kind, r});
    }
    runs.push_back({r, l.count, l.kind, std::vector<ListState>(l.count), std::vector<std::vector<int>>(l.count)});
  }
  return runs;
}

/// The runs of the decoder as `reps` repetitions of its first `period` runs (Llama 4's pattern of
/// layer kinds), for the peak sink to extrapolate; (runs, 1) where there is no such pattern.
std::pair<size_t, u64> run_pattern(const std::vector<LayerRun>& runs) {
  for (size_t p = 1; p < runs.size(); ++p) {
    if (runs.size() % p != 0) continue;
    bool repeats = true;
    for (size_t i = 0; i < runs.size() && repeats; ++i)
      repeats = runs[i].kind != StepSetup::Group::kNoKind && runs[i].kind == runs[i % p].kind &&
                runs[i].count == runs[i % p].count;
    if (repeats) return {p, runs.size() / p};
  }
  return {runs.size(), 1};
}

/// Whether a layer returns a tensor besides its output under checkpointing (an entry that dies
/// after the next layer).
bool layers_return_tensor(const StepSetup& s, const std::vector<LayerRun>& runs) {
  bool returns_tensor = false;
  for (const LayerRun& lr : runs)
    returns_tensor = returns_tensor || (s.checkpointing && std::any_of(lr.layers->r.ops->begin(), lr.layers->r.ops->end(),
                                                                       [](const TensorOp& t) { return t.dies_after == "next_layer"; }));
  return returns_tensor;
}

/// The entry of the head list whose weight is the embedding's [V, h] shape.
size_t tied_head_entry(const StepSetup& s, const OpList& head_l, const Resolved& head) {
  // the head entry that makes a tied weight's [V, h] gradient (kKeep: none)
  size_t tied_head = kKeep;
  for (size_t i = 0; i < head_l.size(); ++i)
    if (!head_l[i].weight.empty && head.at[i].weight_bytes == mul(s.dims.v, s.dims.h, s.dtypes.model)) tied_head = i;
  return tied_head;
}

/// The decoder's layer parameters grouped for module order: consecutive runs with the same
/// parameters form one group.
std::vector<std::pair<u64, const std::vector<ParamTensor>*>> module_layer_groups(const std::vector<LayerRun>& runs) {
  // parameters in module order: the embeddings, the layers (adapters after each layer's own), the
  // final norm and the head (the optimizer walks them in the same order); the LoRA first layer
  // has the same parameters as the others of its group
  std::vector<std::pair<u64, const std::vector<ParamTensor>*>> module_layers;  // (layers, params) per group
  for (const LayerRun& lr : runs) {
    const std::vector<ParamTensor>& ps = lr.layers->params;
    if (!module_layers.empty() && module_layers.back().second->size() == ps.size() &&
        std::equal(ps.begin(), ps.end(), module_layers.back().second->begin(),
                   [](const ParamTensor& a, const ParamTensor& b) { return a.bytes == b.bytes && a.trained == b.trained; }))
      module_layers.back().first += lr.count;
    else
      module_layers.push_back({lr.count, &ps});
  }
  return module_layers;
}

/// What the passes of a run share: the lists resolved, the decoder's runs and the pattern they are
/// walked in, the parameters, and the outer weight gradients alive until zero_grad. Its resolved
/// lists point into its own `lists` and `store`, so it is neither copied nor moved.
struct StepRun {
  StepRun(Sink& sk, const StepSetup& st) : sink(sk), s(st), lists(step_lists(st)) {}
  StepRun(const StepRun&) = delete;
  StepRun& operator=(const StepRun&) = delete;

  Sink& sink;
  const StepSetup& s;
  const StepLists lists;
  Resolved emb, head;
  std::vector<ResolvedLayers> store;  ///< the layer lists, resolved once per kind of group
  std::vector<LayerRun> runs;
  bool returns_tensor = false;  ///< layers_return_tensor
  size_t period = 0;            ///< the runs walked once per repetition of the pattern
  u64 reps = 1;                 ///< the repetitions of the pattern
  size_t tied_head = kKeep;     ///< tied_head_entry
  std::vector<ParamTensor> op;  ///< the outer parameters (embeddings, final norm, head)
  std::vector<std::pair<u64, const std::vector<ParamTensor>*>> module_layers;  ///< module_layer_groups
  size_t lead = 0;              ///< the outer parameters that come before the layers
  std::vector<int> outer_grads;  ///< the outer parameters' .grad
};

/// Resolves the run's lists, finds the decoder's runs and the pattern they are walked in, and
/// its parameters in module order.
void resolve_step(StepRun& st) {
  const StepSetup& s = st.s;
  st.emb = resolve(s, st.lists.embedding), st.head = resolve(s, st.lists.head);
  st.runs = layer_runs(s, st.lists, st.store);
  st.returns_tensor = layers_return_tensor(s, st.runs);
  // the peak sink runs a repeated pattern of runs once and extrapolates it (its per-run states sit
  // in slot 0 anyway); the trace sink walks every run
  // (two named values, not a structured binding: the lambdas below capture them, which Debian's
  // Emscripten clang does not allow for bindings)
  const std::pair<size_t, u64> pattern_of = st.sink.tracing() || st.returns_tensor ? std::pair<size_t, u64>{st.runs.size(), 1} : run_pattern(st.runs);
  st.period = pattern_of.first;
  st.reps = pattern_of.second;
  st.tied_head = tied_head_entry(s, st.lists.head, st.head);
  st.op = outer_params(s);
  st.module_layers = module_layer_groups(st.runs);
  st.lead = std::min(s.leading_outer, st.op.size());
}

/// Calls `f` on each run of the decoder (last first for the backward), the pattern `reps` times.
void each_run(StepRun& st, bool reverse, const std::function<void(LayerRun&)>& f) {
  auto pattern = [&](u64) {
    for (size_t j = 0; j < st.period; ++j) f(st.runs[reverse ? st.period - 1 - j : j]);
  };
  if (st.reps == 1) pattern(0);
  else st.sink.repeat(st.reps, pattern);
}

/// The parameters, in module order: the leading outer ones, each group's layers, the rest.
void allocate_parameters(StepRun& st) {
  Sink& sink = st.sink;
  for (size_t i = 0; i < st.lead; ++i) sink.alloc(st.op[i].bytes, kParameter);
  for (const auto& group : st.module_layers) {
    const std::vector<ParamTensor>& ps = *group.second;
    sink.repeat(group.first, [&](u64) { for (const ParamTensor& t : ps) sink.alloc(t.bytes, kParameter); });
  }
  for (size_t i = st.lead; i < st.op.size(); ++i) sink.alloc(st.op[i].bytes, kParameter);
}

/// The decoder's forward, each layer on the previous one's output `carried`; returns the last
/// layer's output.
int layers_forward(StepRun& st, int carried) {
  Sink& sink = st.sink;
  const StepSetup& s = st.s;
  // a tensor a checkpointed layer returns besides its output (Falcon's attention weights)
  // lives until the next layer has returned, so the first layer differs from the others
  int returned = -1;
  each_run(st, false, [&](LayerRun& lr) {
    auto layer_forward = [&](u64 k) {
      // checkpointing keeps the layer input (the checkpoint's only saved tensor)
      ListState ls = forward(sink, lr.layers->r, carried, s.checkpointing, s.checkpointing);
      carried = ls.out;
      if (returned >= 0) sink.free(returned);
      returned = ls.returned;
      lr.states[sink.slot(k)] = std::move(ls);
    };
    if (st.returns_tensor && returned < 0) {  // nothing to free before this run's first layer
      layer_forward(0);
      sink.repeat(lr.count - 1, [&](u64 k) { layer_forward(k + 1); });
    } else {
      sink.repeat(lr.count, layer_forward);
    }
  });
  if (returned >= 0) sink.free(returned);
  return carried;
}

/// Autocast exits after the loss: the weight casts its cache kept through a checkpointed forward go.
void free_autocast_cache(StepRun& st) {
  each_run(st, false, [&](LayerRun& lr) {
    st.sink.repeat(lr.count, [&](u64 k) {
      ListState& ls = lr.states[st.sink.slot(k)];
      for (int id : ls.cached) st.sink.free(id);
      ls.cached.clear();
    });
  });
}

/// Frees the embedding list's tensors that live until the decoder stack returns.
void free_shared(StepRun& st, ListState& e, bool checkpoint_inputs) {
  // tensors the decoder stack shares (the eager causal mask) die when it returns; under
  // checkpointing each checkpoint keeps those it is given as inputs of its recomputation
  // until the backward of the stack is over (torch.utils.checkpoint saves its tensor inputs)
  const OpList& emb_l = st.lists.embedding;
  for (size_t i = 0; i < emb_l.size(); ++i)
    if (emb_l[i].dies_after == "decoder_end" && e.ids[i] >= 0 && (checkpoint_inputs || !emb_l[i].checkpoint_input))
      st.sink.free(e.ids[i]), e.ids[i] = -1;
}

/// The decoder's backward, last layer first, from the head's input gradient `grad`; returns the
/// gradient flowing into the embedding list. The first micro-batch keeps each layer's weight
/// gradients until zero_grad.
int layers_backward(StepRun& st, int grad, WeightGrads wg, bool first_micro) {
  Sink& sink = st.sink;
  const StepSetup& s = st.s;
  each_run(st, true, [&](LayerRun& lr) {
    const Resolved& r = lr.layers->r;
    sink.repeat(lr.count, [&](u64 k) {
      ListState& ls = lr.states[sink.slot(lr.count - 1 - k)];
      auto recompute = [&] {
        const int input = ls.ids[0];
        std::vector<int> grads = std::move(ls.weight_grads);
        ls = recompute_forward(sink, r, input);
        ls.weight_grads = std::move(grads);
      };
      grad = s.checkpointing ? backward(sink, r, ls, grad, wg, recompute) : backward(sink, r, ls, grad, wg);
      if (first_micro) lr.grads[sink.slot(lr.count - 1 - k)] = ls.weight_grads;
    });
  });
  return grad;
}

/// A tied embedding's weight: lm_head's gradient (the head's state `h`) and the embedding's meet.
void meet_tied_gradients(StepRun& st, const ListState& h, bool first_micro) {
  Sink& sink = st.sink;
  const StepSetup& s = st.s;
  // the tied weight's two gradients meet in its AccumulateGrad's input buffer: the
  // embedding's dense gradient and lm_head's are summed out of place (peak_dump.py on
  // gemma2/h384-L2-V32000: mm + embedding_dense_backward + add, each [V, h]); the sum
  // becomes the .grad in the first micro-batch and is added into it in a later one
  const u64 vh = mul(s.dims.v, s.dims.h, s.dtypes.model);
  const int dense = sink.alloc(vh, kDenseEmbedGrad);
  const int sum = sink.alloc(vh, kTiedGrad);
  sink.free(dense);
  if (first_micro) {
    sink.retag(sum, Part::Gradients);  // AccumulateGrad makes the sum the .grad
    auto head_grad = std::find(st.outer_grads.begin(), st.outer_grads.end(), h.weight_grads.front());
    sink.free(*head_grad);
    *head_grad = sum;
  } else {
    sink.free(h.weight_grads.front());
    sink.free(sum);
  }
}

/// One micro-batch: the batch, the forward of every list, the loss's backward seed, the backward of
/// every list, and the frees of what lived until the backward's end.
void micro_batch(StepRun& st, u64 step, u64 micro) {
  Sink& sink = st.sink;
  const StepSetup& s = st.s;
  const OpList &emb_l = st.lists.embedding, &head_l = st.lists.head;
  sink.phase(Phase::Forward);
  const int ids = sink.alloc(mul(s.dims.b, s.dims.s, 8), kInputIds);
  if (step == 0 && micro == 0)
    for (u64 w : s.workspaces) sink.alloc(w, kWorkspace);  // kept by the cuBLAS handle (PyTorch creates them
                                                            // at the first matmul, a few tensors later)
  ListState e = forward(sink, st.emb, -1, false, false);
  const int carried = layers_forward(st, e.out);
  free_shared(st, e, !s.checkpointing);
  ListState h = forward(sink, st.head, carried, false, false);
  if (s.checkpointing) free_autocast_cache(st);
  // loss.backward() seeds the backward with ones_like(loss), a 0-d fp32 tensor held until the
  // backward returns (torch/autograd/__init__.py _make_grads)
  const int seed = sink.alloc(4, Part::LogitsLoss, "loss.grad_seed");
  const bool tied = s.tied_embeddings && s.layer.full;
  const WeightGrads wg{micro == 0}, head_wg{micro == 0, tied ? st.tied_head : kKeep};
  sink.phase(Phase::Backward);
  int grad = backward(sink, st.head, h, -1, head_wg);
  if (micro == 0)
    for (int g : h.weight_grads) st.outer_grads.push_back(g);
  grad = layers_backward(st, grad, wg, micro == 0);
  free_shared(st, e, true);
  grad = backward(sink, st.emb, e, grad, wg);
  for (size_t i = 0; i < emb_l.size(); ++i)  // a leaf its AccumulateGrad held (embedding_leaf_until_backward_end)
    if (emb_l[i].dies_after == "backward_end" && e.ids[i] >= 0) sink.free(e.ids[i]), e.ids[i] = -1;
  if (micro == 0)
    for (int g : e.weight_grads) st.outer_grads.push_back(g);
  if (tied && !h.weight_grads.empty()) meet_tied_gradients(st, h, micro == 0);
  sink.free(grad);
  sink.free(seed);
  for (size_t i = 0; i < head_l.size(); ++i)  // what the loop held until its backward ran (the loss)
    if (head_l[i].dies_after == "backward_end" && h.ids[i] >= 0) sink.free(h.ids[i]);
  sink.free(ids);
}

/// The optimizer's step (its state at the first step), then every weight gradient freed.
void optimizer_step_and_zero_grad(StepRun& st, u64 step) {
  Sink& sink = st.sink;
  sink.phase(Phase::OptimizerStep);
  optimizer_step(sink, st.s, st.op, st.lead, st.module_layers, step == 0);
  // zero_grad(set_to_none=True)
  for (int g : st.outer_grads) sink.free(g);
  st.outer_grads.clear();
  each_run(st, false, [&](LayerRun& lr) {
    sink.repeat(lr.count, [&](u64 k) {
      for (int g : lr.grads[sink.slot(k)]) sink.free(g);
      lr.grads[sink.slot(k)].clear();
    });
  });
}

/// Everything a run allocates, in order.
void run(Sink& sink, const StepSetup& s) {
  StepRun st(sink, s);
  resolve_step(st);
  allocate_parameters(st);
  for (u64 step = 0; step < s.steps; ++step) {
    for (u64 micro = 0; micro < s.accumulation; ++micro) micro_batch(st, step, micro);
    optimizer_step_and_zero_grad(st, step);
  }
}

std::string_view freed_after(const OpList& l, size_t i) {
  const TensorOp& t = l[i];
  if (t.saved) return {};
  if (outlives_list(t.dies_after)) return t.dies_after;
  if (t.dies_after == t.name) return t.name;  // dies where it is made
  size_t at = i + 1;
  for (size_t j = i + 1; j < l.size() && !t.dies_after.empty(); ++j)
    if (l[j].name == t.dies_after) {
      at = j;
      break;
    }
  return l[std::min(at, l.size() - 1)].name;
}

/// The order of backward(): from the last entry to the first, the skip gradient of a residual
/// summed where it lands, the weight gradient, the input gradient.
std::vector<BackwardRow> backward_rows(const StepSetup& s, const OpList& l) {
  std::vector<BackwardRow> rows;
  for (size_t i = l.size(); i-- > 0;) {
    const TensorOp& t = l[i];
    for (size_t j = i + 1; j < l.size(); ++j)
      if (l[j].residual_of == t.name)
        rows.push_back({std::string(t.name) + ".grad_sum", bytes_of(s, t.shape, t.sums_first ? t.dtype : Dt::Model)});
    if (const u64 w = bytes_of(s, t.weight, t.weight_dtype); w > 0) rows.push_back({std::string(t.name) + ".weight_grad", w});
    if (const u64 g = bytes_of(s, t.grad_input, t.grad_dtype); g > 0)
      rows.push_back({std::string(t.name) + ".grad_input", g});
  }
  return rows;
}

ListTable list_table(const StepSetup& s, std::string_view name, const OpList& l) {
  ListTable table{name, {}, backward_rows(s, l)};
  for (size_t i = 0; i < l.size(); ++i) {
    const TensorOp& t = l[i];
    const u64 n = t.shape.elements(s.dims), e = s.dtypes.of(t.dtype);
    if (t.op == "carried" || n == 0) continue;  // created by the previous list, or nothing (the loss)
    table.forward.push_back({t.name, t.op, n, e, mul(n, e), t.saved, freed_after(l, i)});
  }
  return table;
}

/// The run the lists describe: the Hugging Face Trainer's step (logits dropped before backward,
/// zero_grad(set_to_none=True), the whole-vocabulary loss) with none of the runtime variants.
bool runtime_modelled(const Runtime& rt) {
  return rt.framework == Framework::Transformers && rt.drop_outputs_before_backward && rt.zero_grad_to_none &&
         !rt.use_cache_in_training && rt.loss_chunks == 0 && !rt.optimizer_in_backward && !rt.activation_offloading &&
         !rt.compile;
}


/// One decoder layer's list for a group's choices, with the edits every family's layer gets.
OpList layer_list(const StepSetup& s, const LayerSetup& ls) {
  OpList l = s.lists->layer(ls);
  // F.softmax(x, dtype=torch.float32) of half scores, in any family's eager list that casts the
  // probabilities back ("attn.probs_half"): aten copies x to fp32 first (edit_softmax_of_half_scores;
  // the tracker's trace of tuning case opt/h128-L2-V1024/full/bf16/gc/eager/b4s512/adamw holds the
  // softmax, its output's gradient and its input's, three fp32 [b, heads, s, s], at its peak; it and
  // qwen2/h128-L2-V1024/full/bf16/gc/eager/b4s512/adamw read -30 % and -26 % without them)
  edit_softmax_of_half_scores(l, ls.softmax_half_to_float);
  return l;
}

}  // namespace

StepLists step_lists(const StepSetup& s) {
  StepLists l{s.lists->embedding(s.layer), s.lists->head(s.layer), {}};
  if (s.groups.empty()) l.layers.push_back({"layer", layer_list(s, s.layer), s.layers, 0});
  for (size_t g = 0; g < s.groups.size(); ++g) {
    const size_t kind = s.groups[g].kind;
    const auto same = std::find_if(l.layers.begin(), l.layers.end(), [&](const StepLists::Layers& x) {
      return kind != StepSetup::Group::kNoKind && x.kind == kind;
    });
    l.layers.push_back({s.groups[g].name, same != l.layers.end() ? same->list : layer_list(s, s.groups[g].layer),
                        s.groups[g].count, g, kind});
  }
  // The lists' dropout is the CPU path (a bernoulli_ noise tensor in the input's dtype, then a
  // mul). On CUDA F.dropout runs the fused native_dropout, which saves a bool mask instead
  // (aten/src/ATen/native/Dropout.cpp: is_fused_kernel_acceptable for CUDA inputs; the estimator's
  // dropout_mask counts 1 byte there too). Not measured on a GPU.
  auto fused_dropout = [](OpList& list) {
    for (TensorOp& t : list)
      if (t.op == "bernoulli_") t.dtype = Dt::Bool, t.op = "native_dropout";
  };
  if (s.round_512) {
    fused_dropout(l.embedding), fused_dropout(l.head);
    for (StepLists::Layers& d : l.layers) fused_dropout(d.list);
  }
  // the logits and what the loss makes of them (their fp32 copy, a family's capping, the labels, the
  // log-probabilities), from the head's "logits" entry on, count as logits_loss, as their gradients do
  for (auto it = position(l.head, "logits"); it != l.head.end(); ++it) it->part = Part::LogitsLoss;
  // tied embeddings: the head's backward creates the shared weight's gradient; the embedding's
  // backward accumulates into it in place
  if (s.tied_embeddings)
    for (TensorOp& t : l.embedding)
      if (t.name == "embed.out") t.weight = kNone;
  // LoRA: the embeddings are frozen (PEFT trains only the adapters), so their backward makes no
  // weight gradient
  if (!s.layer.full)
    for (TensorOp& t : l.embedding) t.weight = kNone, t.bias = kNone;
  // LoRA without checkpointing: the first layer's input needs no gradient (PEFT calls
  // enable_input_require_grads only for checkpointing), so that layer has its own list
  if (!s.layer.full && !s.checkpointing && !l.layers.empty() && l.layers.front().count > 0) {
    StepLists::Layers first{"first_layer", l.layers.front().list, 1, l.layers.front().group, StepSetup::Group::kNoKind};
    s.lists->input_needs_no_grad(first.list);
    --l.layers.front().count;
    l.layers.insert(l.layers.begin(), std::move(first));
  }
  return l;
}

std::vector<ListTable> tensor_tables(const StepSetup& s) {
  const StepLists l = step_lists(s);
  const std::vector<StepSetup> setups = group_setups(s);
  std::vector<ListTable> t{list_table(s, "embedding", l.embedding)};
  u64 first = 0;
  for (const StepLists::Layers& d : l.layers) {
    if (d.count == 0) continue;
    t.push_back(list_table(setups.empty() ? s : setups[d.group], d.name, d.list));
    t.back().first = first, t.back().count = d.count;
    first += d.count;
  }
  t.push_back(list_table(s, "head", l.head));
  return t;
}

namespace {

/// The one table from a model family to its lists: the family's lists (kLlamaLists: the
/// Llama-like lists, which apply the family's `edits`, layer_ops_rms.cpp / layer_ops_moe.cpp; the
/// LayerNorm families' own lists, layer_ops_layernorm.cpp), what its setup needs beyond the
/// Llama fields, and which runs the lists describe.
struct FamilyRow {
  std::string_view family;
  const FamilyLists* lists;
  const FamilyEdits* edits;                     ///< edits of the Llama-like lists (nullptr: none)
  void (*complete)(const Request&, StepSetup&);  ///< nullptr: nothing beyond the Llama fields
  bool autocast = false;                        ///< the autocast edit covers it (amp_bf16 / amp_fp16)
  bool all_linear_lora_only = false;  ///< LoRA only on every Linear (the lists name no q/v-only variant)
  bool hidden_dropout = false;        ///< the lists model residual and embedding dropout (p > 0)
  /// LoRA under checkpointing is described (false: the backward of a checkpointed LoRA layer piles up
  /// more than the gradient chain of the lists holds)
  bool lora_checkpointed = true;
  bool attention_dropout = false;  ///< the lists model attention dropout (p > 0)
  /// layer groups that differ only in their attention window are one list (GPT-Neo's local layers
  /// read another causal bias buffer; their tensors are the global layers')
  bool windows_alike = false;
  /// NoPE layers (no rotary) are described by the RoPE layers' list (SmolLM3, see its row)
  bool nope_as_rope = false;
  /// the lists cap the scores and the logits (Gemma2); a model that caps them is not covered
  /// by lists that do not
  bool softcapping = false;
  /// checkpointing with gradient accumulation is described (false: a later micro-batch's forward,
  /// run beside every kept gradient, is the step's peak, and the family's checkpointed forward is
  /// not described tensor by tensor)
  bool accumulation_checkpointed = true;
  /// the decoder's layer groups may differ (DeepSeek-V3's dense layers, then its MoE layers): each
  /// ModelSpec group becomes a StepSetup group with its own list (LayerSetup::moe), sizes and parameters
  bool grouped = false;
  /// eager attention is described (false: the family's edits write only SDPA)
  bool eager = true;
  /// a grouped decoder's groups may also differ in their rotary (NoPE layers) and their attention
  /// chunk (Llama 4): the family's lists read LayerSetup::nope / qk_l2_norm / window_mask per group
  bool rope_and_chunk_groups = false;
  /// SDPA on CUDA is described (false: the lists write CPU's math path, where CUDA runs the
  /// memory-efficient kernel, which takes q/k and v of different head dims: sdp_utils.cpp
  /// check_head_dim_size_mem_efficient)
  bool cuda_sdpa = true;
};

constexpr FamilyRow kFamilies[] = {
    {"llama", &kLlamaLists, nullptr, nullptr, true},
    {"mistral", &kLlamaLists, nullptr, nullptr, true},
    {"qwen2", &kLlamaLists, nullptr, nullptr, true},
    {"qwen3", &kLlamaLists, &kQwen3Edits, nullptr, true},
    // SmolLM3: the Llama layer; every 4th layer is NoPE (no_rope_layers), described by the RoPE
    // list: it keeps the same bytes for backward (attention keeps the projections instead of the
    // rotated copies) and makes a subset of its temporaries (the 4 smollm3 records of
    // cpu-suite-families.jsonl, 4 layers each: schedule within 0.01 %)
    {.family = "smollm3", .lists = &kLlamaLists, .edits = nullptr, .complete = nullptr, .nope_as_rope = true},
    {"olmo2", &kLlamaLists, &kOlmo2Edits, nullptr},
    {"phi3", &kLlamaLists, &kPhi3Edits, nullptr},
    {"gemma", &kLlamaLists, &kGemmaEdits, nullptr},
    {.family = "gemma2", .lists = &kLlamaLists, .edits = &kGemma2Edits, .complete = nullptr, .softcapping = true},
    // Gemma3 (model_type gemma3_text): sliding and global layers differ in their window only, so
    // (as Gemma2) eager attention is covered, SDPA with a window shorter than the sequence is not;
    // no softcapping (Gemma3TextConfig's final_logit_softcapping is None in Gemma 3's configs)
    {"gemma3_text", &kLlamaLists, &kGemma3Edits, nullptr},
    {"mixtral", &kLlamaLists, &kMixtralEdits, nullptr},
    // gpt-oss: sliding and full layers differ in their window only: eager attention (its only
    // kernel with sinks) is one list; MoE: full fine-tuning
    {"gpt_oss", &kLlamaLists, &kGptOssEdits, nullptr},
    {"qwen2_moe", &kLlamaLists, &kQwen2MoeEdits, nullptr},
    {"qwen3_moe", &kLlamaLists, &kQwen3MoeEdits, nullptr},
    // DeepSeek-V3: MLA, first_k_dense_replace dense layers then MoE layers (a grouped decoder); its
    // SDPA runs the CPU math path (q/k and v head dims differ; CUDA's kernel is not described); MoE:
    // full fine-tuning only
    {.family = "deepseek_v3", .lists = &kLlamaLists, .edits = &kDeepseekV3Edits, .complete = nullptr, .grouped = true,
     .cuda_sdpa = false},
    // Llama 4 (text): chunked RoPE layers, NoPE layers, dense and MoE layers interleaved (a grouped
    // decoder of runs of one layer at the suite's interleave); MoE: full fine-tuning only. Eager with
    // checkpointing keeps both float masks until the decoder's backward ends, where PyTorch frees the
    // full-attention one after the last NoPE layer's backward (the checkpoints holding it): over by
    // one [b, s, s] mask, +1.7 % on a diagnosis run at s 256 (llama4_text fp32 gc eager, not a record)
    {.family = "llama4_text", .lists = &kLlamaLists, .edits = &kLlama4Edits, .complete = nullptr, .grouped = true,
     .rope_and_chunk_groups = true},
    {"gpt_neox", &kGptNeoxLists, nullptr, &complete_layernorm_setup, false, true},
    {"falcon", &kFalconLists, nullptr, &complete_falcon_setup, false, true},
    {"phi", &kPhiLists, nullptr, &complete_layernorm_setup, false, true, true},
    {"starcoder2", &kStarcoder2Lists, nullptr, &complete_layernorm_setup, false, true, true},
    {"stablelm", &kStableLmLists, nullptr, &complete_layernorm_setup, false, true, true},
    {"gpt2", &kGpt2Lists, nullptr, &complete_layernorm_setup, false, true, true, true, true},
    {"bloom", &kBloomLists, nullptr, &complete_layernorm_setup, false, true, true},
    // GPT-J: the lists model no dropout (attn / resid / embd_pdrop are 0 in GPTJConfig and GPT-J-6B).
    // Checkpointing with accumulation: GPTJBlock returns its attention weights, which the model loop
    // holds through the next block's forward, and a checkpointed forward frees what autograd would
    // have saved at its last use; the lists have neither (the first alone read +7.35 % on tuning case
    // gptj/h128-L2-V2048/full/fp32/gc/eager/b2s512/adamw/gas2, whose peak is micro-batch 2's forward at
    // the scores' division: the previous block's softmax, the scores and their quotient)
    {.family = "gptj", .lists = &kGptjLists, .edits = nullptr, .complete = &complete_gptj_setup,
     .all_linear_lora_only = true, .accumulation_checkpointed = false},
    // CodeGen: LoRA on every Linear only (the lists name no qkv_proj-only variant: the request's
    // q/v targets do not reach it); no dropout modelled (GPT-J's reason)
    {"codegen", &kCodeGenLists, nullptr, &complete_codegen_setup, false, true},
    {"gpt_neo", &kGptNeoLists, nullptr, &complete_layernorm_setup, false, true, true, true, true, true},
    // BioGPT + LoRA + checkpointing: the OPT-like layer's backward misses as OPT's does (-3.2 %)
    {"biogpt", &kBioGptLists, nullptr, &complete_layernorm_setup, false, true, true, false, true},
    {"gpt_bigcode", &kGptBigCodeLists, nullptr, &complete_layernorm_setup, false, true, true, true, true},
    // OPT + LoRA + checkpointing: the recorded trace of opt/lora/fp32/gc/eager peaks in fc2's
    // backward with four [T, i] tensors (relu's output, the adapter's and the frozen base's input
    // gradients, their out-of-place sum); the lists' gradient chain holds three (-4.4 %)
    {"opt", &kOptLists, nullptr, &complete_layernorm_setup, false, true, true, false},
};

const FamilyRow* family_row(std::string_view f) {
  for (const FamilyRow& row : kFamilies)
    if (row.family == f) return &row;
  return nullptr;
}

/// Identical decoder layers: one group, or groups that differ only in their sliding window where
/// attention is eager (its masks are built once for the whole decoder), or in their rotary where
/// the family describes NoPE layers by the RoPE list (`nope_as_rope`).
bool identical_layers(const ModelSpec& m, bool eager, bool nope_as_rope) {
  const LayerGroup& g = m.groups.front();
  return std::all_of(m.groups.begin(), m.groups.end(), [&](const LayerGroup& o) {
    const bool same_linears = std::equal(g.linears.begin(), g.linears.end(), o.linears.begin(), o.linears.end(),
                                         [](const Linear& a, const Linear& b) {
                                           return a.name == b.name && a.in == b.in && a.out == b.out && a.bias == b.bias;
                                         });
    return same_linears && o.other_params == g.other_params && o.moe == g.moe &&
           o.mlp_intermediate == g.mlp_intermediate && (o.rope == g.rope || nope_as_rope) && !o.frozen &&
           (o.sliding_window == g.sliding_window || eager);
  });
}

/// Groups of a grouped decoder: trained, with the first one's attention (the MLP may differ), or
/// with their own rotary and chunk where the family's lists describe them per group.
bool groups_described(const ModelSpec& m, bool rope_and_chunk) {
  return std::all_of(m.groups.begin(), m.groups.end(), [&](const LayerGroup& g) {
    return !g.frozen && g.sliding_window == 0 &&
           (rope_and_chunk || (g.rope == m.groups.front().rope && g.attention_chunk == 0));
  });
}

/// Every layer group has the first one's tensors (they may differ in the attention window only).
bool groups_alike(const ModelSpec& m) {
  for (const LayerGroup& g : m.groups) {
    const LayerGroup& f = m.groups.front();
    if (g.mlp_intermediate != f.mlp_intermediate || g.moe || g.linears.size() != f.linears.size() ||
        g.other_params != f.other_params)
      return false;
  }
  return true;
}

/// The decoder's layers in order, as runs of one group each (ModelSpec::layer_runs; the groups in
/// order where the model has none, or where they do not add up to its groups).
std::vector<ModelSpec::LayerRun> layers_in_order(const ModelSpec& m) {
  std::vector<u64> counted(m.groups.size(), 0);
  bool consistent = !m.layer_runs.empty();
  for (const ModelSpec::LayerRun& run : m.layer_runs)
    if (run.group < m.groups.size()) counted[run.group] += run.count;
    else consistent = false;
  for (size_t g = 0; g < m.groups.size() && consistent; ++g) consistent = counted[g] == m.groups[g].count;
  if (consistent) return m.layer_runs;
  std::vector<ModelSpec::LayerRun> out;
  for (size_t g = 0; g < m.groups.size(); ++g) out.push_back({g, m.groups[g].count});
  return out;
}

/// The sizes the lists' symbols take for one layer group of a request.
Dims group_dims(const Request& r, const LayerGroup& g) {
  const ModelSpec& m = r.model;
  Dims d{r.micro_batch_size, r.sequence_length, m.hidden, mul(m.heads, m.head_dim), mul(m.kv_heads, m.head_dim),
         g.mlp_intermediate, m.heads, m.vocab, r.task == Task::Lora ? r.lora.rank : 0, m.head_dim, m.kv_heads,
         g.experts, g.experts_per_token, g.shared_intermediate};
  if (m.attention == AttentionKind::MultiLatent) {
    // MLA: the latents, the rope part of each head (the k rope part is one head shared by all)
    d.q_lora = m.q_lora_rank, d.kv_lora = m.kv_lora_rank, d.kv_rope = m.qk_rope_head_dim;
    d.kv_b = mul(m.heads, add(m.qk_nope_head_dim, m.v_head_dim)), d.vh = mul(m.heads, m.v_head_dim);
    d.qr = mul(m.heads, m.qk_rope_head_dim), d.kr = m.qk_rope_head_dim;
  }
  d.route_groups = m.router_groups, d.topk_groups = m.router_topk_groups;
  return d;
}

/// The Linears of one layer group as the lists see them: Transformers 5 fuses the routed experts
/// (one gate_up_proj [E, 2i, h] and one down_proj); which ones LoRA adapts.
std::vector<StepSetup::LayerLinear> group_linears(const Request& r, const LayerGroup& g) {
  std::vector<StepSetup::LayerLinear> out;
  bool after_routed_in = false;
  for (const Linear& l : g.linears) {
    const bool target = r.task == Task::Lora && (r.lora.all_linear || std::find(r.lora.targets.begin(),
                                                                                   r.lora.targets.end(), l.name) !=
                                                                         r.lora.targets.end());
    const bool routed_in = l.routed && l.input == LinearInput::MlpIn;
    if (routed_in && after_routed_in) out.back().out = add(out.back().out, mul(l.out, l.copies));
    else out.push_back({l.in, mul(l.out, l.copies), l.bias, target});
    after_routed_in = routed_in;
  }
  return out;
}

/// Whether the request trains with autocast (mixed precision).
bool autocast(const Request& r) { return r.precision == Precision::AmpBf16 || r.precision == Precision::AmpFp16; }

/// Whether LoRA adapts exactly q_proj and v_proj (PEFT's default targets for Llama-like models).
bool lora_targets_qv(const Request& r) {
  return !r.lora.all_linear && r.lora.targets.size() == 2 &&
         std::is_permutation(r.lora.targets.begin(), r.lora.targets.end(), std::vector<std::string>{"q_proj", "v_proj"}.begin());
}

/// Whether the lists describe the request's kind of run: its family, precision, task, a single
/// device, AdamW, the model's layers, its attention kernel, runtime and dropouts.
bool lists_cover_run(const Request& r, const FamilyRow* row) {
  const ModelSpec& m = r.model;
  const bool family = row != nullptr;
  const bool amp = autocast(r);
  const bool precision = r.precision == Precision::Fp32 || r.precision == Precision::Bf16 ||
                         r.precision == Precision::Fp16 || amp;
  const bool task = r.task == Task::Full || r.task == Task::Lora;
  const bool single = r.parallelism.method == ParallelMethod::Single && r.num_gpus <= 1;
  const bool optimizer = r.optimizer == Optimizer::AdamW || r.optimizer == Optimizer::AdamWFused;
  return !(!family || !precision || !task || !single || !optimizer || m.groups.empty() ||
           !(identical_layers(m, r.attention == AttentionImpl::Eager, row->nope_as_rope) ||
             (row->windows_alike && groups_alike(m)) || (row->grouped && groups_described(m, row->rope_and_chunk_groups))) ||
           (r.attention == AttentionImpl::Eager && !row->eager) ||
           (r.attention == AttentionImpl::Sdpa && r.device == Device::Cuda && !row->cuda_sdpa) ||
           r.attention == AttentionImpl::FlashAttention2 || r.frozen_layers > 0 || !runtime_modelled(r.runtime) ||
           (m.attention_dropout > 0 && !row->attention_dropout) ||
           ((m.hidden_dropout > 0 || m.embedding_dropout > 0) && !row->hidden_dropout));
}

/// Whether the lists cover the run's details, given that they cover its kind (lists_cover_run):
/// its LoRA targets, softcapping, checkpointing, masks, autocast, latent attention and experts.
bool lists_cover_details(const Request& r, const FamilyRow& row, bool qv) {
  const ModelSpec& m = r.model;
  if (r.task == Task::Lora && !r.lora.all_linear && (!qv || row.all_linear_lora_only)) return false;
  if (r.task == Task::Lora && r.gradient_checkpointing && !row.lora_checkpointed) return false;
  if ((m.final_logit_softcapping || m.attn_logit_softcapping) && !row.softcapping) return false;
  if (r.gradient_checkpointing && r.gradient_accumulation_steps > 1 && !row.accumulation_checkpointed)
    return false;
  // LoRA dropout keeps a dropped copy of every adapted Linear's input (peft lora/layer.py); the
  // lists have no entry for it (data/measurements/cpu-lora-dropout.jsonl reads 9-19 % above them)
  if (r.task == Task::Lora && r.lora.dropout > 0) return false;
  const LayerGroup& g = m.groups.front();
  // A window (or chunk) no longer than the sequence: SDPA turns the model's bool mask into a float
  // bias in every layer, on CPU and CUDA alike (edit_window_mask). CUDA's memory-efficient kernel
  // pads that bias to a multiple of 8 keys (attention.cpp preprocess_mask); the lists have no
  // padded shape, so such a sequence is left to the engine.
  const bool window_mask = g.local_mask(r.sequence_length);
  const bool any_local_mask = std::any_of(m.groups.begin(), m.groups.end(), [&](const LayerGroup& x) { return x.local_mask(r.sequence_length); });
  if (any_local_mask && r.device == Device::Cuda && r.sequence_length % 8 != 0) return false;
  // autocast: the lists cover full fine-tuning with SDPA (no per-layer mask)
  if (autocast(r) && (!row.autocast || r.task != Task::Full || r.attention != AttentionImpl::Sdpa || window_mask))
    return false;
  // multi-head latent attention: the lists write q through q_a_proj / q_a_layernorm / q_b_proj
  // (q_lora_rank set, as in DeepSeek-V3's configs), not the plain q_proj of q_lora_rank null
  if (m.attention == AttentionKind::MultiLatent && m.q_lora_rank == 0) return false;
  // MoE: the lists cover full fine-tuning (PEFT parametrises fused experts; not written yet)
  if (std::any_of(m.groups.begin(), m.groups.end(), [](const LayerGroup& x) { return x.moe; }) && r.task != Task::Full)
    return false;
  return true;
}

/// The edits of the lists for the request's first layer group: precision, kernel, task, masks.
LayerSetup layer_setup(const Request& r, const FamilyRow& row, bool qv) {
  const ModelSpec& m = r.model;
  const bool amp = autocast(r);
  LayerSetup l;
  l.half = r.precision != Precision::Fp32 && !amp;  // half weights; autocast keeps fp32 weights
  l.eager = r.attention == AttentionImpl::Eager;
  // one K/V head: repeat_kv's reshape merges the size-1 head dim with the stride-0 repeat (a view,
  // modeling_llama.py repeat_kv), which SDPA's kernel takes at any batch (activations.cpp
  // sdpa_flash_attention) and eager's matmul folds into one batch dim without a copy at b = 1 only
  // (torch matmul)
  const bool kv_views = m.kv_heads == 1 && (!l.eager || r.micro_batch_size == 1);
  l.gqa = m.kv_heads < m.heads && !kv_views;
  l.full = r.task == Task::Full;
  l.lora_all = r.task == Task::Lora && r.lora.all_linear;
  l.lora_qv = r.task == Task::Lora && qv;
  l.window_mask = m.groups.front().local_mask(r.sequence_length);
  l.autocast = amp;
  l.one_sequence = r.micro_batch_size == 1;
  l.softmax_half_to_float = r.device == Device::Cuda && r.precision == Precision::Fp16;
  l.family = row.edits;
  l.route_renorm = m.norm_topk_prob;
  return l;
}

/// The layer groups of a grouped family, in layer order, consecutive layers of one kind merged;
/// `layer` is the first group's setup, which each group edits.
std::vector<StepSetup::Group> layer_groups(const Request& r, const LayerSetup& layer) {
  const ModelSpec& m = r.model;
  std::vector<StepSetup::Group> groups;
  for (const ModelSpec::LayerRun& run : layers_in_order(m)) {
    const LayerGroup& x = m.groups[run.group];
    // the list's name says what differs: the MLP, the rotary (the tensor tables and the known
    // mismatches of validate --tensors name lists by it)
    StepSetup::Group sg{x.moe ? (x.rope ? "moe_layer" : "moe_nope_layer") : (x.rope ? "dense_layer" : "dense_nope_layer"),
                        run.count, layer, group_dims(r, x), group_linears(r, x), x.other_params, run.group};
    sg.layer.moe = x.moe;
    sg.layer.nope = !x.rope, sg.layer.qk_l2_norm = x.qk_l2_norm;
    sg.layer.window_mask = x.local_mask(r.sequence_length);
    if (!groups.empty() && groups.back().kind == sg.kind) groups.back().count += run.count;
    else groups.push_back(std::move(sg));
  }
  return groups;
}

}  // namespace

std::optional<StepSetup> step_setup(const Request& r) {
  const ModelSpec& m = r.model;
  const FamilyRow* row = family_row(m.family);
  const bool qv = lora_targets_qv(r);
  if (!lists_cover_run(r, row) || !lists_cover_details(r, *row, qv)) return std::nullopt;
  const LayerGroup& g = m.groups.front();
  StepSetup s;
  s.layer = layer_setup(r, *row, qv);
  s.dims = group_dims(r, g);
  s.dtypes.model = s.layer.half ? 2 : 4;
  s.dtypes.adapter = r.lora.adapter_bytes ? r.lora.adapter_bytes : 4;
  s.layers = m.layers;
  s.checkpointing = r.gradient_checkpointing;
  s.tied_embeddings = m.tied_embeddings;
  for (const Linear& l : g.linears) s.qkv_bias = s.qkv_bias || (l.name == "q_proj" && l.bias);
  s.linears = group_linears(r, g);
  s.norm_params = g.other_params;
  if (row->grouped) s.groups = layer_groups(r, s.layer);
  s.optimizer = r.optimizer == Optimizer::AdamWFused ? StepOptimizer::AdamWFused : StepOptimizer::AdamWForeach;
  s.accumulation = r.gradient_accumulation_steps;
  s.round_512 = r.device == Device::Cuda;
  s.lists = row->lists;
  if (row->complete) row->complete(r, s);
  return s;
}

namespace {

/// A bound on the events of a run, for reserving the trace (a bound too small only regrows it): per
/// list entry, layer, micro-batch and step at most five tensors (its own, its input gradient, a
/// weight and a bias gradient, a sum), each allocated and freed; per parameter tensor and step at
/// most four (the weight, two optimizer states, a temporary), each allocated and freed.
size_t events_bound(const StepSetup& s) {
  const StepLists l = step_lists(s);
  const size_t layers = static_cast<size_t>(s.layers);
  size_t entries = l.embedding.size() + l.head.size(), longest = 0;
  for (const StepLists::Layers& d : l.layers) entries += d.list.size() * static_cast<size_t>(d.count);
  for (const StepSetup& g : group_setups(s)) longest = std::max(longest, layer_params(g).size());
  const size_t params = std::max(longest, layer_params(s).size()) * layers + outer_params(s).size();
  return static_cast<size_t>(s.steps) * (entries * 10 * static_cast<size_t>(s.accumulation) + params * 8);
}

}  // namespace

std::vector<std::int64_t> step_trace(const StepSetup& s, std::vector<std::string>* names) {
  Sink sink(true, false, names != nullptr);
  sink.reserve(events_bound(s));
  run(sink, s);
  if (names) *names = sink.take_names();
  return sink.take_trace();
}

Trace step_trace_with_loops(const StepSetup& s) {
  Sink sink(true, false);
  sink.reserve(events_bound(s));
  run(sink, s);
  Trace t{sink.take_trace(), sink.take_loops()};
  return t;
}

std::string_view phase_name(Phase p) {
  static constexpr std::string_view kNames[kPhases] = {"forward", "loss", "backward", "optimizer_step"};
  return kNames[static_cast<size_t>(p)];
}

StepPeak step_peak(const StepSetup& s) {
  Sink sink(false, s.round_512);
  run(sink, s);
  const Best& b = sink.best();
  return {b.bytes, b.phase, b.parts, b.phases};
}

StepPeak trace_step_peak(const StepSetup& s) {
  Sink sink(true, false, false, true);
  sink.reserve(events_bound(s));
  run(sink, s);
  const std::vector<std::int64_t> trace = sink.take_trace();
  const std::vector<Part>& parts = sink.trace_parts();
  const std::vector<Phase>& phases = sink.trace_phases();
  const std::vector<Sink::Retag>& retags = sink.retags();
  std::vector<Part> now(parts);  // each allocation's component, as retagged so far
  std::vector<u64> sizes;
  u64 live = 0;
  Parts live_parts{};
  StepPeak peak;
  size_t next_retag = 0;
  for (size_t k = 0; k < trace.size(); ++k) {
    for (; next_retag < retags.size() && retags[next_retag].at == k; ++next_retag) {
      const Sink::Retag& t = retags[next_retag];
      const size_t id = static_cast<size_t>(t.id);
      live_parts[static_cast<size_t>(now[id])] -= sizes.at(id);
      live_parts[static_cast<size_t>(t.part)] += sizes[id];
      now[id] = t.part;
    }
    const std::int64_t e = trace[k];
    if (e < 0) {
      const size_t id = static_cast<size_t>(-e - 1);
      live -= sizes.at(id);
      live_parts[static_cast<size_t>(now[id])] -= sizes[id];
      continue;
    }
    const size_t id = sizes.size();
    const u64 b = s.round_512 ? round_up(static_cast<u64>(e), 512) : static_cast<u64>(e);
    sizes.push_back(b);
    live += b;
    live_parts[static_cast<size_t>(now[id])] += b;
    if (live > peak.bytes) peak.bytes = live, peak.parts = live_parts, peak.phase = phases[id];
    u64& in_phase = peak.phase_peaks[static_cast<size_t>(phases[id])];
    in_phase = std::max(in_phase, live);
  }
  return peak;
}

u64 peak_allocated(const StepSetup& s) { return step_peak(s).bytes; }

u64 trace_peak(const std::vector<std::int64_t>& trace, bool round_512) {
  std::vector<u64> sizes;
  u64 live = 0, peak = 0;
  for (std::int64_t e : trace) {
    if (e > 0) {
      const u64 b = round_512 ? round_up(static_cast<u64>(e), 512) : static_cast<u64>(e);
      sizes.push_back(b);
      live += b;
      peak = std::max(peak, live);
    } else if (e < 0) {
      live -= sizes.at(static_cast<size_t>(-e - 1));
    }
  }
  return peak;
}

}  // namespace memfit::sched
