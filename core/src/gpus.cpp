// GPU catalog. Memory sizes are the totals nvidia-smi / rocm-smi report (MiB), throughput and
// bandwidth the vendors' datasheet figures (dense, no sparsity), links the per-GPU one-way
// bandwidth of the usual system of that GPU (HGX NVLink for SXM parts, PCIe otherwise).
//
// cuda_context_bytes: memory used on the device outside PyTorch's caching allocator (CUDA
// context, loaded kernel images, cuBLAS/cuDNN handles): nvidia-smi minus max_memory_reserved.
// Where each value comes from:
// - V100: 1343 MiB, measured in the HF document of the BERT records of data/calibration
//   (perf_train_gpu_one.mdx at transformers 0016acf: nvidia-smi after one small tensor, CUDA 11.x
//   with eager module loading). Those records are tagged role "fit": not evidence for it.
// - every other GPU: NOT measured. No record of data/calibration reports nvidia-smi for these
//   GPUs. The values are assumptions in the range public reports give for lazy module loading
//   (the default since CUDA 11.7 / PyTorch 1.13): 287 MB with lazy loading against 667 MB eager in
//   pytorch/pytorch PR 86509; "around 400MB" (pytorch/pytorch issue 109888); 426 MiB on an RTX
//   6000 Ada with PyTorch 2.10 (unslothai/unsloth-zoo PR 1053); growing with the SM count (107 MiB
//   on an RTX 4060 Ti, 555 MiB on an RTX PRO 6000 Blackwell, ggml-org/llama.cpp PR 23604, without
//   PyTorch). cuBLAS/cuDNN kernels loaded during training add to the bare context, hence the
//   larger figures for the bigger parts. Measure yours (nvidia-smi minus
//   torch.cuda.max_memory_reserved) and pass it as runtime.cuda_context_bytes.
#include "memfit/gpus.hpp"

#include <algorithm>
#include <cctype>

namespace memfit {

namespace {
constexpr u64 MiB = u64{1} << 20;

constexpr GpuSpec kCatalog[] = {
    {"H100-SXM-80GB", "NVIDIA H100 SXM 80GB", 81559 * MiB, 989, 3350, 450, 50, 64, true, 600 * MiB, "nvidia"},
    {"H100-PCIe-80GB", "NVIDIA H100 PCIe 80GB", 81559 * MiB, 756, 2000, 64, 25, 64, true, 600 * MiB, "nvidia"},
    {"H200-141GB", "NVIDIA H200 141GB", 143771 * MiB, 989, 4800, 450, 50, 64, true, 600 * MiB, "nvidia"},
    {"B200-192GB", "NVIDIA B200 192GB", 183359 * MiB, 2250, 8000, 900, 50, 64, true, 700 * MiB, "nvidia"},
    {"A100-80GB", "NVIDIA A100 SXM 80GB", 81920 * MiB, 312, 2039, 300, 25, 32, true, 500 * MiB, "nvidia"},
    {"A100-40GB", "NVIDIA A100 SXM 40GB", 40960 * MiB, 312, 1555, 300, 25, 32, true, 500 * MiB, "nvidia"},
    {"A10G-24GB", "NVIDIA A10G 24GB", 23028 * MiB, 70, 600, 32, 12.5, 32, true, 450 * MiB, "nvidia"},
    {"L4-24GB", "NVIDIA L4 24GB", 23034 * MiB, 121, 300, 32, 12.5, 32, true, 450 * MiB, "nvidia"},
    {"L40S-48GB", "NVIDIA L40S 48GB", 46068 * MiB, 362, 864, 32, 12.5, 32, true, 450 * MiB, "nvidia"},
    {"RTX3090-24GB", "NVIDIA GeForce RTX 3090 24GB", 24576 * MiB, 71, 936, 32, 3, 32, true, 450 * MiB, "nvidia"},
    {"RTX4090-24GB", "NVIDIA GeForce RTX 4090 24GB", 24564 * MiB, 165, 1008, 32, 3, 32, true, 450 * MiB, "nvidia"},
    {"RTX5090-32GB", "NVIDIA GeForce RTX 5090 32GB", 32607 * MiB, 209, 1792, 64, 3, 64, true, 500 * MiB, "nvidia"},
    {"V100-16GB", "NVIDIA V100 SXM2 16GB", 16160 * MiB, 125, 900, 150, 12.5, 16, false, 1343 * MiB, "nvidia"},
    {"V100-32GB", "NVIDIA V100 SXM2 32GB", 32510 * MiB, 125, 900, 150, 12.5, 16, false, 1343 * MiB, "nvidia"},
    {"T4-16GB", "NVIDIA T4 16GB", 15360 * MiB, 65, 320, 16, 3, 16, false, 400 * MiB, "nvidia"},
    {"MI300X-192GB", "AMD Instinct MI300X 192GB", 196592 * MiB, 1307, 5300, 448, 50, 64, true, 600 * MiB, "amd"},
};

struct Alias {
  const char* alias;
  const char* name;
};
constexpr Alias kAliases[] = {
    {"h100", "H100-SXM-80GB"},    {"h100-80gb", "H100-SXM-80GB"}, {"h100-sxm", "H100-SXM-80GB"},
    {"h100-pcie", "H100-PCIe-80GB"}, {"h200", "H200-141GB"},     {"b200", "B200-192GB"},
    {"a100", "A100-80GB"},        {"a100-80g", "A100-80GB"},      {"a100-40g", "A100-40GB"},
    {"a10g", "A10G-24GB"},        {"l4", "L4-24GB"},              {"l40s", "L40S-48GB"},
    {"3090", "RTX3090-24GB"},     {"rtx3090", "RTX3090-24GB"},    {"rtx-3090", "RTX3090-24GB"},
    {"4090", "RTX4090-24GB"},     {"rtx4090", "RTX4090-24GB"},    {"rtx-4090", "RTX4090-24GB"},
    {"5090", "RTX5090-32GB"},     {"rtx5090", "RTX5090-32GB"},    {"v100", "V100-32GB"},
    {"v100-16gb", "V100-16GB"},   {"v100-32gb", "V100-32GB"},     {"t4", "T4-16GB"},
    {"mi300x", "MI300X-192GB"},
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}
}  // namespace

std::span<const GpuSpec> gpu_catalog() { return kCatalog; }

const GpuSpec* find_gpu(const std::string& name) {
  const std::string key = lower(name);
  for (const GpuSpec& g : kCatalog)
    if (lower(g.name) == key) return &g;
  for (const Alias& a : kAliases)
    if (a.alias == key) return find_gpu(a.name);
  return nullptr;
}

}  // namespace memfit
