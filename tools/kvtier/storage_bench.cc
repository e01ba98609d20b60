// tools/kvtier/storage_bench.cc — `kvtier bench --storage URL` (storage_bench.h): the backend's
// rows, kind by kind, beside the platform baselines (storage_bench_baseline.cc) of the same pages
// (storage_bench_pages.h); then per kind the write and read ceilings (the first baseline's Set and
// Get), the backend's ratios to them (alone, and reads and writes at once) and where a Set's time
// went (StorageStats' set_*_seconds).
//
// Thread safety: one thread drives the run; the backend completes calls on its own threads.
#include "storage_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "bench.h"
#include "config_flags.h"
#include "kvtier/page_key.h"
#include "kvtier/storage.h"
#include "kvtier/storage_schemes.h"
#include "redis_baseline.h"
#include "replay_ceiling.h"
#include "storage_bench_baseline.h"
#include "storage_bench_pages.h"
#include "storage_read_profile.h"
#include "storage_write_profile.h"

namespace kvtier::tools {

const PageKind& KindNamed(std::string_view name) {
  return *std::find_if(std::begin(kKinds), std::end(kKinds),
                       [&](const PageKind& p) { return name == p.name; });
}

StorageNamespace NamespaceOf(const PageKind& kind) {
  KvGeometry pages;
  pages.layout = KvLayout::kPageFirst;
  pages.num_layers = kind.num_layers;
  pages.slot_bytes = kind.slot_bytes;
  pages.page_size = kind.page_size;
  pages.head_num = kind.head_num;
  return StorageNamespaceOf(pages, kind.mla,
                            {.model_id = std::string("kvtier-bench/") + kind.model});
}

void Append(OpTimes& to, const OpTimes& from) {
  to.round_seconds.insert(to.round_seconds.end(), from.round_seconds.begin(),
                          from.round_seconds.end());
  to.batch_ms.insert(to.batch_ms.end(), from.batch_ms.begin(), from.batch_ms.end());
  to.reported_p50_ms.insert(to.reported_p50_ms.end(), from.reported_p50_ms.begin(),
                            from.reported_p50_ms.end());
  to.reported_p99_ms.insert(to.reported_p99_ms.end(), from.reported_p99_ms.begin(),
                            from.reported_p99_ms.end());
}

namespace {

// The flag of a StorageOptions field (StorageBenchOptions::storage): --storage-threads,
// --storage-writers-while-reading, --storage-min-free-bytes and --storage-timeout-ms; the fields
// the bench sets itself by their schema name.
std::string StorageBenchFlagOf(std::string_view field) {
  if (field == "io_threads") return "--storage-threads";
  if (field == "min_free_bytes") return "--storage-min-free-bytes";
  if (field == "timeout_ms") return "--storage-timeout-ms";
  if (field == "writers_while_reading") return "--storage-writers-while-reading";
  return fmt::format("storage options: {}", field);
}

// A Set's time as the summary's JSON gives it: the calls' queue and hook times, then the profiled
// pages' phases (SetPhaseSecondsJson).
nlohmann::json SetPhasesJson(const StorageStats& st) {
  nlohmann::json j = SetPhaseSecondsJson(st);
  j["pages"] = st.set_profiled_pages;
  j["calls"] = st.set_calls;
  j["queue"] = st.set_queue_seconds;
  j["hook"] = st.set_seconds;
  j["pages_in_hook"] = st.set_page_seconds;
  return j;
}

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
struct StorageRow {
  std::string kind, op, who;  // who: "kvtier" or the baseline's name
  int64_t pages = 0, page_bytes = 0;
  double gbps = 0, pages_per_s = 0, p50_ms = 0, p99_ms = 0;
  double pct_of_baseline = 0;  // kvtier rows with a baseline
  bool check_ok = true;
  std::string note;
  // A platform baseline that could not be measured (who: its name; note: why). It is shown in a
  // row of its own and never fails the bench: kvtier's rows are checked without it.
  bool baseline_failed = false;
};
// Where the Get calls of one kind of pass spent their time (StorageStats' get_* fields, the
// difference across the pass, summed over rounds): to tell Gets that queue behind writes (queue)
// from Gets that run slower beside them (hook, and threads on their pages).
struct GetProfile {
  int64_t calls = 0;
  double queue_seconds = 0;  // accepted -> taken by an I/O thread (held reads: from release)
  double held_seconds = 0;   // held behind a write of one of its keys
  double hook_seconds = 0;   // inside the hook
  double page_seconds = 0;   // the I/O threads' time on its pages, all threads summed
  // The pages the backend profiled (file://: 1 in 8), their time, its part on a core and its
  // part waiting for a core (-1: the backend does not say): CPU contention or slower reads.
  int64_t profiled_pages = 0;
  double profiled_seconds = 0, profiled_cpu_seconds = 0, profiled_core_wait_seconds = 0;
  bool core_wait_known = true;
  // The pass's time (from its first call to its last completion) and the process's threads' CPU
  // time in it, per thread name: how many cores they had, against the machine's.
  double pass_seconds = 0;
  std::map<std::string, double> cpu_seconds_by_thread;
  void AddCpu(double seconds, const std::map<std::string, double>& by_thread) {
    pass_seconds += seconds;
    for (const auto& [name, cpu] : by_thread) cpu_seconds_by_thread[name] += cpu;
  }
  void Add(const StorageStats& before, const StorageStats& after) {
    calls += after.get_calls - before.get_calls;
    queue_seconds += after.get_queue_seconds - before.get_queue_seconds;
    held_seconds += after.get_held_seconds - before.get_held_seconds;
    hook_seconds += after.get_seconds - before.get_seconds;
    page_seconds += after.get_page_seconds - before.get_page_seconds;
    profiled_pages += after.get_profiled_pages - before.get_profiled_pages;
    profiled_seconds += after.get_profiled_seconds - before.get_profiled_seconds;
    profiled_cpu_seconds += after.get_profiled_cpu_seconds - before.get_profiled_cpu_seconds;
    if (before.get_profiled_core_wait_seconds < 0 || after.get_profiled_core_wait_seconds < 0) {
      core_wait_known = false;
    } else {
      profiled_core_wait_seconds +=
          after.get_profiled_core_wait_seconds - before.get_profiled_core_wait_seconds;
    }
  }
  void Add(const GetProfile& o) {
    calls += o.calls;
    queue_seconds += o.queue_seconds;
    held_seconds += o.held_seconds;
    hook_seconds += o.hook_seconds;
    page_seconds += o.page_seconds;
    profiled_pages += o.profiled_pages;
    profiled_seconds += o.profiled_seconds;
    profiled_cpu_seconds += o.profiled_cpu_seconds;
    profiled_core_wait_seconds += o.profiled_core_wait_seconds;
    core_wait_known = core_wait_known && o.core_wait_known;
    pass_seconds += o.pass_seconds;
    for (const auto& [name, seconds] : o.cpu_seconds_by_thread) {
      cpu_seconds_by_thread[name] += seconds;
    }
  }
};

// Where the Set calls of one kind of pass spent their time (StorageStats' set_* fields, the
// difference across the pass, summed over rounds), and the pass's time: the Set pass alone and
// the Sets of the mixed pass apart (their writers' share differs: all the writers alone, a
// quarter while reads run), and how many threads were on the pages on average (the threads'
// time in the pages over the pass's time): a Set below the write ceiling with its pages as fast
// as the ceiling's is short of threads, one with slower pages pays more per page.
struct SetProfile {
  StorageStats delta;  // the set_* fields only
  double pass_seconds = 0;
  void Add(const StorageStats& before, const StorageStats& after, double seconds) {
    pass_seconds += seconds;
    delta.set_calls += after.set_calls - before.set_calls;
    delta.set_queue_seconds += after.set_queue_seconds - before.set_queue_seconds;
    delta.set_seconds += after.set_seconds - before.set_seconds;
    delta.set_page_seconds += after.set_page_seconds - before.set_page_seconds;
    delta.set_profiled_pages += after.set_profiled_pages - before.set_profiled_pages;
    delta.set_open_seconds += after.set_open_seconds - before.set_open_seconds;
    delta.set_open_dir_seconds += after.set_open_dir_seconds - before.set_open_dir_seconds;
    delta.set_copy_seconds += after.set_copy_seconds - before.set_copy_seconds;
    delta.set_hash_seconds += after.set_hash_seconds - before.set_hash_seconds;
    delta.set_write_seconds += after.set_write_seconds - before.set_write_seconds;
    delta.set_sync_seconds += after.set_sync_seconds - before.set_sync_seconds;
    delta.set_publish_seconds += after.set_publish_seconds - before.set_publish_seconds;
    delta.set_index_seconds += after.set_index_seconds - before.set_index_seconds;
    delta.set_unlink_seconds += after.set_unlink_seconds - before.set_unlink_seconds;
  }
  void Add(const SetProfile& o) {
    StorageStats zero;
    Add(zero, o.delta, o.pass_seconds);
  }
};

// This process's threads' CPU time so far (seconds) per thread name (/proc/self/task/*/comm,
// and the time on a core from schedstat): which threads had the cores during a pass. The I/O
// threads carry the process's name; the file store's reclaimer names its own. Empty where
// /proc does not say.
std::map<std::string, double> CpuSecondsByThreadName() {
  std::map<std::string, double> cpu;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm"), schedstat(task.path() / "schedstat");
    std::string name;
    double on_core_ns = 0;
    if (std::getline(comm, name) && (schedstat >> on_core_ns)) cpu[name] += on_core_ns / 1e9;
  }
  return cpu;
}

// `after` less `before`, name by name (a thread started in between counts from 0).
std::map<std::string, double> CpuSince(const std::map<std::string, double>& before,
                                       std::map<std::string, double> after) {
  for (auto& [name, seconds] : after) {
    if (auto it = before.find(name); it != before.end()) seconds -= it->second;
  }
  return after;
}

// The ceilings of one page kind and the backend's ratios to them, with where a Set's time went
// (printed after the table, and in the JSON's "summary").
struct KindSummary {
  std::string kind;
  int64_t page_bytes = 0;
  std::string ceiling;  // the baseline both ceilings are (empty: none measured)
  double write_ceiling_gbps = 0, read_ceiling_gbps = 0;
  double set_gbps = 0, get_gbps = 0, get_under_set_gbps = 0, set_under_get_gbps = 0;
  StorageStats stats;  // the backend's, at the end of the kind
  GetProfile get_alone, get_mixed;
  SetProfile set_alone, set_mixed;
};

double Ratio(double a, double b) { return b > 0 ? 100.0 * a / b : 0; }

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

StorageRow RowFrom(const std::string& kind, const std::string& op, const std::string& who,
                   int64_t pages, int64_t page_bytes, const OpTimes& t) {
  StorageRow r;
  r.kind = kind;
  r.op = op;
  r.who = who;
  r.pages = pages;
  r.page_bytes = page_bytes;
  const double s = Median(t.round_seconds);
  if (s > 0) {
    r.gbps = static_cast<double>(pages * page_bytes) / s / 1e9;
    r.pages_per_s = static_cast<double>(pages) / s;
  }
  if (!t.reported_p50_ms.empty()) {
    r.p50_ms = Median(t.reported_p50_ms);
    r.p99_ms = *std::max_element(t.reported_p99_ms.begin(), t.reported_p99_ms.end());
  } else {
    r.p50_ms = Percentile(t.batch_ms, 0.50);
    r.p99_ms = Percentile(t.batch_ms, 0.99);
  }
  return r;
}
// ---- the backend's rows
// --------------------------------------------------------------------------

std::vector<PageKey> KeysFor(const PageKind& kind, int64_t count, uint64_t run_id) {
  std::mt19937_64 rng(run_id);
  std::vector<int32_t> tokens(static_cast<size_t>(count * kind.page_size));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 128'000);
  return *ComputePromptPageKeys(tokens, kind.page_size, fmt::format("kvtier-bench-{}", run_id));
}

std::vector<PageBuffer> BuffersOf(const PageSet& pages, int64_t first, int64_t count) {
  std::vector<PageBuffer> buffers;
  for (int64_t i = first; i < first + count; ++i) buffers.push_back(PageBuffer::Of(pages.page(i)));
  return buffers;
}

struct KindResult {
  OpTimes set, get, exists;
  GetProfile get_alone, get_mixed;  // the Get pass, and the Gets of the mixed pass
  SetProfile set_alone, set_mixed;  // the Set pass, and the Sets of the mixed pass
  // The mixed pass: a Get of every stored page while a Set of as many other pages runs (each
  // side's pass timed alone, from its first submission to its last completion).
  OpTimes get_under_set, set_under_get;
  bool check_ok = true;
  std::string note;
};

// One pass of Set or Get over all pages, `o.in_flight` batches in flight at once (a prefetch of a
// long prefix keeps several batches queued, so every I/O thread has a page); each batch's time is
// from its submission to its completion. A page not ok is reported through `fail`.
Status RunPass(StorageBackend& backend, bool set, const std::vector<PageKey>& keys,
               const PageSet& src, PageSet& dst, const StorageBenchOptions& o, OpTimes& times,
               const std::function<void(std::string)>& fail) {
  const int64_t n = src.count;
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  Status error;
  const auto round_start = Clock::now();
  for (int64_t first = 0; first < n; first += o.batch_pages) {
    const int64_t count = std::min(o.batch_pages, n - first);
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return in_flight < o.in_flight; });
      ++in_flight;
    }
    std::vector<PageKey> batch(keys.begin() + first, keys.begin() + first + count);
    const auto t0 = Clock::now();
    auto done = [&, t0, count](BatchResult res) {
      const double ms = Seconds(t0, Clock::now()) * 1e3;
      std::lock_guard<std::mutex> lock(mu);
      times.batch_ms.push_back(ms);
      if (!res.status.ok() && error.ok()) error = res.status.WithContext(set ? "Set" : "Get");
      if (res.status.ok() && res.leading_ok() != count) {
        fail(fmt::format("{}: {} of {} pages {}", set ? "Set" : "Get", count - res.leading_ok(),
                         count, set ? "not ok" : "missed"));
      }
      --in_flight;
      cv.notify_all();
    };
    if (set) {
      backend.SetAsync(std::move(batch), BuffersOf(src, first, count), done);
    } else {
      backend.GetAsync(std::move(batch), BuffersOf(dst, first, count), done);
    }
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return in_flight == 0; });
  times.round_seconds.push_back(Seconds(round_start, Clock::now()));
  return error;
}

