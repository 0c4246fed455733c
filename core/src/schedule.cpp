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
#include <functional>

#include "memfit/model.hpp"

namespace memfit::sched {

namespace {

/// Receives allocations and frees; `repeat` runs a per-layer loop.
class Sink {
 public:
  Sink(bool record, bool round_512) : record_(record), round_(round_512) {}

  /// The trace sink only records (the peak is the trace's reader's business).
  int alloc(u64 bytes) {
    if (bytes == 0) return -1;
    if (record_) {
      trace_.push_back(static_cast<std::int64_t>(bytes));
      return allocations_++;
    }
    const u64 b = round_ ? round_up(bytes, 512) : bytes;
    sizes_.push_back(b);
    live_ = add(live_, b);
    peak_ = std::max(peak_, live_);
    return static_cast<int>(sizes_.size() - 1);
  }
  void free(int id) {
    if (id < 0) return;
    if (record_) trace_.push_back(-static_cast<std::int64_t>(id) - 1);
    else live_ -= sizes_[static_cast<size_t>(id)];
  }
  /// Runs body(k) for k = 0..n-1 (trace sink), or body(0) once and extrapolates (peak sink).
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
    const u64 before = live_, outer_peak = peak_;
    peak_ = live_;
    body(0);
    const u64 local = peak_ - before;
    const std::int64_t delta = static_cast<std::int64_t>(live_) - static_cast<std::int64_t>(before);
    const u64 rise = delta > 0 ? mul(static_cast<u64>(delta), n - 1) : 0;
    peak_ = std::max(outer_peak, add(before, add(local, rise)));
    live_ = static_cast<u64>(static_cast<std::int64_t>(before) + delta * static_cast<std::int64_t>(n));
  }
  /// Index of the state slot iteration k uses (the peak sink keeps one slot).
  [[nodiscard]] u64 slot(u64 k) const { return record_ ? k : 0; }
  [[nodiscard]] u64 peak() const { return peak_; }  ///< the peak sink's
  std::vector<std::int64_t> take_trace() { return std::move(trace_); }
  std::vector<Loop> take_loops() { return std::move(loops_); }

 private:
  bool record_, round_;
  std::vector<u64> sizes_;
  std::vector<std::int64_t> trace_;
  std::vector<Loop> loops_;  ///< the per-layer loops of the trace (iterations of equal length)
  int allocations_ = 0;      ///< the trace sink's allocation count
  u64 live_ = 0, peak_ = 0;
};

u64 bytes_of(const StepSetup& s, const Shape& sh, Dt dt) { return mul(sh.elements(s.dims), s.dtypes.of(dt)); }

/// A list resolved for the pass: sizes, and for each entry the index after whose creation it dies.
struct Resolved {
  const OpList* ops = nullptr;
  std::vector<u64> bytes, grad_bytes, weight_bytes;
  std::vector<u64> sum_bytes;   ///< a gradient of the entry's tensor (for residual sums)
  std::vector<size_t> skip_to;  ///< residual adds: the entry their skip gradient reaches
  std::vector<size_t> dies_at;  ///< index of the last consumer; SIZE_MAX: saved or carried out
  std::vector<size_t> death_order;  ///< the entries that die in the forward, by dies_at
};

constexpr size_t kKeep = static_cast<size_t>(-1);

Resolved resolve(const StepSetup& s, const OpList& l) {
  Resolved r;
  r.ops = &l;
  for (size_t i = 0; i < l.size(); ++i) {
    const TensorOp& t = l[i];
    r.bytes.push_back(t.op == "carried" ? 0 : bytes_of(s, t.shape, t.dtype));
    r.grad_bytes.push_back(bytes_of(s, t.grad_input, t.grad_dtype));
    r.weight_bytes.push_back(bytes_of(s, t.weight, t.weight_dtype));
    r.sum_bytes.push_back(bytes_of(s, t.shape, Dt::Model));
    size_t skip = kKeep;
    for (size_t j = 0; j < i && !t.residual_of.empty(); ++j)
      if (l[j].name == t.residual_of) skip = j;
    r.skip_to.push_back(skip);
    size_t at = kKeep;
    if (!t.saved && t.dies_after != "layer_out" && t.dies_after != "decoder_end") {
      at = i + 1;
      for (size_t j = i + 1; j < l.size() && !t.dies_after.empty(); ++j)
        if (l[j].name == t.dies_after) {
          at = j;
          break;
        }
    }
    r.dies_at.push_back(at == kKeep ? kKeep : std::min(at, l.size() - 1));
  }
  for (size_t j = 0; j < l.size(); ++j)
    if (r.dies_at[j] != kKeep) r.death_order.push_back(j);
  std::stable_sort(r.death_order.begin(), r.death_order.end(),
                   [&](size_t a, size_t b) { return r.dies_at[a] < r.dies_at[b]; });
  return r;
}

/// The tensors of one list alive after its forward: id per entry (-1 = none / freed).
struct ListState {
  std::vector<int> ids;
  int out = -1;  ///< the carried output (last entry)
  std::vector<int> weight_grads;
};

/// Forward of one list. `input` is the carried tensor entry 0 stands for ("carried" entries).
/// `checkpointed`: everything but the input dies with the list (torch.utils.checkpoint).
ListState forward(Sink& sink, const Resolved& r, int input, bool checkpointed, bool keep_input) {
  const OpList& l = *r.ops;
  ListState st;
  st.ids.assign(l.size(), -1);
  size_t next_death = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    st.ids[i] = l[i].op == "carried" ? input : sink.alloc(r.bytes[i]);
    for (; next_death < r.death_order.size() && r.dies_at[r.death_order[next_death]] == i; ++next_death) {
      const size_t j = r.death_order[next_death];
      if ((j != 0 || !keep_input) && st.ids[j] >= 0) sink.free(st.ids[j]), st.ids[j] = -1;
    }
  }
  st.out = st.ids.back();
  for (size_t j = 0; j + 1 < l.size(); ++j)
    if (r.dies_at[j] != kKeep && r.dies_at[j] >= l.size() - 1 && st.ids[j] >= 0 && j != 0)
      sink.free(st.ids[j]), st.ids[j] = -1;
  if (checkpointed) {
    for (size_t j = 1; j + 1 < l.size(); ++j)
      if (st.ids[j] >= 0) sink.free(st.ids[j]), st.ids[j] = -1;
  }
  st.ids.back() = -1;  // handed to the next list
  return st;
}

