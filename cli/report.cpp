#include "report.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace memfit::cli {

namespace {
double gib(const nlohmann::json& bytes) { return bytes.get<double>() / 1073741824.0; }
std::string count(const nlohmann::json& n) {
  const double v = n.get<double>();
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.1fM", v / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}
std::string thousands(const nlohmann::json& n) {
  std::string digits = std::to_string(n.get<unsigned long long>()), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

/// task "serve": the figures in the order and words of the engine's start-up log.
void print_serving(const nlohmann::json& e) {
  const auto& s = e["serving"];
  const bool vllm = s["engine"] == "vllm";
  std::printf("%s (%s) on %s, %s, TP %s x PP %s (DP %s)\n\n", e["model"].value("id", std::string("inline config")).c_str(),
              e["model"]["model_type"].get<std::string>().c_str(), e["gpu"]["name"].get<std::string>().c_str(),
              s["engine_profile"].get<std::string>().c_str(), s["tensor_parallel_size"].dump().c_str(),
              s["pipeline_parallel_size"].dump().c_str(), s["data_parallel_size"].dump().c_str());
  std::printf("  the instance can use total_gpu_memory (%.2fGiB) x %s (%.3g) = %.2fGiB\n", gib(s["gpu_memory_bytes"]),
              vllm ? "gpu_memory_utilization" : "mem_fraction_static", s["memory_fraction"].get<double>(), gib(s["budget_bytes"]));
  std::printf("  Model loading took %.2f GiB\n", gib(s["weights_bytes"]));
  std::printf("  non-torch memory %.2f GiB; PyTorch activation peak memory %.2f GiB (profile: %s tokens, %s seqs)\n",
              gib(s["non_torch_bytes"]), gib(s["activation_peak_bytes"]), s["max_num_batched_tokens"].dump().c_str(),
              s["max_num_seqs"].dump().c_str());
  std::printf("  Available KV cache memory: %.2f GiB\n", gib(s["kv_cache_bytes"]));
  std::printf("  GPU KV cache size: %s tokens (%s blocks of %s)\n", thousands(s["kv_cache_tokens"]).c_str(),
              thousands(s["num_gpu_blocks"]).c_str(), s["block_size"].dump().c_str());
  std::printf("  Maximum concurrency for %s tokens per request: %.2fx\n", thousands(s["max_model_len"]).c_str(),
              s["max_concurrency"].get<double>());
  std::printf("  CUDA graphs: %.2f GiB (%s)\n", gib(s["cuda_graph_bytes"]),
              s["cuda_graph_in_budget"].get<bool>() ? "inside the budget" : "outside the budget, captured after the KV cache");
  std::printf("  longest max_model_len that fits: %s tokens\n\n", thousands(s["max_model_len_that_fits"]).c_str());
  if (s["fits"].get<bool>()) {
    std::printf("FITS.\n");
  } else {
    std::printf("DOES NOT FIT: %.2f GiB short for one %s-token request.\n", gib(s["shortfall_bytes"]),
                thousands(s["max_model_len"]).c_str());
    for (const auto& f : s["fixes"])
      std::printf("  would fit with %-28s %s tokens, concurrency %.2fx (%s)\n", f["change"].get<std::string>().c_str(),
                  thousands(f["kv_cache_tokens"]).c_str(), f["max_concurrency"].get<double>(), f["detail"].get<std::string>().c_str());
  }
  for (const auto& n : s["notes"]) std::printf("note: %s\n", n.get<std::string>().c_str());
}
}  // namespace

void print_estimate(const nlohmann::json& e) {
  for (const auto& w : e["warnings"]) std::printf("warning: %s\n", w.get<std::string>().c_str());
  if (e.contains("serving")) {
    print_serving(e);
    return;
  }
  const auto& m = e["model"];
  const auto& g = e["per_gpu"];
  const auto& req = e["request"];
  std::printf("%s (%s): %s parameters, %s trainable\n", m.value("id", std::string("inline config")).c_str(),
              m["model_type"].get<std::string>().c_str(), count(e["params"]["total"]).c_str(),
              count(e["params"]["trainable"]).c_str());
  if (req["task"] == "inference")
    std::printf("task inference, %s, %s weights, batch %s x context %s, on %s (%.1f GiB)\n\n",
                req["precision"].get<std::string>().c_str(), req["quantization"].get<std::string>().c_str(),
                req["inference"]["batch_size"].dump().c_str(), req["inference"]["context_length"].dump().c_str(),
                req["gpu"]["name"].get<std::string>().c_str(), gib(g["gpu_memory_bytes"]));
  else
    std::printf("task %s, %s, micro-batch %s x sequence %s, on %s (%.1f GiB)\n\n", req["task"].get<std::string>().c_str(),
                req["precision"].get<std::string>().c_str(), req["micro_batch_size"].dump().c_str(),
                req["sequence_length"].dump().c_str(), req["gpu"]["name"].get<std::string>().c_str(), gib(g["gpu_memory_bytes"]));
  const double total = g["device_total_bytes"].get<double>();
  std::printf("  %-26s %10s %7s\n", "component", "GiB", "share");
  for (const auto& c : g["breakdown"])
    std::printf("  %-26s %10.2f %6.1f%%\n", c["name"].get<std::string>().c_str(), gib(c["bytes"]),
                total > 0 ? 100.0 * c["bytes"].get<double>() / total : 0.0);
  std::printf("\n  %-26s %10.2f   torch.cuda.max_memory_allocated (%s)\n", "peak allocated", gib(g["allocated_peak_bytes"]),
              g.value("allocated_method", std::string("engine")).c_str());
  std::printf("  %-26s %10.2f   torch.cuda.max_memory_reserved (%s)\n", "peak reserved", gib(g["reserved_peak_bytes"]),
              g.value("reserved_method", std::string("approximate rule")).c_str());
  std::printf("  %-26s %10.2f   nvidia-smi\n", "device total", gib(g["device_total_bytes"]));
  std::printf("\npeak during: %s. %s (%.1f%% of the GPU).\n", e["peak_phase"].get<std::string>().c_str(),
              e["fits"].get<bool>() ? "FITS" : "DOES NOT FIT", 100.0 * g["utilization"].get<double>());
  if (e.contains("inference")) {
    const auto& inf = e["inference"];
    std::printf("KV cache: %.3f MiB per token; largest batch at this context: %s; longest context at this batch: %s\n",
                inf["kv_cache_bytes_per_token"].get<double>() / 1048576.0, inf["max_batch_at_context"].dump().c_str(),
                inf["max_context_at_batch"].dump().c_str());
  }
  if (e["cpu_ram_bytes"].get<double>() > 0) std::printf("CPU RAM for offload: %.1f GiB\n", gib(e["cpu_ram_bytes"]));
  for (const auto& n : e["notes"]) std::printf("note: %s\n", n.get<std::string>().c_str());
}

void print_plan(const nlohmann::json& p) {
  if (p.contains("layouts")) {  // task "serve"
    std::printf("%s on %s x %s, serving %s-token requests\n\n", p["model"].value("id", std::string("inline config")).c_str(),
                p["num_gpus"].dump().c_str(), p["gpu"]["name"].get<std::string>().c_str(), thousands(p["context"]).c_str());
    std::printf("  %-68s %12s %12s %12s\n", "layout", "KV tokens", "conc./repl.", "concurrency");
    for (const auto& l : p["layouts"])
      std::printf("  %-68s %12s %12.2f %12.2f%s\n", l["label"].get<std::string>().c_str(),
                  thousands(l["serving"]["kv_cache_tokens"]).c_str(), l["concurrency_per_replica"].get<double>(),
                  l["concurrency_total"].get<double>(), l["fits"].get<bool>() ? "" : "  (does not fit)");
    std::printf("\nrecommendation: %s\n%s\n", p["recommendation"].get<std::string>().c_str(),
                p["tokens_per_s_note"].get<std::string>().c_str());
    return;
  }
  std::printf("%s on %s x %s (%s per node)\n\n", p["model"].value("id", std::string("inline config")).c_str(),
              p["num_gpus"].dump().c_str(), p["gpu"]["name"].get<std::string>().c_str(), p["gpus_per_node"].dump().c_str());
  std::printf("  %-46s %9s %10s %12s %10s\n", "layout", "max batch", "GiB/GPU", "tokens/s", "CPU GiB");
  for (const auto& c : p["candidates"]) {
    if (c["fits"].get<bool>())
      std::printf("  %-46s %9s %10.1f %12.0f %10.1f\n", c["label"].get<std::string>().c_str(), c["max_micro_batch"].dump().c_str(),
                  gib(c["per_gpu"]["device_total_bytes"]), c["tokens_per_s"].get<double>(), gib(c["cpu_ram_bytes"]));
    else
      std::printf("  %-46s %9s %10.1f %12s %10s\n", c["label"].get<std::string>().c_str(), "OOM",
                  gib(c["per_gpu"]["device_total_bytes"]), "-", "-");
  }
  for (const auto& s : p["skipped"])
    std::printf("  %-46s skipped: %s\n", s["label"].get<std::string>().c_str(), s["error"].get<std::string>().c_str());
  std::printf("\nrecommendation: %s\n", p["recommendation_text"].get<std::string>().c_str());
  if (p["nothing_fits"].is_object()) {
    std::printf("single changes (closest layout at micro-batch 1):\n");
    for (const auto& s : p["nothing_fits"]["suggestions"])
      std::printf("  %-52s %-40s %8.1f GiB  %s\n", s["text"].get<std::string>().c_str(), s["layout"].get<std::string>().c_str(),
                  gib(s["per_gpu_bytes"]), s["fits"].get<bool>() ? "fits" : "not enough alone");
  }
  std::printf("LLMem's rule would pick: %s\n", p["llmem_choice"].get<std::string>().c_str());
}

void print_models(const nlohmann::json& list) {
  for (const auto& m : list) {
    if (m.contains("error"))
      std::printf("  %-44s %-14s (partial config: %s)\n", m["id"].get<std::string>().c_str(), "", m["error"].get<std::string>().c_str());
    else
      std::printf("  %-44s %-14s %10s%s\n", m["id"].get<std::string>().c_str(), m["model_type"].get<std::string>().c_str(),
                  count(m["params"]).c_str(), m["partial"].get<bool>() ? "  (partial config)" : "");
  }
}

void print_gpus(const nlohmann::json& list) {
  std::printf("  %-16s %-32s %9s %10s %9s\n", "name", "label", "GiB", "TFLOP/s", "GB/s");
  for (const auto& g : list)
    std::printf("  %-16s %-32s %9.1f %10.0f %9.0f\n", g["name"].get<std::string>().c_str(), g["label"].get<std::string>().c_str(),
                gib(g["memory_bytes"]), g["bf16_tflops"].get<double>(), g["memory_bandwidth_gbs"].get<double>());
}

}  // namespace memfit::cli