// One kind's rounds: Set, Exists and Get of `keys`, then (with `write_keys`) the Get of `keys`
// again while `write_keys` are Set. `before_writes` (when set) runs before each pass that writes,
// outside its time (the write ceiling's conditions: WriteBackDirtyPages).
Result<KindResult> RunKind(StorageBackend& backend, const std::vector<PageKey>& keys,
                           const std::vector<PageKey>& write_keys, const PageSet& src, PageSet& dst,
                           const StorageBenchOptions& o,
                           const std::function<void()>& before_writes = nullptr) {
  KindResult r;
  auto fail = [&](std::string note) {
    r.check_ok = false;
    if (r.note.empty()) r.note = std::move(note);
  };
  const int64_t n = src.count;
  for (int round = 0; round < o.repeats; ++round) {
    if (before_writes) before_writes();
    const StorageStats before_set = backend.Stats();
    KVTIER_RETURN_IF_ERROR(RunPass(backend, /*set=*/true, keys, src, dst, o, r.set, fail));
    r.set_alone.Add(before_set, backend.Stats(), r.set.round_seconds.back());

    // Exists of every page, in calls of at most the backend's max_batch_pages (a kind of more
    // pages than that was refused: "8192 keys exceed max_batch_pages 4096"), timed together.
    const auto e0 = Clock::now();
    const int64_t per_call = backend.options().max_batch_pages;
    int64_t leading = 0;
    for (int64_t first = 0; first < n && leading == first; first += per_call) {
      const int64_t count = std::min(per_call, n - first);
      const ExistsResult ex =
          backend.Exists(std::vector<PageKey>(keys.begin() + first, keys.begin() + first + count))
              .get();
      if (!ex.status.ok()) return ex.status.WithContext("Exists");
      leading += ex.leading;
    }
    r.exists.batch_ms.push_back(Seconds(e0, Clock::now()) * 1e3);
    r.exists.round_seconds.push_back(Seconds(e0, Clock::now()));
    if (leading != n) fail(fmt::format("Exists: {} of {} leading pages", leading, n));

    dst.Poison();
    const StorageStats before_get = backend.Stats();
    const auto cpu_before_get = CpuSecondsByThreadName();
    KVTIER_RETURN_IF_ERROR(RunPass(backend, /*set=*/false, keys, src, dst, o, r.get, fail));
    r.get_alone.AddCpu(r.get.round_seconds.back(),
                       CpuSince(cpu_before_get, CpuSecondsByThreadName()));
    r.get_alone.Add(before_get, backend.Stats());
    if (const int64_t bad = dst.CountDiffering(src); bad > 0) {
      fail(fmt::format("Get: {} of {} pages differ from what was Set", bad, n));
    }

    // Reads under writes: the stored pages read again while the same bytes are written under
    // `write_keys` (pages the store does not hold, or replaces) on another thread.
    if (!write_keys.empty()) {
      dst.Poison();
      if (before_writes) before_writes();
      Status set_status;
      const StorageStats before_mixed = backend.Stats();
      const auto cpu_before_mixed = CpuSecondsByThreadName();
      std::thread writer([&] {
        set_status = RunPass(backend, /*set=*/true, write_keys, src, dst, o, r.set_under_get, fail);
      });
      const Status get_status =
          RunPass(backend, /*set=*/false, keys, src, dst, o, r.get_under_set, fail);
      if (get_status.ok()) {
        r.get_mixed.AddCpu(r.get_under_set.round_seconds.back(),
                           CpuSince(cpu_before_mixed, CpuSecondsByThreadName()));
      }
      r.get_mixed.Add(before_mixed, backend.Stats());  // the Gets are done (the Sets may not be)
      writer.join();
      KVTIER_RETURN_IF_ERROR(get_status);
      KVTIER_RETURN_IF_ERROR(set_status);
      r.set_mixed.Add(before_mixed, backend.Stats(), r.set_under_get.round_seconds.back());
      if (const int64_t bad = dst.CountDiffering(src); bad > 0) {
        fail(fmt::format("Get under writes: {} of {} pages differ from what was Set", bad, n));
      }
    }
  }
  return r;
}