/// Backward of one list: in reverse order, each op creates its input gradient (the incoming one
/// is released), its weight gradient if trained, and releases what it saved.
/// `grad` is the gradient flowing in; returns the one flowing out.
int backward(Sink& sink, const Resolved& r, ListState& st, int grad, bool new_weight_grads) {
  const OpList& l = *r.ops;
  struct Pending {
    size_t target;
    int id;
  };
  std::vector<Pending> pending;  // skip gradients of residual adds, waiting for their branch
  auto held = [&](int id) {
    return std::any_of(pending.begin(), pending.end(), [&](const Pending& p) { return p.id == id; });
  };
  for (size_t i = l.size(); i-- > 0;) {
    for (size_t p = 0; p < pending.size(); ++p) {
      if (pending[p].target != i) continue;
      const int skip = pending[p].id;
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(p));
      if (grad != skip && grad >= 0) {
        const int sum = sink.alloc(r.sum_bytes[i]);  // branch + skip, summed by autograd
        sink.free(skip);
        if (!held(grad)) sink.free(grad);
        grad = sum;
      } else {
        grad = skip;
      }
      break;
    }
    if (r.weight_bytes[i] > 0 && new_weight_grads) st.weight_grads.push_back(sink.alloc(r.weight_bytes[i]));
    if (r.skip_to[i] != kKeep && grad >= 0) pending.push_back({r.skip_to[i], grad});
    if (r.grad_bytes[i] > 0) {
      const int g = sink.alloc(r.grad_bytes[i]);
      if (!held(grad)) sink.free(grad);
      grad = g;
    }
    if (st.ids[i] >= 0) sink.free(st.ids[i]), st.ids[i] = -1;
  }
  for (const Pending& p : pending)
    if (p.id != grad) sink.free(p.id);
  return grad;
}

/// Parameter tensors of one decoder layer, in module order (bytes), and which are trained.
struct ParamTensor {
  u64 bytes = 0;
  bool trained = false;
};

std::vector<ParamTensor> layer_params(const StepSetup& s) {
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
  const u64 m = s.dtypes.model;
  std::vector<ParamTensor> p{{mul(s.dims.v, s.dims.h, m), s.layer.full}, {mul(s.dims.h, m), s.layer.full}};
  if (!s.tied_embeddings) p.push_back({mul(s.dims.v, s.dims.h, m), s.layer.full});
  return p;
}

