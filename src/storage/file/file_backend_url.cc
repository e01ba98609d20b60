// OpenFileStorage (file_backend.h): a `file://` URL's directory and options
// (capacity, fsync, io, direct) checked and turned into the backend's Config, then the backend
// opened. Every bad URL is InvalidArgument naming the URL and the option; nothing is created on
// disk before the URL checks out.
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "storage/file/file_backend_internal.h"
#include "storage/storage_url.h"

namespace kvtier::storage {

Result<std::unique_ptr<StorageBackend>> OpenFileStorage(std::string_view url,
                                                        const StorageNamespace& ns,
                                                        const StorageOptions& options) {
  KVTIER_ASSIGN_OR_RETURN(StorageUrl parsed, ParseStorageUrl(url));
  FileBackend::Config config;
  KVTIER_ASSIGN_OR_RETURN(std::optional<int64_t> capacity, parsed.TakeByteSize("capacity"));
  KVTIER_ASSIGN_OR_RETURN(std::optional<bool> fsync, parsed.TakeBool("fsync"));
  const std::optional<std::string> io = parsed.Take("io");
  KVTIER_ASSIGN_OR_RETURN(std::optional<bool> direct, parsed.TakeBool("direct"));
  KVTIER_RETURN_IF_ERROR(parsed.CheckAllTaken(url));
  config.direct = direct.value_or(false);
  const int64_t page_file_bytes = static_cast<int64_t>(kFilePayloadOffset) + ns.page_bytes();
  if (capacity && *capacity < page_file_bytes) {
    return Status::InvalidArgument(fmt::format(
        "storage URL '{}': capacity must hold at least one page file ({} bytes: the page's {} "
        "after its 4 KiB header block); leave it out for a bound derived from the free space",
        url, page_file_bytes, ns.page_bytes()));
  }
  config.capacity = capacity;
  config.fsync = fsync.value_or(false);
  if (io && *io != "uring" && *io != "threads") {
    return Status::InvalidArgument(
        fmt::format("storage URL '{}': io must be uring or threads, got '{}'", url, *io));
  }
#if KVTIER_HAVE_URING
  config.io_uring = io && *io == "uring";
#else
  if (io && *io == "uring") {
    return Status::InvalidArgument(
        fmt::format("storage URL '{}': io=uring, but kvtier was built without liburing", url));
  }
#endif
  std::string root = parsed.rest;
  if (root.empty() || root[0] != '/') {
    return Status::InvalidArgument(fmt::format(
        "storage URL '{}': the file backend needs an absolute path (file:///abs/dir)", url));
  }
  if (root.find("/../") != std::string::npos || root.ends_with("/..")) {
    return Status::InvalidArgument(
        fmt::format("storage URL '{}': the path must not contain '..'", url));
  }
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  config.root = root;
  auto backend =
      std::make_unique<FileBackend>(fmt::format("file://{}", root), ns, options, std::move(config));
  KVTIER_RETURN_IF_ERROR(backend->Open());
  return std::unique_ptr<StorageBackend>(std::move(backend));
}

}  // namespace kvtier::storage
