// memfit: the one error type of the core.
//
// Every failure the core can report is a sentence for a person: it names the field or the
// value at fault and says what to do. Adapters (CLI, wasm, page) print `what()` unchanged,
// so the CLI and the page show the same words.
#pragma once

#include <stdexcept>
#include <string>

namespace memfit {

/// Bad input or an estimate that cannot be made. `what()` is the message to show.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A well-formed request for a run that the framework itself refuses or fails on (it raises at
/// start or at its first step). Its own type so that the validator can tell "memfit refuses,
/// and so did PyTorch" (agreement) from a request memfit could not read.
struct Rejected : Error {
  using Error::Error;
};

}  // namespace memfit