// Exists of `count` stored small pages, 50 times; each call's time is a "batch".
Result<OpTimes> RunExistsIndex(const std::string& url, const StorageBenchOptions& o,
                               uint64_t run_id, std::string* note) {
  StorageOptions so = o.storage;
  so.max_batch_pages = std::max<int64_t>(4096, o.exists_keys);
  KVTIER_ASSIGN_OR_RETURN(auto backend, OpenStorage(url, NamespaceOf(kExistsKind), so));
  const std::vector<PageKey> keys = KeysFor(kExistsKind, o.exists_keys, run_id);
  PageSet pages = PageSet::Make(backend->ns().page_bytes(), o.exists_keys);
  pages.FillRandom(run_id);
  for (int64_t first = 0; first < o.exists_keys; first += 256) {
    const int64_t count = std::min<int64_t>(256, o.exists_keys - first);
    std::vector<PageKey> batch(keys.begin() + first, keys.begin() + first + count);
    const BatchResult res = backend->Set(std::move(batch), BuffersOf(pages, first, count)).get();
    if (!res.status.ok() || res.leading_ok() != count) {
      return Status::IOError("storing the small pages for the Exists measurement failed");
    }
  }
  OpTimes t;
  for (int i = 0; i < 50; ++i) {
    const auto t0 = Clock::now();
    const ExistsResult ex = backend->Exists(keys).get();
    const double s = Seconds(t0, Clock::now());
    if (!ex.status.ok() || ex.leading != o.exists_keys) {
      *note = fmt::format("Exists found {} of {}", ex.leading, o.exists_keys);
    }
    t.batch_ms.push_back(s * 1e3);
    t.round_seconds.push_back(s);
  }
  for (int64_t first = 0; first < o.exists_keys; first += 256) {
    const int64_t count = std::min<int64_t>(256, o.exists_keys - first);
    backend->Remove(std::vector<PageKey>(keys.begin() + first, keys.begin() + first + count)).get();
  }
  return t;
}

