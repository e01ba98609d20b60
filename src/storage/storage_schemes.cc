// The table of storage URL schemes (kvtier/storage_schemes.h): one row per scheme. A backend
// left out of the build keeps its row, with no open function and a line saying what it needs.
//
// Thread safety: an immutable table.
#include "kvtier/storage_schemes.h"

#include <fmt/format.h>

#include <array>

#include "storage/file/file_backend.h"
#include "storage/memory/memory_backend.h"
#if KVTIER_HAVE_REDIS_BACKEND
#include "storage/redis/redis_backend.h"
#endif

namespace kvtier {
namespace {

#if KVTIER_HAVE_REDIS_BACKEND
constexpr OpenStorageFn kOpenRedis = &storage::OpenRedisStorage;
constexpr std::string_view kRedisMissing = "";
#elif KVTIER_HAVE_HIREDIS
constexpr OpenStorageFn kOpenRedis = nullptr;
constexpr std::string_view kRedisMissing = "this build has hiredis but not the redis backend";
#else
constexpr OpenStorageFn kOpenRedis = nullptr;
constexpr std::string_view kRedisMissing =
    "kvtier was built without hiredis (install libhiredis-dev and rebuild)";
#endif

using Form = StorageUrlForm;
using Baseline = StorageBaseline;

// name, medium in KV events, URL form, the tools' baseline, open, why it is missing, bytes a
// page takes beyond its payload.
constexpr std::array kSchemes = {
    StorageScheme{"file", kMediumDisk, Form::kPath, Baseline::kFiles, &storage::OpenFileStorage, "",
                  static_cast<int64_t>(storage::kFilePayloadOffset)},
    StorageScheme{"redis", kMediumRedis, Form::kHosts, Baseline::kRedisBenchmark, kOpenRedis,
                  kRedisMissing},
    StorageScheme{"redis+cluster", kMediumRedis, Form::kHosts, Baseline::kRedisBenchmark,
                  kOpenRedis, kRedisMissing},
    StorageScheme{"memory", kMediumMemory, Form::kPath, Baseline::kMemcpy,
                  &storage::OpenMemoryStorage, ""},
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
