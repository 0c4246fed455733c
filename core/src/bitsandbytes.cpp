// The bitsandbytes context table (see bitsandbytes.hpp). Each row was read from
// bitsandbytes/autograd/_functions.py at the release or commit named in its `source`.
#include "bitsandbytes.hpp"

#include <array>
#include <optional>
#include <string_view>

#include "memfit/error.hpp"

namespace memfit {

namespace {

// clang-format off
constexpr BnbContext kBnbContexts[] = {
    // 0.39.0 (4ea489d3 "Refactor FP4 into 4Bit and integrate NF4", first tagged in 0.39.1):
    // MatMul4Bit.forward `ctx.tensors = (A, B)` whenever A or B needs a gradient; MatMul8bitLt
    // `ctx.tensors = (CAt, subA, A)`, CAt the int8 transposed quantized input from
    // F.double_quant (subA: the outlier columns, data-dependent and not counted). CUDA only.
    {"0.39.0", "0.39.1 tag (4ea489d3)", true, true, 1, false},
    // 0.43.2: 9e753741 "fix QLoRA mem bug: delete useless buffered activation (#1270)":
    // MatMul4Bit keeps `(None, B)`.
    {"0.43.2", "9e753741 (#1270, released in 0.43.2)", false, true, 1, false},
    // 0.45.0: 81e6345d "LLM.int8() Refactoring: Part 1 (#1401)": CAt is computed only when the
    // weight needs a gradient (int8_double_quant if ctx.needs_input_grad[1]), so a frozen
    // Int8Params keeps (None, subA, A).
    {"0.45.0", "81e6345d (#1401, released in 0.45.0)", false, true, 0, false},
    // 0.46.0: the CPU backend (bitsandbytes/backends/cpu); 0.47.0 adds MatMul8bitFp for CPU/XPU
    // training, which keeps `ctx.A = A` (0.50.2, the validator's release, likewise).
    {"0.46.0", "0.46.0 tag (backends/cpu), 0.47.0-0.50.2 MatMul8bitFp", false, true, 0, true},
};
// clang-format on

/// "0.43.2" -> {0, 43, 2}; nullopt for anything but two or three dot-separated numbers. (A fixed
/// array, parsed in place: every training estimate reads the version.)
std::optional<std::array<long, 3>> version_parts(std::string_view v) {
  std::array<long, 3> out{};
  size_t n = 0, i = 0;
  while (i < v.size() && n < 4) {
    size_t j = i;
    long value = 0;
    for (; j < v.size() && v[j] >= '0' && v[j] <= '9'; ++j) value = value * 10 + (v[j] - '0');
    if (j == i || j - i > 6) return std::nullopt;
    if (n == 3) return std::nullopt;  // a fourth number
    out[n++] = value;
    if (j == v.size()) break;
    if (v[j] != '.') return std::nullopt;
    i = j + 1;
    if (i == v.size()) return std::nullopt;
  }
  if (n < 2) return std::nullopt;
  return out;
}

}  // namespace

const BnbContext& bnb_context(const std::string& version) {
  const std::optional<std::array<long, 3>> v = version_parts(version.empty() ? kBnbDefaultVersion : version);
  if (!v)
    throw Error("request field \"runtime.bitsandbytes_version\" must be a release number MAJOR.MINOR or "
                "MAJOR.MINOR.PATCH, like \"" + std::string(kBnbDefaultVersion) + "\" or \"0.42.0\"; got \"" + version + "\"");
  const BnbContext* found = nullptr;
  for (const BnbContext& row : kBnbContexts)
    if (version_parts(row.since) <= v) found = &row;
  if (!found)
    throw Error("runtime.bitsandbytes_version \"" + version + "\" is older than " + kBnbContexts[0].since +
                ", the first release with 4-bit layers that memfit models: use " + kBnbContexts[0].since + " or newer");
  return *found;
}

}  // namespace memfit