// A file store keeps each namespace in a directory of shard directories (one per key prefix),
// which stay when their pages are removed. After the bench has removed its pages it removes the
// directories of its own namespaces that are left empty, deepest first; rmdir never removes a
// directory that still holds anything, so pages other processes stored there stay.
void RemoveEmptyDirectories(const std::filesystem::path& dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> children;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code type_ec;
    if (entry.is_directory(type_ec) && !entry.is_symlink(type_ec)) children.push_back(entry.path());
  }
  for (const auto& child : children) RemoveEmptyDirectories(child);
  ::rmdir(dir.c_str());  // fails, harmlessly, when anything is left
}

void PrintRows(std::FILE* out, const std::vector<StorageRow>& rows) {
  std::fprintf(out, "%-7s %-7s %-22s %6s %9s %8s %10s %9s %9s %8s %s\n", "kind", "op", "who",
               "pages", "page MiB", "GB/s", "pages/s", "p50 ms", "p99 ms", "% base", "check");
  for (const StorageRow& r : rows) {
    const std::string pct = r.pct_of_baseline > 0 ? fmt::format("{:.0f}%", r.pct_of_baseline) : "";
    const std::string check = r.baseline_failed ? "baseline not measured: " + r.note
                              : r.check_ok      ? std::string("ok")
                                                : "FAILED " + r.note;
    std::fprintf(out, "%-7s %-7s %-22s %6lld %9.2f %8.2f %10.0f %9.3f %9.3f %8s %s\n",
                 r.kind.c_str(), r.op.c_str(), r.who.c_str(), static_cast<long long>(r.pages),
                 static_cast<double>(r.page_bytes) / (1 << 20), r.gbps, r.pages_per_s, r.p50_ms,
                 r.p99_ms, pct.c_str(), check.c_str());
  }
}

// One pass kind's Set profile: SetPhasesJson of its calls and the pass's time (the threads on its
// pages on average = pages_in_hook / pass_seconds).
nlohmann::json SetProfileJson(const SetProfile& p) {
  nlohmann::json j = SetPhasesJson(p.delta);
  j["pass_seconds"] = p.pass_seconds;
  return j;
}

nlohmann::json GetProfileJson(const GetProfile& g) {
  return {{"calls", g.calls},
          {"queue_seconds", g.queue_seconds},
          {"held_seconds", g.held_seconds},
          {"hook_seconds", g.hook_seconds},
          {"page_seconds", g.page_seconds},
          {"profiled_pages", g.profiled_pages},
          {"profiled_seconds", g.profiled_seconds},
          {"profiled_cpu_seconds", g.profiled_cpu_seconds},
          {"profiled_core_wait_seconds", g.core_wait_known ? g.profiled_core_wait_seconds : -1.0},
          {"pass_seconds", g.pass_seconds},
          {"cpu_seconds_by_thread", g.cpu_seconds_by_thread}};
}

Status WriteRowsJson(const std::string& path, const std::string& command,
                     const std::vector<StorageRow>& rows,
                     const std::vector<KindSummary>& summaries) {
  nlohmann::json j;
  j["command"] = command;
  j["rows"] = nlohmann::json::array();
  for (const StorageRow& r : rows) {
    j["rows"].push_back({{"kind", r.kind},
                         {"op", r.op},
                         {"who", r.who},
                         {"pages", r.pages},
                         {"page_bytes", r.page_bytes},
                         {"gbps", r.gbps},
                         {"pages_per_s", r.pages_per_s},
                         {"p50_ms", r.p50_ms},
                         {"p99_ms", r.p99_ms},
                         {"pct_of_baseline", r.pct_of_baseline},
                         {"check_ok", r.check_ok},
                         {"baseline_failed", r.baseline_failed},
                         {"note", r.note}});
  }
  j["summary"] = nlohmann::json::array();
  for (const KindSummary& m : summaries) {
    const StorageStats& st = m.stats;
    j["summary"].push_back(
        {{"kind", m.kind},
         {"page_bytes", m.page_bytes},
         {"ceiling", m.ceiling},
         {"write_ceiling_gbps", m.write_ceiling_gbps},
         {"read_ceiling_gbps", m.read_ceiling_gbps},
         {"set_gbps", m.set_gbps},
         {"get_gbps", m.get_gbps},
         {"set_under_reads_gbps", m.set_under_get_gbps},
         {"get_under_writes_gbps", m.get_under_set_gbps},
         {"set_pct_of_write_ceiling", Ratio(m.set_gbps, m.write_ceiling_gbps)},
         {"get_pct_of_read_ceiling", Ratio(m.get_gbps, m.read_ceiling_gbps)},
         {"get_under_writes_pct_of_read_ceiling", Ratio(m.get_under_set_gbps, m.read_ceiling_gbps)},
         {"get_alone", GetProfileJson(m.get_alone)},
         {"get_under_writes", GetProfileJson(m.get_mixed)},
         {"set_phases_seconds", SetPhasesJson(st)},
         {"set_alone", SetProfileJson(m.set_alone)},
         {"set_under_reads", SetProfileJson(m.set_mixed)}});
  }
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) return Status::IOError(fmt::format("cannot write {}", path));
  return Status::OK();
}

