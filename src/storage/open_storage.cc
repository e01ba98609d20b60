// OpenStorage: the backend of a URL's scheme, from the schemes' table (storage_schemes.cc).
#include <fmt/format.h>

#include "kvtier/storage.h"
#include "kvtier/storage_schemes.h"

namespace kvtier {

Result<std::unique_ptr<StorageBackend>> OpenStorage(std::string_view url,
                                                    const StorageNamespace& ns,
                                                    const StorageOptions& options) {
  KVTIER_RETURN_IF_ERROR(ns.Validate());
  KVTIER_RETURN_IF_ERROR(options.Validate());
  if (url.find("://") == std::string_view::npos) {
    return Status::InvalidArgument(fmt::format("storage URL '{}' has no scheme (expected {})",
                                               RedactUrl(url), StorageSchemeList()));
  }
  const std::string_view name = StorageUrlScheme(url);
  const StorageScheme* scheme = FindStorageScheme(name);
  if (scheme == nullptr) {
    return Status::InvalidArgument(
        fmt::format("storage URL '{}': unknown scheme '{}' (expected {})", RedactUrl(url), name,
                    StorageSchemeList()));
  }
  if (scheme->open == nullptr) {
    return Status::InvalidArgument(
        fmt::format("storage URL scheme '{}': {}", name, scheme->missing));
  }
  return scheme->open(url, ns, options);
}

}  // namespace kvtier
