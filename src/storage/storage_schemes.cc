// The table of storage URL schemes (kvtier/storage_schemes.h): one row per scheme. A backend
// left out of the build keeps its row, with no open function and a line saying what it needs.
//
// Thread safety: an immutable table.
#include "kvtier/storage_schemes.h"

#include <fmt/format.h>

#include <array>

#if KVTIER_HAVE_FILE_BACKEND
#include "storage/file/file_backend.h"
#endif
#if KVTIER_HAVE_MEMORY_BACKEND
#include "storage/memory/memory_backend.h"
#endif
#if KVTIER_HAVE_REDIS_BACKEND
#include "storage/redis/redis_backend.h"
#endif

namespace kvtier {
namespace {

// Each backend's row data: its open function, or null and the line saying which option left it
// out (KVTIER_HAVE_<NAME>_BACKEND comes from its folder's backend.cmake when it is built).
#if KVTIER_HAVE_FILE_BACKEND
constexpr OpenStorageFn kOpenFile = &storage::OpenFileStorage;
constexpr std::string_view kFileMissing = "";
constexpr int64_t kFilePageOverhead = static_cast<int64_t>(storage::kFilePayloadOffset);
#else
constexpr OpenStorageFn kOpenFile = nullptr;
constexpr std::string_view kFileMissing =
    "this build left the file backend out (configure with -DKVTIER_STORAGE_FILE=ON)";
constexpr int64_t kFilePageOverhead = 0;
#endif

#if KVTIER_HAVE_REDIS_BACKEND
constexpr OpenStorageFn kOpenRedis = &storage::OpenRedisStorage;
constexpr std::string_view kRedisMissing = "";
#else
constexpr OpenStorageFn kOpenRedis = nullptr;
constexpr std::string_view kRedisMissing =
    "this build left the redis backend out: it needs hiredis (apt-get install libhiredis-dev) "
    "and -DKVTIER_STORAGE_REDIS=AUTO or ON";
#endif

#if KVTIER_HAVE_MEMORY_BACKEND
constexpr OpenStorageFn kOpenMemory = &storage::OpenMemoryStorage;
constexpr std::string_view kMemoryMissing = "";
#else
constexpr OpenStorageFn kOpenMemory = nullptr;
constexpr std::string_view kMemoryMissing =
    "this build left the memory backend out (configure with -DKVTIER_STORAGE_MEMORY=ON)";
#endif

using Form = StorageUrlForm;
using Baseline = StorageBaseline;

// name, medium in KV events, URL form, the tools' baseline, open, why it is missing, bytes a
// page takes beyond its payload.
constexpr std::array kSchemes = {
    StorageScheme{"file", kMediumDisk, Form::kPath, Baseline::kFiles, kOpenFile, kFileMissing,
                  kFilePageOverhead},
    StorageScheme{"redis", kMediumRedis, Form::kHosts, Baseline::kRedisBenchmark, kOpenRedis,
                  kRedisMissing},
    StorageScheme{"redis+cluster", kMediumRedis, Form::kHosts, Baseline::kRedisBenchmark,
                  kOpenRedis, kRedisMissing},
    StorageScheme{"memory", kMediumMemory, Form::kPath, Baseline::kMemcpy, kOpenMemory,
                  kMemoryMissing},
};

}  // namespace

std::span<const StorageScheme> StorageSchemes() { return kSchemes; }

const StorageScheme* FindStorageScheme(std::string_view name) {
  for (const StorageScheme& s : kSchemes) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string_view StorageUrlScheme(std::string_view url) {
  const size_t sep = url.find("://");
  return sep == std::string_view::npos ? std::string_view{} : url.substr(0, sep);
}

std::string StorageSchemeList() {
  std::string out;
  for (size_t i = 0; i < kSchemes.size(); ++i) {
    if (i > 0) out += i + 1 == kSchemes.size() ? " or " : ", ";
    out += fmt::format("{}://", kSchemes[i].name);
  }
  return out;
}

}  // namespace kvtier
