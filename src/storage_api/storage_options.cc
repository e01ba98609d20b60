// The storage API's values: PageStatus names, BatchResult's helpers and StorageOptions (defaults
// from the machine, the field schema, Validate). The backends' shared queue and threads:
// storage_backend.cc; OpenStorage, which opens the backend of a URL's scheme: open_storage.cc.
#include <fmt/format.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "kvtier/storage_backend.h"

namespace kvtier {

const char* PageStatusName(PageStatus status) {
  switch (status) {
    case PageStatus::kOk:
      return "ok";
    case PageStatus::kAbsent:
      return "absent";
    case PageStatus::kCorrupt:
      return "corrupt";
    case PageStatus::kWrongNamespace:
      return "wrong_namespace";
    case PageStatus::kTimedOut:
      return "timed_out";
    case PageStatus::kFailed:
      return "failed";
    case PageStatus::kSkipped:
      return "skipped";
    case PageStatus::kNoSpace:
      return "no_space";
  }
  return "unknown_page_status";
}

int64_t BatchResult::leading_ok() const {
  int64_t n = 0;
  while (n < static_cast<int64_t>(pages.size()) &&
         pages[static_cast<size_t>(n)] == PageStatus::kOk) {
    ++n;
  }
  return n;
}

int64_t BatchResult::count(PageStatus s) const { return std::count(pages.begin(), pages.end(), s); }

BatchResult BatchResult::Failed(Status status, size_t num_pages) {
  BatchResult r;
  r.status = std::move(status);
  r.pages.assign(num_pages, PageStatus::kSkipped);
  return r;
}

int64_t DefaultMinFreeBytes(int64_t fs_bytes) {
  const int64_t size = std::max<int64_t>(fs_bytes, 0);
  return std::max(size / 20, std::min(int64_t{1} << 30, size / 5));
}

int DefaultIoThreads() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 4, 16);
}

namespace {

ConfigSchema<StorageOptions> BuildOptionsSchema() {
  using O = StorageOptions;
  ConfigSchema<O> s;
  s.push_back(IntField<O>("io_threads", Member(&O::io_threads), 0, 64,
                          "the storage backend's I/O threads (reads keep all of them; writes run "
                          "on up to as many more); 0 = the machine's default, "
                          "min(cores, 16) and at least 4 (DefaultIoThreads)"));
  s.push_back(IntField<O>("writers_while_reading", Member(&O::writers_while_reading), 0, 64,
                          "storage threads that may write while reads wait or run (alone, writes "
                          "may use io_threads); 0 = a quarter of io_threads, at least 1"));
  s.push_back(IntField<O>("max_queued_batches", Member(&O::max_queued_batches), 1,
                          "storage calls waiting (reads and writes apart); more are rejected"));
  {
    // A std::chrono::milliseconds: read and written as its count.
    ConfigField<O> f;
    f.name = "timeout_ms";
    f.kind = FieldKind::kInt;
    f.help = "per storage call, from when an I/O thread takes it, in ms";
    // Past 10 minutes a deadline (now + timeout) is no bound a caller can wait for, and near
    // 2^63 it overflows into the past.
    f.int_min = 1;
    f.int_max = 600'000;
    f.get_int = [](const O& o) { return static_cast<int64_t>(o.timeout.count()); };
    f.set_int = [](O& o, int64_t v) { o.timeout = std::chrono::milliseconds(v); };
    s.push_back(std::move(f));
  }
  s.push_back(IntField<O>("max_batch_pages", Member(&O::max_batch_pages), 1, int64_t{1} << 20,
                          "pages of one backend call; more is refused"));
  s.push_back(IntField<O>("min_free_bytes", Member(&O::min_free_bytes), -1, int64_t{1} << 60,
                          "a file store's free-space floor: under it (whoever fills the disk) "
                          "the store writes nothing and evicts its own oldest pages; -1 = the "
                          "larger of 5 % of the file system and min(1 GiB, 20 % of it), 0 = none"));
  return s;
}

}  // namespace

const ConfigSchema<StorageOptions>& StorageOptionsSchema() {
  static const ConfigSchema<StorageOptions> schema = BuildOptionsSchema();
  return schema;
}

Status StorageOptions::Validate(const FieldNamer& name_of) const {
  if (name_of) return CheckFields(StorageOptionsSchema(), *this, name_of);
  return CheckFields(StorageOptionsSchema(), *this, [](std::string_view field) {
    return fmt::format("storage options: {}", field);
  });
}

}  // namespace kvtier
