// memfit: what a bitsandbytes quantized Linear keeps in its autograd context, per version, as
// data (bitsandbytes.cpp holds the table).
//
// bitsandbytes' MatMul4Bit / MatMul8bitLt / MatMul8bitFp are torch.autograd.Functions that keep
// tensors as plain attributes of their context (ctx.tensors, ctx.A) rather than through
// save_for_backward, so activation checkpointing's saved-tensor hooks never see them: a
// checkpointed layer still holds them until the Linear's backward. What they hold changed across
// releases.
#pragma once

#include <string>

#include "memfit/checked.hpp"

namespace memfit {

/// What one bitsandbytes release line keeps per quantized Linear whose input requires grad.
struct BnbContext {
  const char* since;             ///< first release of this row (rows ascend)
  const char* source;            ///< the bitsandbytes commit / release the row was read from
  bool four_bit_keeps_input;     ///< MatMul4Bit: the input A, as cast to the compute dtype
  bool int8_keeps_input;         ///< MatMul8bitLt (CUDA) / MatMul8bitFp (CPU): the input A
  u64 int8_transposed_bytes;     ///< MatMul8bitLt on CUDA: its own int8 copy of A^T (CAt), bytes per
                                 ///< input element (0: none kept)
  bool runs_on_cpu;              ///< a CPU backend exists (the validator's device)
};

/// The default of runtime.bitsandbytes_version: the release memfit's CPU suite runs.
inline constexpr const char* kBnbDefaultVersion = "0.50.2";

/// The row for a version "MAJOR.MINOR" or "MAJOR.MINOR.PATCH" ("" = kBnbDefaultVersion). Throws Error naming the accepted
/// form for anything else, and for a version older than the first row.
[[nodiscard]] const BnbContext& bnb_context(const std::string& version);

}  // namespace memfit
