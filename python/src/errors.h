// python/src/errors.h — turning a kvtier Status into a Python exception.
//
// The core never throws. The binding calls ThrowIfError / Unwrap on every Status and Result it
// gets back; they throw StatusError, which the translator registered by RegisterErrors turns into
// the Python exception class for the status code, with the status message unchanged:
//   InvalidArgument -> kvtier.InvalidArgumentError (a ValueError)
//   OutOfMemory     -> kvtier.OutOfMemoryError     (a MemoryError)
//   NotFound        -> kvtier.NotFoundError        (a LookupError)
//   every other     -> a subclass of kvtier.KvtierError (a RuntimeError)
// All of them derive from kvtier.KvtierError.
//
// Thread safety: the exception classes are created once at import, under the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>
#include <utility>

#include "kvtier/status.h"

namespace kvtier::python {

class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return status_.message().c_str(); }

 private:
  Status status_;
};

// REQUIRES: !status.ok().
[[noreturn]] inline void ThrowStatus(const Status& status) { throw StatusError(status); }

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) ThrowStatus(status);
}

template <typename T>
T Unwrap(Result<T> result) {
  if (!result.ok()) ThrowStatus(result.status());
  return std::move(result).value();
}

// Creates the exception classes as attributes of `m` and registers the translator.
void RegisterErrors(pybind11::module_& m);

}  // namespace kvtier::python
