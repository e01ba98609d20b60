// Internal: the parts of a storage URL ("scheme://rest?name=value&...") and the query parameters
// the backends understand, taken one by one so that an unknown parameter is an error that names
// it.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::storage {

struct StorageUrl {
  std::string scheme;  // before "://": a row of StorageSchemes() (storage_schemes.h) or not
  std::string rest;    // between "://" and "?" (a path, or [user:password@]host:port[,...])
  std::vector<std::pair<std::string, std::string>> params;  // in order; names unique

  // Removes and returns parameter `name`, or nullopt when absent.
  std::optional<std::string> Take(std::string_view name);
  // Removes parameter `name` and parses it as a byte size (ParseByteSize) / a non-negative
  // integer / a boolean (0, 1, true, false). InvalidArgument naming the parameter.
  Result<std::optional<int64_t>> TakeByteSize(std::string_view name);
  Result<std::optional<int64_t>> TakeInt(std::string_view name, int64_t min, int64_t max);
  Result<std::optional<bool>> TakeBool(std::string_view name);
  // InvalidArgument naming the first parameter nobody took, or OK.
  Status CheckAllTaken(std::string_view url_for_messages) const;
};

// Splits `url` at "://" and "?"; parameters are "name=value" joined by '&', percent-decoding
// not supported (values are sizes, numbers and flags). InvalidArgument for a URL without "://",
// with a NUL byte, an empty or repeated parameter name, or a parameter without '='.
Result<StorageUrl> ParseStorageUrl(std::string_view url);

// RedactUrl (a URL without its credentials) is public: kvtier/storage.h.

}  // namespace kvtier::storage
