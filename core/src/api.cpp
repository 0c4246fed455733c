// The JSON boundary: request text in, result text out, errors as {"error": "..."}.
#include "memfit/api.hpp"

#include <nlohmann/json.hpp>

#include "memfit/error.hpp"
#include "memfit/gpus.hpp"
#include "memfit/library.hpp"
#include "memfit/planner.hpp"

namespace memfit {

using nlohmann::json;

namespace {

constexpr const char* kVersion = "0.1.0";

json parse_text(std::string_view text, const char* what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded())
    throw Error(std::string(what) + " is not valid JSON: check for a missing comma, quote or bracket");
  return j;
}

json model_json(const ModelSpec& m, const std::string& id) {
  json j = {{"model_type", m.model_type}, {"family", m.family},     {"approximate", m.approximate},
            {"hidden_size", m.hidden},    {"layers", m.layers},     {"heads", m.heads},
            {"kv_heads", m.kv_heads},     {"head_dim", m.head_dim}, {"vocab_size", m.vocab},
            {"tied_embeddings", m.tied_embeddings}, {"notes", m.notes}};
  if (!id.empty()) j["id"] = id;
  u64 experts = 0;
  for (const LayerGroup& g : m.groups) experts = std::max(experts, g.experts);
  if (experts) j["experts"] = experts;
  if (m.attention == AttentionKind::MultiLatent) j["attention"] = "multi-head latent attention";
  return j;
}

json params_json(const ParamCounts& p, u64 trainable) {
  return {{"total", p.total},         {"trainable", trainable}, {"embedding", p.embedding}, {"layers", p.layers},
          {"lm_head", p.lm_head},     {"other", p.other},       {"active_per_token", p.active_per_token}};
}

template <class F>
std::string guarded(F f) {
  try {
    return f().dump();
  } catch (const Error& e) {
    return json{{"error", e.what()}}.dump();
  } catch (const json::exception& e) {
    return json{{"error", std::string("malformed input: ") + e.what()}}.dump();
  } catch (const std::bad_alloc&) {
    return json{{"error", "out of memory while estimating: the request is too large"}}.dump();
  } catch (const std::exception& e) {
    return json{{"error", std::string("internal error: ") + e.what()}}.dump();
  }
}

}  // namespace

Request request_from_json(const json& request) { return parse_request(request, bundled_config); }

json estimate_to_json(const Estimate& e, const Request& r) {
  json breakdown = json::array();
  for (const Component& c : e.breakdown) breakdown.push_back({{"name", c.name}, {"bytes", c.bytes}, {"formula", c.formula}});
  json phases = json::array();
  for (const PhasePeak& p : e.phases) phases.push_back({{"phase", p.phase}, {"allocated_bytes", p.allocated_bytes}});
  const double headroom = static_cast<double>(e.gpu_memory_bytes) - static_cast<double>(e.device_total_bytes);
  json j = {
      {"version", kVersion},
      {"model", model_json(r.model, r.model_id)},
      {"params", params_json(e.params, e.trainable_params)},
      {"per_gpu",
       {{"allocated_peak_bytes", e.allocated_peak_bytes},
        {"reserved_peak_bytes", e.reserved_peak_bytes},
        {"device_total_bytes", e.device_total_bytes},
        {"gpu_memory_bytes", e.gpu_memory_bytes},
        {"headroom_bytes", headroom},
        {"utilization", e.gpu_memory_bytes ? static_cast<double>(e.device_total_bytes) / static_cast<double>(e.gpu_memory_bytes) : 0.0},
        {"breakdown", breakdown}}},
      {"peak_phase", e.peak_phase},
      {"phases", phases},
      {"fits", e.fits},
      {"cpu_ram_bytes", e.cpu_ram_bytes},
      {"notes", e.notes},
      {"request", request_to_json(r)},
  };
  if (r.task == Task::Inference)
    j["inference"] = {{"kv_cache_bytes", e.inference.kv_cache_bytes},
                      {"kv_cache_bytes_per_token", e.inference.kv_cache_bytes_per_token},
                      {"max_batch_at_context", e.inference.max_batch_at_context},
                      {"max_context_at_batch", e.inference.max_context_at_batch}};
  return j;
}