Status Validate(const StorageBenchOptions& o) {
  for (const std::string& k : o.kinds) {
    if (std::none_of(std::begin(kKinds), std::end(kKinds),
                     [&](const PageKind& p) { return k == p.name; })) {
      return Status::InvalidArgument(
          fmt::format("--storage-kinds: unknown page kind '{}' (mha4, mha16, mha64, mla64)", k));
    }
  }
  if (o.batch_pages < 0 || o.batch_pages > 4096) {
    return Status::InvalidArgument("--storage-batch must be in [1, 4096], or 0 for the default");
  }
  KVTIER_RETURN_IF_ERROR(o.storage.Validate(StorageBenchFlagOf));
  if (o.in_flight < 0 || o.in_flight > 1024) {
    return Status::InvalidArgument("--storage-inflight must be in [1, 1024], or 0 for the default");
  }
  if (o.repeats < 1) return Status::InvalidArgument("--repeats must be at least 1");
  auto bytes = ParseByteSize(o.bytes_per_kind);
  if (!bytes.ok()) return bytes.status().WithContext("--storage-bytes");
  if (*bytes < 1) return Status::InvalidArgument("--storage-bytes must be positive");
  if (o.exists_keys < 0 || o.exists_keys > 100'000) {
    return Status::InvalidArgument("--storage-exists-keys must be in [0, 100000]");
  }
  return Status::OK();
}

// What a page kind's rounds left: the backend's times (or why it failed), the baselines' times
// summed over the rounds, and why a baseline round failed (then not counted).
struct KindRounds {
  Result<KindResult> result = KindResult{};
  std::vector<Baseline> baselines;
  std::string baseline_failure;
};

// The rounds of one page kind: the backend's and the baselines' interleaved, so both see the same
// machine. `file_dir` / `key_space`: the baselines' (empty / null: none).
void RunRounds(const StorageBenchOptions& o, StorageBaseline baseline, const PageKind& kind,
               StorageBackend& backend, const std::vector<PageKey>& keys,
               const std::vector<PageKey>& write_keys, const PageSet& src, PageSet& dst,
               const std::string& file_dir, const RedisKeySpace* key_space, KindRounds* k) {
  StorageBenchOptions one_round = o;
  one_round.repeats = 1;
  Result<KindResult>& result = k->result;
  std::vector<Baseline>& baselines = k->baselines;
  // One round of the backend; false when it failed (result holds why).
  // A file store's writes start as the file baseline's do: with earlier passes' dirty pages
  // written back (WriteBackDirtyPages on the file system both use).
  std::function<void()> write_back;
  if (!file_dir.empty()) write_back = [&file_dir] { (void)WriteBackDirtyPages(file_dir); };
  auto run_backend = [&]() -> bool {
    auto r = RunKind(backend, keys, write_keys, src, dst, one_round, write_back);
    if (!r.ok()) {
      result = r.status();
      return false;
    }
    Append(result->set, r->set);
    Append(result->get, r->get);
    Append(result->exists, r->exists);
    Append(result->get_under_set, r->get_under_set);
    Append(result->set_under_get, r->set_under_get);
    result->get_alone.Add(r->get_alone);
    result->get_mixed.Add(r->get_mixed);
    result->set_alone.Add(r->set_alone);
    result->set_mixed.Add(r->set_mixed);
    if (!r->check_ok && result->check_ok) {
      result->check_ok = false;
      result->note = r->note;
    }
    return true;
  };
  auto run_baselines = [&] {
    auto b =
        RunBaselines(baseline, file_dir, src, dst, key_space ? key_space->keys() : 0, one_round);
    if (!b.ok()) {
      std::fprintf(stderr, "kvtier bench: %s baseline (not counted; kvtier's rows stand): %s\n",
                   kind.name, b.status().ToString().c_str());
      k->baseline_failure = b.status().message();
    } else if (baselines.empty()) {
      baselines = std::move(*b);
    } else {
      for (size_t i = 0; i < baselines.size() && i < b->size(); ++i) {
        Append(baselines[i].set, (*b)[i].set);
        Append(baselines[i].get, (*b)[i].get);
        if (!(*b)[i].check_ok) baselines[i].check_ok = false;
      }
    }
  };
  // The side that goes first alternates between rounds (the backend in even rounds, the
  // baseline in odd ones): whichever runs right after the other's writes finds the page
  // cache, the disk's write-back or the server's allocator in the state those left, and that
  // must not always be the same side.
  for (int round = 0; round < o.repeats; ++round) {
    const bool baseline_first = o.baseline && round % 2 == 1;
    if (baseline_first) run_baselines();
    if (!run_backend()) break;
    if (o.baseline && !baseline_first) run_baselines();
  }
}

// The rows of one page kind of `n` pages: per op the backend's, then the baselines' beside it
// (the first is the reference of "% base"), and a row for a baseline that failed. The mixed
// pass's rows ("get/w": Gets while Sets run; "set/r": those Sets) are against the same reference.
KindSummary AddKindRows(const PageKind& kind, int64_t n, int64_t page_bytes, const KindRounds& k,
                        const StorageStats& stats, std::vector<StorageRow>* rows) {
  const KindResult& result = *k.result;
  KindSummary summary;
  summary.kind = kind.name;
  summary.page_bytes = page_bytes;
  summary.stats = stats;
  summary.get_alone = result.get_alone;
  summary.get_mixed = result.get_mixed;
  summary.set_alone = result.set_alone;
  summary.set_mixed = result.set_mixed;
  for (const char* op : {"set", "exists", "get", "get/w", "set/r"}) {
    const std::string op_name = op;
    const bool mixed = op_name == "get/w" || op_name == "set/r";
    if (mixed && result.get_under_set.round_seconds.empty()) continue;
    const OpTimes& t = op_name == "set"     ? result.set
                       : op_name == "get"   ? result.get
                       : op_name == "get/w" ? result.get_under_set
                       : op_name == "set/r" ? result.set_under_get
                                            : result.exists;
    StorageRow row = RowFrom(kind.name, op_name, "kvtier", n, page_bytes, t);
    row.check_ok = result.check_ok;
    row.note = result.note;
    if (op_name == "exists") row.gbps = 0;  // no bytes move
    const bool writes = op_name == "set" || op_name == "set/r";
    std::vector<StorageRow> base_rows;
    if (op_name != "exists") {
      for (const Baseline& baseline : k.baselines) {
        const OpTimes& bt = writes ? baseline.set : baseline.get;
        StorageRow base =
            RowFrom(kind.name, writes ? "set" : "get", baseline.name, n, page_bytes, bt);
        base.check_ok = baseline.check_ok;
        base.note = baseline.note;
        base_rows.push_back(std::move(base));
      }
    }
    if (!base_rows.empty() && base_rows.front().gbps > 0) {
      row.pct_of_baseline = 100.0 * row.gbps / base_rows.front().gbps;
      summary.ceiling = base_rows.front().who;
      (writes ? summary.write_ceiling_gbps : summary.read_ceiling_gbps) = base_rows.front().gbps;
    }
    (op_name == "set"     ? summary.set_gbps
     : op_name == "get"   ? summary.get_gbps
     : op_name == "get/w" ? summary.get_under_set_gbps
     : op_name == "set/r" ? summary.set_under_get_gbps
                          : row.gbps) = row.gbps;
    rows->push_back(row);
    if (!mixed) rows->insert(rows->end(), base_rows.begin(), base_rows.end());
    std::fprintf(stderr, "[%s] %s: %.2f GB/s, p50 %.3f ms%s\n", kind.name, op, row.gbps, row.p50_ms,
                 row.check_ok ? "" : " FAILED");
  }
  if (!k.baseline_failure.empty()) {
    StorageRow failed;
    failed.kind = kind.name;
    failed.op = "-";
    failed.who = "baseline";
    failed.baseline_failed = true;
    failed.note = k.baseline_failure;
    rows->push_back(std::move(failed));
  }
  return summary;
}

