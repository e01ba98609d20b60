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
  std::string scheme;  // "file", "memory", "redis", "redis+cluster"
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

// `url` with its user info (a password, a user name) replaced by "***", for every place kvtier
// prints, logs or writes a URL (reports, --json, metrics labels, error messages):
//   redis://:s3cret@host:6379?timeout_ms=5  ->  redis://***@host:6379?timeout_ms=5
// The user info is what the URL's own parser takes as one: for redis:// and redis+cluster://
// everything before the last '@' ahead of the query (redis_url.h, which accepts a raw '@' or '/'
// in a password); for other schemes everything before the last '@' of the authority (up to the
// first '/' or '?'), so a file:// path with an '@' in it is shown as it is. Text without "://"
// that holds an '@' (a mistyped URL) keeps only what follows its last '@'. Everything else is
// returned unchanged.
std::string RedactUrl(std::string_view url);

}  // namespace kvtier::storage