std::string estimate_json(std::string_view request_json) {
  return guarded([&] {
    const Request r = request_from_json(parse_text(request_json, "the request"));
    return estimate_to_json(estimate(r), r);
  });
}

std::string plan_json(std::string_view request_json) {
  return guarded([&] {
    const Request r = request_from_json(parse_text(request_json, "the request"));
    const Plan p = plan(r);
    json candidates = json::array();
    for (const PlanCandidate& c : p.candidates) {
      const Parallelism& par = c.parallelism;
      Request at = r;
      at.parallelism = par;
      at.micro_batch_size = std::max<u64>(1, c.max_micro_batch);
      json e = estimate_to_json(c.at_max, at);
      candidates.push_back({{"label", c.label},
                            {"method", to_string(par.method)},
                            {"dp", par.dp},
                            {"tp", par.tp},
                            {"pp", par.pp},
                            {"offload_optimizer", par.offload_optimizer},
                            {"offload_params", par.offload_params},
                            {"sequence_parallel", par.sequence_parallel},
                            {"max_micro_batch", c.max_micro_batch},
                            {"fits", c.max_micro_batch > 0},
                            {"per_gpu", e["per_gpu"]},
                            {"peak_phase", e["peak_phase"]},
                            {"step_time_s", c.step_time_s},
                            {"compute_s", c.compute_s},
                            {"communication_s", c.communication_s},
                            {"offload_s", c.offload_s},
                            {"tokens_per_s", c.tokens_per_s},
                            {"cpu_ram_bytes", c.at_max.cpu_ram_bytes},
                            {"grid_device_bytes", c.grid_device_bytes}});
    }
    json j = {{"version", kVersion},
              {"model", model_json(r.model, r.model_id)},
              {"params", params_json(count_params(r.model), 0)},
              {"gpu", {{"name", r.gpu.name}, {"memory_bytes", r.gpu.memory_bytes}}},
              {"num_gpus", r.num_gpus},
              {"gpus_per_node", r.parallelism.gpus_per_node},
              {"grid_batches", p.grid_batches},
              {"candidates", candidates},
              {"recommendation", p.recommended >= 0 ? candidates[static_cast<size_t>(p.recommended)] : json(nullptr)},
              {"recommendation_text", p.recommendation},
              {"llmem_choice", p.llmem_choice},
              {"assumed_mfu", p.mfu}};
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
      json entry = {{"id", b.id}, {"partial", b.partial}};
      try {
        const ModelSpec m = parse_model_config(json::parse(b.config_json));
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

std::string gpus_json() {
  return guarded([] {
    json list = json::array();
    for (const GpuSpec& g : gpu_catalog())
      list.push_back({{"name", g.name},
                      {"label", g.label},
                      {"memory_bytes", g.memory_bytes},
                      {"bf16_tflops", g.bf16_tflops},
                      {"memory_bandwidth_gbs", g.memory_bandwidth_gbs},
                      {"intra_node_gbs", g.intra_node_gbs},
                      {"inter_node_gbs", g.inter_node_gbs},
                      {"host_link_gbs", g.host_link_gbs},
                      {"bf16", g.bf16},
                      {"vendor", g.vendor}});
    return list;
  });
}

std::string defaults_json() {
  return guarded([] {
    Request r;
    r.model_id = "meta-llama/Llama-2-7b-hf";
    r.gpu = {"A100-80GB", find_gpu("A100-80GB")->memory_bytes};
    return json{{"version", kVersion},
                {"request", request_to_json(r)},
                {"options", request_options()},
                {"precision_meaning", precision_meanings()}};
  });
}

}  // namespace memfit