// Per page kind: both ceilings and the backend's ratios to them, and where a Set's time went.
void PrintSummaries(std::FILE* out, const std::vector<KindSummary>& summaries, int io_threads) {
  for (const KindSummary& m : summaries) {
    if (m.write_ceiling_gbps > 0) {
      std::fprintf(out,
                   "%-7s write ceiling %.2f GB/s (%s: open+pwrite+close+rename of page files laid "
                   "out as the store's, same durability, each write pass after syncfs as the "
                   "store's, a replaced file's unlink after the clock); Set %.2f GB/s = %.0f %%, "
                   "Set under reads %.2f GB/s = %.0f %%\n",
                   m.kind.c_str(), m.write_ceiling_gbps, m.ceiling.c_str(), m.set_gbps,
                   Ratio(m.set_gbps, m.write_ceiling_gbps), m.set_under_get_gbps,
                   Ratio(m.set_under_get_gbps, m.write_ceiling_gbps));
      std::fprintf(out,
                   "%-7s read ceiling %.2f GB/s (%s: open+pread+close); Get %.2f GB/s = %.0f %%, "
                   "Get under writes %.2f GB/s = %.0f %%\n",
                   m.kind.c_str(), m.read_ceiling_gbps, m.ceiling.c_str(), m.get_gbps,
                   Ratio(m.get_gbps, m.read_ceiling_gbps), m.get_under_set_gbps,
                   Ratio(m.get_under_set_gbps, m.read_ceiling_gbps));
    }
    // A Set alone and under reads: per call, its time queued; per profiled page, its phases;
    // the threads on the pass's pages on average (of the writers' share: io_threads alone, a
    // quarter while reads run), so a Set short of threads is told from one with slower pages.
    auto set_line = [&](const char* what, const SetProfile& p) {
      const StorageStats& st = p.delta;
      if (st.set_profiled_pages <= 0 || st.set_calls <= 0) return;
      const double pages = static_cast<double>(st.set_profiled_pages);
      auto ms = [&](double seconds) { return 1e3 * seconds / pages; };
      const double phases = st.set_open_seconds + st.set_copy_seconds + st.set_hash_seconds +
                            st.set_write_seconds + st.set_sync_seconds + st.set_publish_seconds +
                            st.set_index_seconds + st.set_unlink_seconds;
      std::fprintf(
          out,
          "%-7s a Set %s: %.2f ms queued per call (%lld calls); per page (ms, %lld pages, %.1f "
          "threads on a call's pages, %.1f on the pass's pages of %d I/O threads): open %.3f "
          "(directory %.3f), copy %.3f, checksum %.3f, write %.3f, fsync %.3f, stamp+rename %.3f, "
          "index %.3f, unlink "
          "%.3f; the phases are %.0f %% of the pages' time in the hook; %.2f GB/s a writer "
          "thread\n",
          m.kind.c_str(), what, 1e3 * st.set_queue_seconds / static_cast<double>(st.set_calls),
          static_cast<long long>(st.set_calls), static_cast<long long>(st.set_profiled_pages),
          st.set_seconds > 0 ? st.set_page_seconds / st.set_seconds : 0.0,
          p.pass_seconds > 0 ? st.set_page_seconds / p.pass_seconds : 0.0, io_threads,
          ms(st.set_open_seconds), ms(st.set_open_dir_seconds), ms(st.set_copy_seconds),
          ms(st.set_hash_seconds), ms(st.set_write_seconds), ms(st.set_sync_seconds),
          ms(st.set_publish_seconds), ms(st.set_index_seconds), ms(st.set_unlink_seconds),
          Ratio(phases, st.set_page_seconds),
          phases > 0 ? pages * static_cast<double>(m.page_bytes) / phases / 1e9 : 0.0);
    };
    set_line("alone", m.set_alone);
    set_line("under reads", m.set_mixed);
    // A Get alone and under writes: per call, its time queued (behind other calls: the writes
    // hold no reader thread, so this is reads behind reads), held behind a write of its keys, and
    // inside the hook, and the threads on its pages.
    // Then its profiled pages (file://): ms a page, of which on a core and waiting for a core
    // (CPU contention: the readers runnable while writers, the reclaimer or the kernel hold the
    // cores), and the cores the whole process had during the pass, of the machine's.
    auto get_line = [&](const char* what, const GetProfile& g) {
      if (g.calls == 0) return std::string();
      const double c = static_cast<double>(g.calls);
      std::string line = fmt::format(
          "{} {:.2f} ms queued + {:.2f} held + {:.2f} in the hook per call ({} calls, "
          "{:.1f} threads on a call's pages)",
          what, 1e3 * g.queue_seconds / c, 1e3 * g.held_seconds / c, 1e3 * g.hook_seconds / c,
          g.calls, g.hook_seconds > 0 ? g.page_seconds / g.hook_seconds : 0.0);
      if (g.profiled_pages > 0 && g.profiled_seconds > 0) {
        line +=
            ", " + ProfiledGetPageText(g.profiled_pages, g.profiled_seconds, g.profiled_cpu_seconds,
                                       g.core_wait_known ? g.profiled_core_wait_seconds : -1.0);
      }
      if (g.pass_seconds > 0 && !g.cpu_seconds_by_thread.empty()) {
        double all = 0;
        std::string by_name;
        for (const auto& [name, seconds] : g.cpu_seconds_by_thread) {
          all += seconds;
          if (seconds >= 0.005 * g.pass_seconds) {
            by_name += fmt::format("{}{} {:.1f}", by_name.empty() ? "" : ", ", name,
                                   seconds / g.pass_seconds);
          }
        }
        line += fmt::format("; the process's threads on {:.1f} of {} cores ({})",
                            all / g.pass_seconds, std::thread::hardware_concurrency(), by_name);
      }
      return line;
    };
    if (m.get_alone.calls > 0) {
      const std::string mixed = get_line("; under writes", m.get_mixed);
      std::fprintf(out, "%-7s a Get: %s%s\n", m.kind.c_str(),
                   get_line("alone", m.get_alone).c_str(), mixed.c_str());
    }
  }
}