/// Everything a run allocates, in order.
void run(Sink& sink, const StepSetup& s) {
  OpList emb_l = embedding(s.layer);
  // tied embeddings: the head's backward creates the shared weight's gradient; the embedding's
  // backward accumulates into it in place
  if (s.tied_embeddings) emb_l.back().weight = kNone;
  const OpList layer_l = decoder_layer(s.layer), head_l = head_and_loss(s.layer);
  // LoRA without checkpointing: the first layer's input needs no gradient (PEFT calls
  // enable_input_require_grads only for checkpointing), so that layer has its own list
  const bool first_differs = !s.layer.full && !s.checkpointing && s.layers > 0;
  OpList first_l;
  if (first_differs) first_l = layer_l, edit_input_needs_no_grad(first_l);
  const Resolved emb = resolve(s, emb_l), layer = resolve(s, layer_l), head = resolve(s, head_l);
  const Resolved first = first_differs ? resolve(s, first_l) : Resolved{};
  const std::vector<ParamTensor> lp = layer_params(s), op = outer_params(s);
  // weights: the embedding, the layers, the final norm and head (module order), then the adapters
  for (const ParamTensor& t : op) sink.alloc(t.bytes);
  sink.repeat(s.layers, [&](u64) { for (const ParamTensor& t : lp) sink.alloc(t.bytes); });
  const u64 rest = s.layers - (first_differs ? 1 : 0);  // the identical layers above it
  std::vector<ListState> states(rest);
  ListState state0;
  std::vector<std::vector<int>> layer_grads(rest);
  std::vector<int> outer_grads, outer_state, grads0;
  for (u64 step = 0; step < s.steps; ++step) {
    for (u64 micro = 0; micro < s.accumulation; ++micro) {
      const int ids = sink.alloc(mul(s.dims.b, s.dims.s, 8));  // input_ids (labels: the same tensor)
      if (step == 0 && micro == 0)
        for (u64 w : s.workspaces) sink.alloc(w);  // kept by the cuBLAS handle (PyTorch creates them at
                                                   // the first matmul, a few tensors later)
      ListState e = forward(sink, emb, -1, false, false);
      int carried = e.out;
      if (first_differs) {
        state0 = forward(sink, first, carried, false, false);
        carried = state0.out;
      }
      sink.repeat(rest, [&](u64 k) {
        // checkpointing keeps the layer input (the checkpoint's only saved tensor)
        ListState st = forward(sink, layer, carried, s.checkpointing, s.checkpointing);
        carried = st.out;
        states[sink.slot(k)] = std::move(st);
      });
      // tensors the decoder stack shares (the eager causal mask) die when it returns
      for (size_t i = 0; i < emb_l.size(); ++i)
        if (emb_l[i].dies_after == "decoder_end") sink.free(e.ids[i]), e.ids[i] = -1;
      ListState h = forward(sink, head, carried, false, false);
      int grad = backward(sink, head, h, -1, micro == 0);
      for (int g : h.weight_grads) outer_grads.push_back(g);
      sink.repeat(rest, [&](u64 k) {
        ListState& st = states[sink.slot(rest - 1 - k)];
        if (s.checkpointing) {
          const int input = st.ids[0];
          st = forward(sink, layer, input, false, true);  // recomputation; its output is not kept
          sink.free(st.out);
          st.ids[0] = input;
        }
        grad = backward(sink, layer, st, grad, micro == 0);
        if (micro == 0) layer_grads[sink.slot(rest - 1 - k)] = st.weight_grads;
      });
      if (first_differs) {
        grad = backward(sink, first, state0, grad, micro == 0);
        if (micro == 0) grads0 = state0.weight_grads;
      }
      grad = backward(sink, emb, e, grad, micro == 0);
      for (int g : e.weight_grads) outer_grads.push_back(g);
      sink.free(grad);
      sink.free(ids);
    }
    // optimizer: state at the first step, then the foreach temporaries (one per parameter)
    auto trained = [&](const std::vector<ParamTensor>& ps) {
      std::vector<u64> b;
      for (const ParamTensor& t : ps)
        if (t.trained) b.push_back(t.bytes);
      return b;
    };
    const std::vector<u64> tl = trained(lp), to = trained(op);
    if (step == 0) {
      for (u64 b : to) outer_state.push_back(sink.alloc(b)), outer_state.push_back(sink.alloc(b));
      sink.repeat(s.layers, [&](u64) { for (u64 b : tl) sink.alloc(b), sink.alloc(b); });
    }
    if (s.optimizer == StepOptimizer::AdamWForeach) {
      std::vector<int> tmp;
      for (u64 b : to) tmp.push_back(sink.alloc(b));
      std::vector<std::vector<int>> ltmp(s.layers);
      sink.repeat(s.layers, [&](u64 k) { for (u64 b : tl) ltmp[sink.slot(k)].push_back(sink.alloc(b)); });
      for (int t : tmp) sink.free(t);
      sink.repeat(s.layers, [&](u64 k) { for (int t : ltmp[sink.slot(k)]) sink.free(t); });
    }
    // zero_grad(set_to_none=True)
    for (int g : outer_grads) sink.free(g);
    for (int g : grads0) sink.free(g);
    outer_grads.clear();
    grads0.clear();
    sink.repeat(rest, [&](u64 k) {
      for (int g : layer_grads[sink.slot(k)]) sink.free(g);
      layer_grads[sink.slot(k)].clear();
    });
  }
}

