// kvtier/status.h — errors as values.
//
// `Status` is the result of an operation that returns nothing; `Result<T>` carries a value or a
// non-OK `Status`. The core never throws: every failure that a caller can cause (bad arguments,
// memory exhaustion, CUDA errors, storage faults) comes back as one of these, with a message that
// names the argument or resource and the offending value.
//
// Thread safety: instances are immutable after construction except through assignment; distinct
// objects may be used from different threads freely.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kvtier {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kOutOfMemory = 3,
  kIOError = 4,
  kCorruption = 5,
  kCudaError = 6,
  kUnavailable = 7,
  kFailedPrecondition = 8,
  kInternal = 9,
};

// Human-readable name of a code ("InvalidArgument", ...).
const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  // OK. Costs one null pointer; no allocation.
  Status() noexcept = default;
  Status(StatusCode code, std::string_view message);

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;
  ~Status() = default;

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string_view msg) {
    return Status(StatusCode::kInvalidArgument, msg);
  }
  static Status NotFound(std::string_view msg) { return Status(StatusCode::kNotFound, msg); }
  static Status OutOfMemory(std::string_view msg) { return Status(StatusCode::kOutOfMemory, msg); }
  static Status IOError(std::string_view msg) { return Status(StatusCode::kIOError, msg); }
  static Status Corruption(std::string_view msg) { return Status(StatusCode::kCorruption, msg); }
  static Status CudaError(std::string_view msg) { return Status(StatusCode::kCudaError, msg); }
  static Status Unavailable(std::string_view msg) { return Status(StatusCode::kUnavailable, msg); }
  static Status FailedPrecondition(std::string_view msg) {
    return Status(StatusCode::kFailedPrecondition, msg);
  }
  static Status Internal(std::string_view msg) { return Status(StatusCode::kInternal, msg); }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return ok() ? StatusCode::kOk : state_->code; }
  // Empty for OK.
  const std::string& message() const;
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  bool IsInvalidArgument() const { return code() == StatusCode::kInvalidArgument; }
  bool IsNotFound() const { return code() == StatusCode::kNotFound; }
  bool IsOutOfMemory() const { return code() == StatusCode::kOutOfMemory; }
  bool IsUnavailable() const { return code() == StatusCode::kUnavailable; }

  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status WithContext(std::string_view prefix) const;

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<State> state_;
};

// A value of type T, or the non-OK Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  // REQUIRES: !status.ok() (an OK status without a value is turned into kInternal).
  Result(Status status) : status_(std::move(status)) {  // NOLINT(runtime/explicit)
    if (status_.ok()) status_ = Status::Internal("Result constructed from OK status without value");
  }
  Result(T value) : value_(std::move(value)) {}  // NOLINT(runtime/explicit)

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace kvtier

#define KVTIER_STATUS_CONCAT_INNER_(a, b) a##b
#define KVTIER_STATUS_CONCAT_(a, b) KVTIER_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (a Status); returns it from the current function when not OK.
#define KVTIER_RETURN_IF_ERROR(expr)                         \
  do {                                                       \
    ::kvtier::Status kvtier_status_tmp_ = (expr);            \
    if (!kvtier_status_tmp_.ok()) return kvtier_status_tmp_; \
  } while (0)

// `lhs = value of expr` (a Result<T>), or returns its Status from the current function.
#define KVTIER_ASSIGN_OR_RETURN(lhs, expr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL_(KVTIER_STATUS_CONCAT_(kvtier_result_, __LINE__), lhs, expr)
#define KVTIER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
