#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "memfit/api.hpp"
#include "memfit/library.hpp"

using namespace memfit;

namespace {
std::string json_error(const std::string& text) { return nlohmann::json::parse(text).value("error", std::string()); }
}  // namespace

TEST_CASE("the bundled library holds every config of data/configs, partial ones marked", "[library]") {
  size_t files = 0, partial_files = 0;
  const std::filesystem::path dir = std::filesystem::path(MEMFIT_DATA_DIR) / "configs";
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json" && e.path().filename() != "published_param_counts.json") ++files;
  for (const auto& e : std::filesystem::directory_iterator(dir / "partial"))
    if (e.path().extension() == ".json") ++partial_files;
  size_t partial = 0;
  for (const BundledModel& m : bundled_models()) partial += m.partial;
  CHECK(bundled_models().size() == files + partial_files);
  CHECK(partial == partial_files);
  nlohmann::json cfg;
  REQUIRE(bundled_config("mistralai/Mistral-7B-v0.1", cfg));
  CHECK(cfg["model_type"] == "mistral");
  CHECK_FALSE(bundled_config("nobody/nothing", cfg));
}

TEST_CASE("a library handed over at run time (the wasm module's library.json) resolves the same configs", "[library]") {
  // library.json's shape, from the compiled-in library: what cmake/embed_configs.cmake writes
  nlohmann::json list = nlohmann::json::array();
  for (const BundledModel& m : bundled_models())
    list.push_back({{"id", m.id}, {"partial", m.partial}, {"config", nlohmann::json::parse(m.config_json)}});
  const std::string before = estimate_json(R"({"model": {"id": "Qwen/Qwen2.5-7B"}, "task": "lora"})");
  set_bundled_library(list.dump());
  CHECK(bundled_models().size() == list.size());
  CHECK(estimate_json(R"({"model": {"id": "Qwen/Qwen2.5-7B"}, "task": "lora"})") == before);
  nlohmann::json cfg;
  CHECK(bundled_config("qwen/qwen2.5-7b", cfg));
  CHECK_THROWS_WITH(set_bundled_library("{}"), Catch::Contains("JSON array"));
  CHECK(json_error(set_library_json("[{\"partial\": true}]")).find("\"id\"") != std::string::npos);
}
