// The JSON boundary: request text in, result text out, errors as {"error": "..."}.
#include "memfit/api.hpp"

#include <nlohmann/json.hpp>
#include <optional>

#include "memfit/error.hpp"
#include "memfit/gpus.hpp"
#include "memfit/intake.hpp"
#include "memfit/library.hpp"
#include "memfit/planner.hpp"
#include "memfit/serving.hpp"
#include "schedule.hpp"

#include "frameworks.hpp"
#include "json_object.hpp"
#include "json_parse.hpp"

namespace memfit {

using nlohmann::json;
using detail::json_object;
using detail::parse_json;

namespace {

constexpr const char* kVersion = "0.1.0";

json parse_text(std::string_view text, const char* what) {
  json j = parse_json(text, false);
  if (j.is_discarded())
    throw Error(std::string(what) + " is not valid JSON: check for a missing comma, quote or bracket");
  return j;
}

json model_json(const ModelSpec& m, const std::string& id) {
  json j = json_object({{"model_type", m.model_type}, {"family", m.family},     {"approximate", m.approximate},
                        {"hidden_size", m.hidden},    {"layers", m.layers},     {"heads", m.heads},
                        {"kv_heads", m.kv_heads},     {"head_dim", m.head_dim}, {"vocab_size", m.vocab},
                        {"tied_embeddings", m.tied_embeddings}, {"notes", m.notes},
                        {"warnings", m.warnings}});
  if (!id.empty()) j["id"] = id;
  u64 experts = 0;
  for (const LayerGroup& g : m.groups) experts = std::max(experts, g.experts);
  if (experts) j["experts"] = experts;
  if (m.attention == AttentionKind::MultiLatent) j["attention"] = "multi-head latent attention";
  return j;
}

json params_json(const ParamCounts& p, u64 trainable) {
  return json_object({{"total", p.total},         {"trainable", trainable}, {"embedding", p.embedding}, {"layers", p.layers},
                      {"lm_head", p.lm_head},     {"other", p.other},       {"active_per_token", p.active_per_token}});
}

/// Runs `f` (a result writer) and turns whatever it throws into {"error": "..."}. One copy of
/// the handlers for every writer: guarded() below passes its lambda through a plain pointer.
std::string run_guarded(json (*f)(const void*), const void* context) {
  try {
    return f(context).dump();
  } catch (const Rejected& e) {
    return json_object({{"error", e.what()}, {"rejected", true}}).dump();
  } catch (const Error& e) {
    return json_object({{"error", e.what()}}).dump();
  } catch (const json::exception& e) {
    return json_object({{"error", std::string("malformed input: ") + e.what()}}).dump();
  } catch (const std::bad_alloc&) {
    return json_object({{"error", "out of memory while estimating: the request is too large"}}).dump();
  } catch (const std::exception& e) {
    return json_object({{"error", std::string("internal error: ") + e.what()}}).dump();
  }
}

template <class F>
std::string guarded(const F& f) {
  return run_guarded([](const void* context) -> json { return (*static_cast<const F*>(context))(); }, &f);
}

/// The request fields a suggestion changes, as a patch to merge into the request.
json suggestion_json(const Suggestion& s) {
  static const char* const kNames[] = {"gradient_checkpointing", "lora", "qlora", "sequence_length", "num_gpus"};
  json patch;
  switch (s.change) {
    case Change::Checkpointing: patch = json_object({{"gradient_checkpointing", true}}); break;
    case Change::Lora: patch = json_object({{"task", "lora"}}); break;
    case Change::Qlora: patch = json_object({{"task", "qlora"}, {"quantization", "nf4"}}); break;
    case Change::SequenceLength: patch = json_object({{"sequence_length", s.value}}); break;
    case Change::NumGpus: patch = json_object({{"num_gpus", s.value}}); break;
  }
  return json_object({{"change", kNames[static_cast<int>(s.change)]}, {"text", s.text}, {"request_patch", patch},
                      {"layout", s.layout}, {"per_gpu_bytes", s.per_gpu_bytes}, {"fits", s.fits}});
}

/// An estimate's "per_gpu" object (also each plan candidate's, which needs nothing else).
json per_gpu_json(const Estimate& e) {
  json breakdown = json::array();
  for (const Component& c : e.breakdown)
    breakdown.push_back(json_object({{"name", c.name}, {"bytes", c.bytes}, {"formula", c.formula}}));
  const double headroom = static_cast<double>(e.gpu_memory_bytes) - static_cast<double>(e.device_total_bytes);
  const double utilization =
      e.gpu_memory_bytes ? static_cast<double>(e.device_total_bytes) / static_cast<double>(e.gpu_memory_bytes) : 0.0;
  return json_object({{"allocated_peak_bytes", e.allocated_peak_bytes},
                      {"reserved_peak_bytes", e.reserved_peak_bytes},
                      {"allocated_method", e.allocated_method},
                      {"reserved_method", e.reserved_method},
                      {"device_total_bytes", e.device_total_bytes},
                      {"gpu_memory_bytes", e.gpu_memory_bytes},
                      {"headroom_bytes", headroom},
                      {"utilization", utilization},
                      {"breakdown", breakdown}});
}

json nothing_fits_json(const Plan& p) {
  if (!p.nothing_fits) return nullptr;
  const NothingFits& nf = *p.nothing_fits;
  json suggestions = json::array();
  for (const Suggestion& s : nf.suggestions) suggestions.push_back(suggestion_json(s));
  return json_object({{"closest", p.candidates[nf.closest].label},
                      {"closest_index", nf.closest},
                      {"missing_bytes", nf.missing_bytes},
                      {"suggestions", suggestions}});
}

}  // namespace

Request request_from_json(const json& request) { return parse_request(request, bundled_config); }

json estimate_to_json(const Estimate& e, const Request& r) {
  json phases = json::array();
  for (const PhasePeak& p : e.phases)
    phases.push_back(json_object({{"phase", p.phase}, {"allocated_bytes", p.allocated_bytes}}));
  json j = json_object({{"version", kVersion},
                        {"model", model_json(r.model, r.model_id)},
                        {"params", params_json(e.params, e.trainable_params)},
                        {"per_gpu", per_gpu_json(e)},
                        {"peak_phase", e.peak_phase},
                        {"phases", phases},
                        {"fits", e.fits},
                        {"cpu_ram_bytes", e.cpu_ram_bytes},
                        {"warnings", e.warnings},
                        {"notes", e.notes},
                        {"request", request_to_json(r)}});
  if (r.task == Task::Inference)
    j["inference"] = json_object({{"kv_cache_bytes", e.inference.kv_cache_bytes},
                                  {"kv_cache_bytes_per_token", e.inference.kv_cache_bytes_per_token},
                                  {"max_batch_at_context", e.inference.max_batch_at_context},
                                  {"max_context_at_batch", e.inference.max_context_at_batch}});
  return j;
}

/// task "serve": the engine's start-up figures per GPU (serving.hpp), no training phases.
json serve_to_json(const Request& r) {
  const ServingEstimate e = serve(r);
  return json_object({{"version", kVersion},
                      {"model", model_json(r.model, r.model_id)},
                      {"params", params_json(count_params(r.model), 0)},
                      {"gpu", json_object({{"name", r.gpu.name}, {"memory_bytes", r.gpu.memory_bytes}})},
                      {"serving", serving_to_json(e)},
                      {"fits", e.fits},
                      {"warnings", warnings_of(r)},
                      {"notes", e.notes},
                      {"request", request_to_json(r)}});
}

std::string estimate_json(std::string_view request_json) {
  return guarded([&] {
    const Request r = request_from_json(parse_text(request_json, "the request"));
    if (r.task == Task::Serve) return serve_to_json(r);
    return estimate_to_json(estimate(r), r);
  });
}

std::string plan_json(std::string_view request_json) {
  return guarded([&] {
    const Request r = request_from_json(parse_text(request_json, "the request"));
    if (r.task == Task::Serve) {
      json j = serve_plan_to_json(plan_serving(r));
      j["version"] = kVersion;
      j["model"] = model_json(r.model, r.model_id);
      j["gpu"] = json_object({{"name", r.gpu.name}, {"memory_bytes", r.gpu.memory_bytes}});
      j["num_gpus"] = r.num_gpus;
      return j;
    }
    const Plan p = plan(r);
    json candidates = json::array();
    for (const PlanCandidate& c : p.candidates) {
      const Parallelism& par = c.parallelism;
      candidates.push_back(json_object({{"label", c.label},
                                        {"method", to_string(par.method)},
                                        {"dp", par.dp},
                                        {"tp", par.tp},
                                        {"pp", par.pp},
                                        {"offload_optimizer", par.offload_optimizer},
                                        {"offload_params", par.offload_params},
                                        {"sequence_parallel", par.sequence_parallel},
                                        {"max_micro_batch", c.max_micro_batch},
                                        {"fits", c.max_micro_batch > 0},
                                        {"per_gpu", per_gpu_json(c.at_max)},
                                        {"peak_phase", c.at_max.peak_phase},
                                        {"step_time_s", c.step_time_s},
                                        {"compute_s", c.compute_s},
                                        {"communication_s", c.communication_s},
                                        {"offload_s", c.offload_s},
                                        {"tokens_per_s", c.tokens_per_s},
                                        {"cpu_ram_bytes", c.at_max.cpu_ram_bytes},
                                        {"grid_device_bytes", c.grid_device_bytes}}));
    }
    json skipped = json::array();
    for (const SkippedLayout& s : p.skipped) skipped.push_back(json_object({{"label", s.label}, {"error", s.error}}));
    json j = json_object({{"version", kVersion},
                          {"model", model_json(r.model, r.model_id)},
                          {"params", params_json(count_params(r.model), 0)},
                          {"gpu", json_object({{"name", r.gpu.name}, {"memory_bytes", r.gpu.memory_bytes}})},
                          {"num_gpus", r.num_gpus},
                          {"gpus_per_node", r.parallelism.gpus_per_node},
                          {"grid_batches", p.grid_batches},
                          {"candidates", candidates},
                          {"recommendation", p.recommended >= 0 ? candidates[static_cast<size_t>(p.recommended)] : json(nullptr)},
                          {"recommendation_text", p.recommendation},
                          {"budget_bytes", p.budget_bytes},
                          {"nothing_fits", nothing_fits_json(p)},
                          {"skipped", skipped},
                          {"llmem_choice", p.llmem_choice},
                          {"assumed_mfu", p.mfu}});
    return j;
  });
}

std::string parse_config_json(std::string_view config_json) {
  return guarded([&] {
    const ModelSpec m = parse_model_config(parse_text(config_json, "config.json"));
    json j = model_json(m, "");
    j["params"] = params_json(count_params(m), 0);
    return j;
  });
}

std::string models_json() {
  return guarded([] {
    json list = json::array();
    for (const BundledModel& b : bundled_models()) {
      json entry = json_object({{"id", b.id}, {"partial", b.partial}});
      try {
        const ModelSpec m = parse_model_config(parse_json(b.config_json));
        entry["model_type"] = m.model_type;
        entry["params"] = count_params(m).total;
      } catch (const Error& e) {
        entry["error"] = e.what();  // partial files may lack a size field
      }
      list.push_back(entry);
    }
    return list;
  });
}

std::string set_library_json(std::string_view library_json) {
  return guarded([&] {
    set_bundled_library(library_json);
    return json_object({{"models", bundled_models().size()}});
  });
}

std::string gpus_json() {
  return guarded([] {
    json list = json::array();
    for (const GpuSpec& g : gpu_catalog())
      list.push_back(json_object({{"name", g.name},
                                  {"label", g.label},
                                  {"memory_bytes", g.memory_bytes},
                                  {"bf16_tflops", g.bf16_tflops},
                                  {"memory_bandwidth_gbs", g.memory_bandwidth_gbs},
                                  {"intra_node_gbs", g.intra_node_gbs},
                                  {"inter_node_gbs", g.inter_node_gbs},
                                  {"host_link_gbs", g.host_link_gbs},
                                  {"bf16", g.bf16},
                                  {"vendor", g.vendor}}));
    return list;
  });
}

std::string defaults_json() {
  return guarded([] {
    // The defaults as the parser resolves them for an example model (framework version,
    // the kernel that runs, LoRA dropout): what a request naming only the model gets.
    const Request r = request_from_json(json_object({{"model", json_object({{"id", "meta-llama/Llama-2-7b-hf"}})}}));
    json engines = json::array();
    for (const EngineProfile& p : engine_profiles())
      engines.push_back(json_object({{"engine", p.engine}, {"label", p.label}, {"first_version", p.first_version},
                                     {"default_block_size", p.default_block_size}, {"source", p.source}}));
    // Each framework row: whether memfit's CPU validator runs that framework's own step.
    json frameworks = json::array();
    for (const FrameworkTraits* t : framework_rows())
      frameworks.push_back(json_object({{"framework", t->name}, {"since_version", t->since_version}, {"modelled_version", t->modelled_version},
                                        {"figures", t->measured_on_cpu ? "measured on CPU (memfit validate runs its own training step)"
                                                           : "defaults read from its source; its training step is not measured"},
                                        {"memory_report", t->memory_report}, {"source", t->source}}));
    return json_object({{"version", kVersion}, {"request", request_to_json(r)}, {"options", request_options()},
                {"serving", serving_setup_to_json(ServingSetup{})}, {"serving_engines", engines},
                {"precision_meaning", precision_meanings()}, {"frameworks", frameworks}});
  });
}

static json tensor_lists_to_json(const Request& r) {
  const std::optional<sched::StepSetup> s = sched::step_setup(r);
  if (!s)
    return json_object({{"covered", false},
                        {"reason", "no tensor list yet for family '" + r.model.family + "' with this precision, task or layout"}});
  json lists = json::array();
  for (const sched::ListTable& t : sched::tensor_tables(*s)) {
    json fwd = json::array(), bwd = json::array();
    for (const sched::TensorRow& e : t.forward)
      fwd.push_back(json_object({{"name", e.name}, {"op", e.op}, {"elements", e.elements}, {"element_bytes", e.element_bytes},
                                 {"bytes", e.bytes}, {"saved", e.saved}, {"freed_after", e.freed_after}}));
    for (const sched::BackwardRow& e : t.backward) bwd.push_back(json_object({{"name", e.name}, {"bytes", e.bytes}}));
    json list = json_object({{"list", t.list}, {"forward", fwd}, {"backward", bwd}});
    if (t.count > 0) list["layers"] = json_object({{"first", t.first}, {"count", t.count}});  // the decoder layers it describes
    lists.push_back(std::move(list));
  }
  return json_object({{"covered", true}, {"layers", s->layers}, {"checkpointing", s->checkpointing}, {"lists", lists}});
}

std::string tensor_lists_json(std::string_view request_json) {
  return guarded([&] { return tensor_lists_to_json(request_from_json(parse_text(request_json, "the request"))); });
}

std::string intake_json(std::string_view input_json) {
  return guarded([&] { return intake(parse_text(input_json, "the intake input")); });
}

}  // namespace memfit