// One page kind: its pages Set, Exists and Get through the store at o.url (and the baselines),
// its rows into `rows`, everything stored removed. 0, or the exit code to stop the bench with;
// *exit_code = 1 when the kind failed but the bench goes on.
// Redis's defaults: calls sized, and kept in flight, by the bytes they carry. One redis-server
// serves every call in turn, and each call must be done within StorageOptions::timeout (2 s) of
// being taken: the file store's eight batches of 64 pages of 2 MiB (1 GiB in flight) timed out
// against a local redis-server on a 2-core box ("down (timed out)" for every kind), and so did
// one such batch (128 MiB) with a CPU hog per core (70 MB/s), and 4 calls of 16 MiB (the server
// serves the calls in flight together: 40 MB/s, 1.9 s a call). Calls of 8 MiB, 16 MiB in flight:
// 8 MB/s at that timeout; one server is single-threaded, so more in flight adds latency, not
// throughput.
constexpr int64_t kRedisBytesPerCall = int64_t{8} << 20;
constexpr int64_t kRedisBytesInFlight = int64_t{16} << 20;

int64_t RedisBatchPages(int64_t page_bytes) {
  return std::clamp<int64_t>(kRedisBytesPerCall / page_bytes, 1, 64);
}
int RedisInFlight(int64_t batch_bytes) {
  return static_cast<int>(std::clamp<int64_t>(kRedisBytesInFlight / batch_bytes, 1, 8));
}

int BenchKind(const StorageBenchOptions& options, const StorageOptions& so,
              const StorageScheme* scheme, const std::string& store_dir, uint64_t run_id,
              const std::string& kind_name, std::vector<StorageRow>* rows,
              std::vector<KindSummary>* summaries, int* exit_code) {
  const PageKind& kind = KindNamed(kind_name);
  StorageBenchOptions o = options;
  auto opened = OpenStorage(o.url, NamespaceOf(kind), so);
  if (!opened.ok()) {
    std::fprintf(stderr, "kvtier bench: %s\n", opened.status().ToString().c_str());
    return opened.status().IsInvalidArgument() ? 2 : 1;
  }
  StorageBackend& backend = **opened;  // so `scheme` is a row of the table
  const int64_t page_bytes = backend.ns().page_bytes();
  const int64_t n = std::max<int64_t>(2, *ParseByteSize(o.bytes_per_kind) / page_bytes);
  if (o.batch_pages == 0) o.batch_pages = RedisBatchPages(page_bytes);            // redis only
  if (o.in_flight == 0) o.in_flight = RedisInFlight(o.batch_pages * page_bytes);  // redis only
  std::fprintf(stderr, "[%s] %lld pages of %.2f MiB at %s, %d batches of %lld in flight\n",
               kind.name, static_cast<long long>(n), static_cast<double>(page_bytes) / (1 << 20),
               backend.url().c_str(), o.in_flight, static_cast<long long>(o.batch_pages));
  PageSet src = PageSet::Make(page_bytes, n), dst = PageSet::Make(page_bytes, n);
  src.FillRandom(run_id + static_cast<uint64_t>(page_bytes));
  const std::vector<PageKey> keys = KeysFor(kind, n, run_id);
  // The pages written during the reads-under-writes pass (--no-mixed: none).
  const std::vector<PageKey> write_keys =
      o.mixed ? KeysFor(kind, n, run_id + 1) : std::vector<PageKey>();

  KindRounds k;
  std::unique_ptr<RedisKeySpace> key_space;
  std::string file_dir;  // the file baseline's, for all rounds of the kind
  if (o.baseline && !store_dir.empty()) {
    file_dir = fmt::format("{}/kvtier-bench-baseline-{}-{}", store_dir, kind.name, ::getpid());
    std::error_code ec;
    std::filesystem::create_directories(file_dir, ec);
    if (ec) {
      std::fprintf(stderr, "kvtier bench: cannot create %s: %s\n", file_dir.c_str(),
                   ec.message().c_str());
      return 1;
    }
  }
  if (o.baseline && scheme->baseline == StorageBaseline::kRedisBenchmark &&
      RedisKeySpace::Fits(o.url)) {
    auto filled = RedisKeySpace::Fill(o.url, n, page_bytes + kStoredPageHeaderBytes);
    if (!filled.ok()) {
      k.baseline_failure = "key space: " + filled.status().message();
      std::fprintf(stderr, "kvtier bench: %s baseline key space: %s\n", kind.name,
                   filled.status().ToString().c_str());
    } else {
      key_space = std::move(*filled);
    }
  }
  RunRounds(o, scheme->baseline, kind, backend, keys, write_keys, src, dst, file_dir,
            key_space.get(), &k);
  if (!file_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(file_dir, ec);
  }
  if (key_space) {
    if (Status s = key_space->Delete(); !s.ok()) {
      std::fprintf(stderr, "kvtier bench: %s baseline key space: %s\n", kind.name,
                   s.ToString().c_str());
      *exit_code = 1;
    }
  }
  for (const std::vector<PageKey>* stored : {&keys, &write_keys}) {  // leave nothing behind
    for (int64_t first = 0; first < static_cast<int64_t>(stored->size()); first += o.batch_pages) {
      const int64_t count = std::min(o.batch_pages, static_cast<int64_t>(stored->size()) - first);
      backend.Remove(std::vector<PageKey>(stored->begin() + first, stored->begin() + first + count))
          .get();
    }
  }
  if (!k.result.ok()) {
    std::fprintf(stderr, "kvtier bench: %s: %s\n", kind.name, k.result.status().ToString().c_str());
    *exit_code = 1;
    return 0;
  }
  summaries->push_back(AddKindRows(kind, n, page_bytes, k, backend.Stats(), rows));
  if (!k.result->check_ok) *exit_code = 1;
  return 0;
}

}  // namespace

