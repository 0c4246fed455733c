// `memfit validate --tensors`: each layer's tensors as PyTorch created them (the workload's
// measure.tensors rows, validate/tensor_log.py) against the core's tensor lists
// (memfit::tensor_lists_json), tensor by tensor.
//
// Per decoder layer k (and the embedding before the layers, the head and loss after them) the
// recorded forward tensors are aligned in order with the list's entries (a pair matches when the
// aten op is the list's op, or one the table in the .cpp says creates it, and the bytes agree).
// Mismatches: missing (a list entry PyTorch did not create), extra (a tensor the list lacks),
// op / size / dtype (paired, but differing), saved (the list keeps it for backward, PyTorch freed
// it in the forward), freed (the list frees it in the forward, PyTorch kept it), freed_at (both free
// it in the forward, after different entries). A checkpointed layer is compared in its
// recomputation (the forward that autograd's saved tensors come from). The backward's creations
// are aligned by bytes: list entries not found are mismatches (bwd_missing); the temporaries the
// lists do not model are counted, not listed.
#pragma once

#include <string>
#include <vector>

#include "validate_common.hpp"

namespace memfit::cli::validate {

struct TensorMismatch {
  std::string list, kind, what;  ///< what: the list entry, or the aten op and dtype of an extra
  std::string detail;            ///< where (layer) and the figures
  [[nodiscard]] std::string key(const std::string& family) const { return family + " " + list + " " + kind + " " + what; }
};

struct TensorCase {
  const Case* c = nullptr;
  bool covered = false;
  std::string reason;  ///< not covered: why
  size_t fwd_matched = 0, fwd_total = 0, bwd_found = 0, bwd_total = 0, bwd_unlisted = 0;
  std::vector<TensorMismatch> mismatches;
};

/// One row per case whose result carries measured.tensors.
std::vector<TensorCase> compare_tensors(const std::vector<Case>& cases);
/// The per-family summary and the mismatches; `known_path` (may be empty) lists mismatches that
/// are understood ("FAMILIES LIST KIND WHAT  # why", one a line; FAMILIES: "*" or a,b,c). Returns how many mismatches of
/// covered cases are not in it.
size_t print_tensor_report(const std::vector<TensorCase>& rows, const std::string& known_path, bool markdown);

}  // namespace memfit::cli::validate