/// The run the lists describe: the Hugging Face Trainer's step (logits dropped before backward,
/// zero_grad(set_to_none=True), the whole-vocabulary loss) with none of the runtime variants.
bool runtime_modelled(const Runtime& rt) {
  return rt.framework == Framework::Transformers && rt.drop_outputs_before_backward && rt.zero_grad_to_none &&
         !rt.use_cache_in_training && rt.loss_chunks == 0 && !rt.optimizer_in_backward && !rt.activation_offloading &&
         !rt.compile;
}

}  // namespace

std::optional<StepSetup> step_setup(const Request& r) {
  const ModelSpec& m = r.model;
  const bool family = m.family == "llama" || m.family == "mistral" || m.family == "qwen2";
  const bool precision = r.precision == Precision::Fp32 || r.precision == Precision::Bf16 ||
                         r.precision == Precision::Fp16;
  const bool task = r.task == Task::Full || r.task == Task::Lora;
  const bool single = r.parallelism.method == ParallelMethod::Single && r.num_gpus <= 1;
  const bool optimizer = r.optimizer == Optimizer::AdamW || r.optimizer == Optimizer::AdamWFused;
  if (!family || !precision || !task || !single || !optimizer || m.groups.size() != 1 ||
      r.attention == AttentionImpl::FlashAttention2 || r.frozen_layers > 0 || !runtime_modelled(r.runtime) ||
      m.attention_dropout > 0 || m.hidden_dropout > 0)
    return std::nullopt;
  const bool qv = !r.lora.all_linear && r.lora.targets.size() == 2 &&
                  std::is_permutation(r.lora.targets.begin(), r.lora.targets.end(),
                                      std::vector<std::string>{"q_proj", "v_proj"}.begin());
  if (r.task == Task::Lora && !r.lora.all_linear && !qv) return std::nullopt;
  const LayerGroup& g = m.groups.front();
  StepSetup s;
  s.layer.half = r.precision != Precision::Fp32;
  s.layer.eager = r.attention == AttentionImpl::Eager;
  s.layer.gqa = m.kv_heads < m.heads;
  s.layer.full = r.task == Task::Full;
  s.layer.lora_all = r.task == Task::Lora && r.lora.all_linear;
  s.layer.lora_qv = r.task == Task::Lora && qv;
  s.layer.window_mask = g.sliding_window > 0 && g.sliding_window < r.sequence_length && r.device == Device::Cpu;
  s.dims = {r.micro_batch_size, r.sequence_length, m.hidden, mul(m.heads, m.head_dim), mul(m.kv_heads, m.head_dim),
            g.mlp_intermediate, m.heads, m.vocab, r.task == Task::Lora ? r.lora.rank : 0, m.head_dim};
  s.dtypes.model = s.layer.half ? 2 : 4;
  s.dtypes.adapter = r.lora.adapter_bytes ? r.lora.adapter_bytes : 4;
  s.layers = m.layers;
  s.checkpointing = r.gradient_checkpointing;
  s.tied_embeddings = m.tied_embeddings;
  for (const Linear& l : g.linears) s.qkv_bias = s.qkv_bias || (l.name == "q_proj" && l.bias);
  s.optimizer = r.optimizer == Optimizer::AdamWFused ? StepOptimizer::AdamWFused : StepOptimizer::AdamWForeach;
  s.accumulation = r.gradient_accumulation_steps;
  s.round_512 = r.device == Device::Cuda;
  return s;
}

std::vector<std::int64_t> step_trace(const StepSetup& s) {
  Sink sink(true, false);
  run(sink, s);
  return sink.take_trace();
}

Trace step_trace_with_loops(const StepSetup& s) {
  Sink sink(true, false);
  run(sink, s);
  Trace t{sink.take_trace(), sink.take_loops()};
  return t;
}

u64 peak_allocated(const StepSetup& s) {
  Sink sink(false, s.round_512);
  run(sink, s);
  return sink.peak();
}

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