void AddStorageBenchOptions(CLI::App* bench, StorageBenchOptions* o) {
  bench->add_option("--storage", o->url,
                    "benchmark the storage tier at this URL instead of the transfer backends "
                    "(file:///abs/dir, memory://, redis://host:port, ...): Set, Exists and Get of "
                    "real pages, every byte checked, against the platform's baseline");
  bench
      ->add_option(
          "--storage-kinds", o->kinds,
          "page kinds: mha4 (512 KiB), mha16 (2 MiB), mha64 (8 MiB), mla64 (4.5 MB), page_first")
      ->delimiter(',')
      ->capture_default_str();
  bench
      ->add_option("--storage-bytes", o->bytes_per_kind,
                   "bytes of pages per kind, e.g. 512MiB (pages = this / page size, at least 2)")
      ->capture_default_str();
  bench
      ->add_option("--storage-batch", o->batch_pages,
                   "pages per Set / Get call (0: the backend's default: file and memory stores "
                   "64; Redis as many as carry 8 MiB, 1 to 64)")
      ->capture_default_str();
  const ConfigSchema<StorageOptions>& schema = StorageOptionsSchema();
  CLI::Option* threads = AddFieldFlag(bench, *FindField(schema, "io_threads"), &o->storage,
                                      StorageBenchFlagOf("io_threads"));
  threads->description(threads->get_description() + "; the file baseline runs as many threads");
  AddFieldFlag(bench, *FindField(schema, "writers_while_reading"), &o->storage,
               StorageBenchFlagOf("writers_while_reading"));
  bench
      ->add_option("--storage-inflight", o->in_flight,
                   "Set / Get batches in flight at once (0: the backend's default: file and "
                   "memory stores eight, as a streamed prefetch queues at least, or more for four "
                   "pages an I/O thread; Redis as many as carry 16 MiB, 1 to 8)")
      ->capture_default_str();
  AddFieldFlag(bench, *FindField(schema, "min_free_bytes"), &o->storage,
               StorageBenchFlagOf("min_free_bytes"));
  // A functional test on a loaded machine raises it (a call past it is a miss, which the bench
  // reports as a failure); a benchmark keeps the store's default.
  AddFieldFlag(bench, *FindField(schema, "timeout_ms"), &o->storage,
               StorageBenchFlagOf("timeout_ms"));
  bench
      ->add_option("--storage-exists-keys", o->exists_keys,
                   "stored keys in the Exists measurement (0 = skip it)")
      ->capture_default_str();
  bench->add_flag("!--no-baseline", o->baseline, "skip the platform baseline");
  bench->add_flag("!--no-mixed", o->mixed,
                  "skip the pass that reads the stored pages while as many others are written "
                  "(the get/w and set/r rows)");
}
int RunStorageBench(const StorageBenchOptions& options, const std::string& command) {
  StorageBenchOptions o = options;
  if (Status s = Validate(o); !s.ok()) {
    std::fprintf(stderr, "kvtier bench: %s\n", s.ToString().c_str());
    return 2;
  }
  // Null for a URL without a known scheme: OpenStorage (BenchKind) then says what is wrong.
  const StorageScheme* scheme = FindStorageScheme(StorageUrlScheme(o.url));
  // A store of plain files (its baseline's directory, emptied of the bench's namespaces at the
  // end): "file:///dir?..." -> "/dir"; "" for other schemes.
  const std::string store_dir = FileUrlDirectory(o.url);
  const uint64_t run_id = static_cast<uint64_t>(::getpid()) << 20 ^
                          static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  std::vector<StorageRow> rows;
  std::vector<KindSummary> summaries;
  int exit_code = 0;
  if (o.storage.io_threads == 0) o.storage.io_threads = DefaultIoThreads();
  // A store on servers (a URL of hosts: redis, redis+cluster): by bytes per call and in flight,
  // per kind (BenchKind); local stores (file, memory): batches of 64 pages (a streamed prefetch's
  // of 8,192 tokens at page 16), in flight as follows.
  const bool on_servers = scheme != nullptr && scheme->form == StorageUrlForm::kHosts;
  if (o.batch_pages == 0 && !on_servers) o.batch_pages = 64;
  if (o.in_flight == 0 && !on_servers) {
    // A prefetch queues all its batches at once, a streamed one at least eight (prefetcher.cc);
    // the bench keeps eight calls in flight, or more where that leaves an I/O thread fewer than
    // four pages, so that a thread that finishes a page does not find the queue empty while the
    // bench's thread, woken by a completion, submits the next batch (on a box whose cores the
    // I/O threads keep busy, that wake-up is late: 2 batches of 8 pages for 4 threads read at
    // 57 % of the baseline, 8 batches at 72 %; on the 16-core GPU host 2 calls of 64 pages of
    // 512 KiB read at 75-97 % from run to run, 8 calls at 90-99 %). Many small batches cost too:
    // on that host 32 batches of 8 pages of 512 KiB read at 56 %, 2 batches of 64 at 72 %.
    o.in_flight = std::max(
        8, static_cast<int>((4 * o.storage.io_threads + o.batch_pages - 1) / o.batch_pages) + 1);
  }
  std::fprintf(stderr, "storage bench: %d I/O threads\n", o.storage.io_threads);
  StorageOptions so = o.storage;
  so.max_queued_batches = std::max(so.max_queued_batches, o.in_flight);  // redis: 8 at most

  for (const std::string& kind_name : o.kinds) {
    if (int stop =
            BenchKind(o, so, scheme, store_dir, run_id, kind_name, &rows, &summaries, &exit_code);
        stop) {
      return stop;
    }
  }

  if (o.exists_keys > 0) {
    std::string note;
    auto t = RunExistsIndex(o.url, o, run_id, &note);
    if (!t.ok()) {
      std::fprintf(stderr, "kvtier bench: exists: %s\n", t.status().ToString().c_str());
      exit_code = 1;
    } else {
      StorageRow row =
          RowFrom(fmt::format("{}keys", o.exists_keys), "exists", "kvtier", o.exists_keys, 0, *t);
      row.gbps = 0;
      row.check_ok = note.empty();
      row.note = note;
      if (!row.check_ok) exit_code = 1;
      rows.push_back(row);
    }
  }
  if (!store_dir.empty()) {  // every backend of the run is closed by now
    for (const std::string& kind_name : o.kinds) {
      const std::string ns_name = NamespaceOf(KindNamed(kind_name)).Name();
      RemoveEmptyDirectories(std::filesystem::path(store_dir) / ns_name);
    }
    if (o.exists_keys > 0) {
      RemoveEmptyDirectories(std::filesystem::path(store_dir) / NamespaceOf(kExistsKind).Name());
    }
  }
  PrintRows(stdout, rows);
  PrintSummaries(stdout, summaries, o.storage.io_threads);
  if (!o.json_path.empty()) {
    if (Status s = WriteRowsJson(o.json_path, command, rows, summaries); !s.ok()) {
      std::fprintf(stderr, "kvtier bench: %s\n", s.ToString().c_str());
      exit_code = 1;
    }
  }
  return exit_code;
}

}  // namespace kvtier::tools
