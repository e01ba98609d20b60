// The platform baselines of `kvtier bench --storage` (storage_bench_baseline.h).
#include "storage_bench_baseline.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/page_file.h"
#include "kvtier/storage.h"
#include "redis_baseline.h"
#include "replay_ceiling.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
// The AVX-512 / AVX2 paths where the CPU has them, as the file store's own checksum uses.
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Where a page file's payload starts (the file store's kFilePayloadOffset: header, then zeros),
// and the bytes of its header the store writes at 0.
constexpr size_t kPayloadOffset = 4096;
constexpr size_t kHeaderBytes = 104;

bool WriteWhole(int fd, const std::byte* p, size_t n, size_t offset) {
  for (size_t at = 0; at < n;) {
    const ssize_t w = ::pwrite(fd, p + at, n - at, static_cast<off_t>(offset + at));
    if (w <= 0) return false;
    at += static_cast<size_t>(w);
  }
  return true;
}

bool ReadWhole(int fd, std::byte* p, size_t n, size_t offset) {
  for (size_t at = 0; at < n;) {
    const ssize_t r = ::pread(fd, p + at, n - at, static_cast<off_t>(offset + at));
    if (r <= 0) return false;
    at += static_cast<size_t>(r);
  }
  return true;
}

// Puts `temp` in place as `path` as the file store publishes a page (kvtier/page_file.h, the
// store's own function): a file already at `path` (the page written again, from the second round
// on) is swapped out to `temp`, whose name goes into `replaced` to be unlinked after the pass's
// clock. The store hands such a file to its reclaimer threads (file_reclaimer.h), which unlink it
// beside the Sets, off the writer's path; the ceiling, the rate no store can pass, leaves the
// unlink out of its time altogether.
bool Publish(const std::string& temp, const std::string& path, std::mutex& mu,
             std::vector<std::string>& replaced) {
  bool was_replaced = false;
  if (!PublishFile(AT_FDCWD, temp.c_str(), path.c_str(), &was_replaced)) return false;
  if (was_replaced) {
    std::lock_guard<std::mutex> lock(mu);
    replaced.push_back(temp);  // the older file, now under `temp`
  }
  return true;
}

}  // namespace

bool WriteBackDirtyPages(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::syncfs(fd) == 0;
  ::close(fd);
  return ok;
}

namespace {

// Runs fn(i) for every page i in [0, count) on `threads` threads, each taking the next page.
// False when any call returned false.
bool OnThreads(int threads, int64_t count, const std::function<bool(int64_t)>& fn) {
  std::atomic<int64_t> next{0};
  std::atomic<bool> ok{true};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int64_t i; (i = next.fetch_add(1)) < count;) {
        if (!fn(i)) ok = false;
      }
    });
  }
  for (auto& t : pool) t.join();
  return ok;
}

// The file baseline's pages as plain files in `dir` (FileBaseline below says what a write and a
// read do and why): page i's file, in one of 256 shard directories as the store's (a directory's
// entries change under its lock: 4 threads creating and renaming in one directory wait for each
// other, which made the ceiling at 512 KiB pages half the store's Set on the build box); the
// older files a write pass swapped out, unlinked after its clock (Publish). Write and Read may
// run on several threads at once.
class FileBaselinePages {
 public:
  FileBaselinePages(const std::string& dir, const PageSet& src, PageSet& dst, bool direct,
                    bool sync, bool checked)
      : dir_(dir), src_(src), dst_(dst), direct_(direct), sync_(sync), checked_(checked) {
    for (int64_t i = 0; checked && i < src.count; ++i) {
      digests_.push_back(XXH3_64bits(src.page(i).data(), static_cast<size_t>(src.page_bytes)));
    }
  }

  // The shard directories, made when missing.
  Status MakeShards() const {
    for (int64_t shard = 0; shard < std::min<int64_t>(src_.count, 256); ++shard) {
      const std::string d = fmt::format("{}/{:02x}", dir_, shard);
      if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) {
        return Status::IOError(fmt::format("baseline: mkdir {}: {}", d, std::strerror(errno)));
      }
    }
    return Status::OK();
  }

  // One timed pass over every page (`write`: Write, else Read) on `threads` threads, or on one
  // batch by batch with each batch's time; its round time into `t`. A read pass of a `cold`
  // baseline drops the files from the page cache first (Unavailable where it keeps them); a
  // write pass starts after WriteBackDirtyPages. IOError with errno's text when a page fails.
  Status TimePass(bool write, int threads, int64_t batch_pages, bool cold, OpTimes& t) {
    const std::function<bool(int64_t)> one = [this, write](int64_t i) {
      return write ? Write(i) : Read(i);
    };
    for (int64_t i = 0; cold && !write && i < src_.count; ++i) {
      if (!DropFromPageCache(PagePath(i), src_.page_bytes)) {
        return Status::Unavailable(fmt::format(
            "the page cache kept the files in {} after POSIX_FADV_DONTNEED (tmpfs?)", dir_));
      }
    }
    if (write && !WriteBackDirtyPages(dir_)) {
      return Status::IOError(
          fmt::format("baseline: syncfs of {} before the writes: {}", dir_, std::strerror(errno)));
    }
    const auto round_start = Clock::now();
    bool ok = true;
    if (threads > 1) {
      ok = OnThreads(threads, src_.count, one);
    } else {
      for (int64_t first = 0; ok && first < src_.count; first += batch_pages) {
        const auto t0 = Clock::now();
        for (int64_t i = first; ok && i < std::min(src_.count, first + batch_pages); ++i) {
          ok = one(i);
        }
        t.batch_ms.push_back(Seconds(t0, Clock::now()) * 1e3);
      }
    }
    if (!ok) {
      return Status::IOError(fmt::format("baseline {} in {}: {}", write ? "write" : "read", dir_,
                                         std::strerror(errno)));
    }
    t.round_seconds.push_back(Seconds(round_start, Clock::now()));
    for (const std::string& old : replaced_) {  // after the clock: see Publish
      if (::unlink(old.c_str()) != 0 && errno != ENOENT) {
        return Status::IOError(fmt::format("baseline: unlink {}: {}", old, std::strerror(errno)));
      }
    }
    replaced_.clear();
    return Status::OK();
  }

  // The pages read whose XXH3 differed from their source's since the last call (checked only).
  int64_t TakeMismatched() { return mismatched_.exchange(0); }

 private:
  std::string PagePath(int64_t i) const { return fmt::format("{}/{:02x}/{}", dir_, i % 256, i); }

  // A file laid out as the store's: the payload from kPayloadOffset, a header's bytes at 0 (a
  // direct write: the whole first block); with `sync` (an fsync=1 store) fdatasync before the
  // rename and the shard directory fsynced after it, as the store does.
  bool Write(int64_t i) {
    alignas(kPayloadOffset) static const std::byte header[kPayloadOffset] = {};
    static const timespec kNow[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
    const size_t n = static_cast<size_t>(src_.page_bytes);
    const std::string path = PagePath(i);
    const std::string temp = fmt::format("{}.{}.tmp", path, temp_counter_.fetch_add(1));
    const int fd =
        ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | DirectFlag(), 0600);
    bool ok = fd >= 0 && WriteWhole(fd, src_.page(i).data(), n, kPayloadOffset) &&
              WriteWhole(fd, header, direct_ ? kPayloadOffset : kHeaderBytes, 0) &&
              (!sync_ || ::fdatasync(fd) == 0) && ::futimens(fd, kNow) == 0;
    if (fd >= 0) ::close(fd);
    if (!ok && fd >= 0) ::unlink(temp.c_str());
    ok = ok && Publish(temp, path, replaced_mu_, replaced_);
    if (ok && sync_) {  // the page's shard directory, as the store fsyncs it
      const int shard_fd =
          ::open(path.substr(0, path.rfind('/')).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      ok = shard_fd >= 0 && ::fsync(shard_fd) == 0;
      if (shard_fd >= 0) ::close(shard_fd);
    }
    return ok;
  }

  // The page's payload read into its destination; `checked`: in 256 KiB chunks, each hashed as
  // it lands, the digest compared with the source's (a mismatch counted, not a failure).
  bool Read(int64_t i) {
    const size_t n = static_cast<size_t>(src_.page_bytes);
    const int fd = ::open(PagePath(i).c_str(), O_RDONLY | O_CLOEXEC | DirectFlag());
    bool ok = fd >= 0;
    if (ok && !checked_) ok = ReadWhole(fd, dst_.page(i).data(), n, kPayloadOffset);
    if (ok && checked_) {
      constexpr size_t kChunk = size_t{256} << 10;
      XXH3_state_t state;
      XXH3_INITSTATE(&state);
      XXH3_64bits_reset(&state);
      std::byte* to = dst_.page(i).data();
      for (size_t at = 0; ok && at < n; at += kChunk) {
        const size_t len = std::min(kChunk, n - at);
        ok = ::pread(fd, to + at, len, static_cast<off_t>(kPayloadOffset + at)) ==
             static_cast<ssize_t>(len);
        if (ok) XXH3_64bits_update(&state, to + at, len);
      }
      if (ok && XXH3_64bits_digest(&state) != digests_[static_cast<size_t>(i)]) ++mismatched_;
    }
    if (fd >= 0) ::close(fd);
    return ok;
  }

  int DirectFlag() const { return direct_ ? O_DIRECT : 0; }

  const std::string& dir_;
  const PageSet& src_;
  PageSet& dst_;
  const bool direct_, sync_, checked_;
  std::vector<uint64_t> digests_;  // checked: each source page's XXH3, computed before the clock
  std::atomic<int64_t> temp_counter_{0};
  std::atomic<int64_t> mismatched_{0};
  std::mutex replaced_mu_;
  std::vector<std::string> replaced_;  // older files swapped out by a write pass (Publish)
};

// file://: the same pages as plain files in `dir`, a directory beside the store, written with
// open+pwrite+close+rename and read with open+pread+close, on `threads` threads each taking the
// next page (on one thread batch by batch, for its batch times). A write does what the file
// store's Set does to the file system, with the same durability: a new temporary file
// (O_CREAT|O_EXCL, a unique name), the payload at the store's offset and the header's bytes at 0
// (the same bytes per file), fdatasync only for an fsync=1 store, the mtime set, then a rename
// over the page's file (buffered, no fsync by default); it leaves out the store's own work
// (checksum, index, chunking). A file already at the page's path is swapped out, as the store's
// Set does, and unlinked after the pass's clock (Publish). Files go into 256 shard directories, as
// the store's. Each timed write pass starts after WriteBackDirtyPages, as the store's Set passes do
// (storage_bench.cc), so neither pays for the other's write-back: on the H100 a ceiling that
// followed the store's dirty pages came out below the store. The directory lives as long as the
// backend's pages of the kind (the caller makes it before the first round and removes it after the
// last), so from the second round on the baseline, like the backend, replaces files that are
// already there and its data reaches the disk; a directory made and removed in every round let its
// writes be deleted before the kernel wrote them back, which made its Set look about twice as fast
// as any write that stays. `cold`: before each read pass every file is dropped from the page cache
// (DropFromPageCache), so the reads come from the disk; Unavailable where the page cache keeps them
// (tmpfs). `checked`: each file is read in 256 KiB chunks, each hashed with XXH3 as it lands (the
// file store's chunk size and checksum) and the page's digest compared with its source's: what any
// store that checks the bytes it reads can reach, beside the plain loop that checks nothing.
Result<Baseline> FileBaseline(const std::string& dir, const PageSet& src, PageSet& dst,
                              int64_t batch_pages, int repeats, int threads, bool direct, bool sync,
                              bool cold = false, bool checked = false) {
  Baseline b;
  b.name = fmt::format("{} thread{} {}{}{}{}", threads, threads == 1 ? "" : "s",
                       direct ? "O_DIRECT" : "plain", sync ? " fsync" : "", cold ? " cold" : "",
                       checked ? " + XXH3" : "");
  if (cold) b.note = "fdatasync + POSIX_FADV_DONTNEED before each read pass: from the disk";
  FileBaselinePages files(dir, src, dst, direct, sync, checked);
  KVTIER_RETURN_IF_ERROR(files.MakeShards());
  for (int round = 0; round < repeats; ++round) {
    KVTIER_RETURN_IF_ERROR(files.TimePass(/*write=*/true, threads, batch_pages, cold, b.set));
    dst.Poison();
    KVTIER_RETURN_IF_ERROR(files.TimePass(/*write=*/false, threads, batch_pages, cold, b.get));
    if (const int64_t bad = dst.CountDiffering(src); bad > 0) {
      b.check_ok = false;
      b.note = fmt::format("{} pages differ", bad);
    }
    if (const int64_t bad = files.TakeMismatched(); bad > 0) {
      b.check_ok = false;
      b.note = fmt::format("{} pages' XXH3 differ", bad);
    }
  }
  return b;
}

// memory://: one memcpy per page into and out of a second buffer, one thread.
Baseline MemcpyBaseline(const PageSet& src, PageSet& dst, int64_t batch_pages, int repeats) {
  Baseline b;
  b.name = "memcpy";
  PageSet stored = PageSet::Make(src.page_bytes, src.count);
  const size_t n = static_cast<size_t>(src.page_bytes);
  for (int round = 0; round < repeats; ++round) {
    for (int pass = 0; pass < 2; ++pass) {
      OpTimes& t = pass == 0 ? b.set : b.get;
      if (pass == 1) dst.Poison();
      const auto round_start = Clock::now();
      for (int64_t first = 0; first < src.count; first += batch_pages) {
        const auto t0 = Clock::now();
        for (int64_t i = first; i < std::min(src.count, first + batch_pages); ++i) {
          if (pass == 0) {
            std::memcpy(stored.page(i).data(), src.page(i).data(), n);
          } else {
            std::memcpy(dst.page(i).data(), stored.page(i).data(), n);
          }
        }
        t.batch_ms.push_back(Seconds(t0, Clock::now()) * 1e3);
      }
      t.round_seconds.push_back(Seconds(round_start, Clock::now()));
    }
    if (dst.CountDiffering(src) > 0) b.check_ok = false;
  }
  return b;
}

// redis:// and redis+cluster://: redis-benchmark SET and GET of values of the backend's value
// size (header + page), against the same server(s), as many requests as the backend's rounds
// moved pages (the bench calls it once per round, between the backend's rounds). The bench keeps
// one batch in flight at a time, so the baseline runs one client with a pipeline depth of
// batch_pages: the same requests in flight. Its requests per second become the rate of the rows;
// its per-request p50/p99 (a request waits for its pipeline, as a page waits for its batch) stand
// for the batch times.
//
// On one server the baseline spreads its requests over as many keys as the backend stores
// (redis-benchmark -r over a RedisKeySpace filled once per page kind, like the backend's keys,
// which live from its first round to the end of the kind), so the server keeps the same bytes in
// memory on both sides; a second, informational run uses redis-benchmark's default of one literal
// key, whose value stays in the CPU caches. On a cluster only the default is run.
Result<Baseline> RedisBenchmarkBaseline(const std::string& url, int64_t pages, int64_t page_bytes,
                                        int64_t key_space, const StorageBenchOptions& o) {
  RedisBaselineOptions options;
  options.value_bytes = page_bytes + kStoredPageHeaderBytes;
  options.clients = 1;
  options.pipeline = static_cast<int>(o.batch_pages);
  options.requests = pages * o.repeats;
  options.key_space = key_space;
  KVTIER_ASSIGN_OR_RETURN(std::vector<RedisBaselineRow> rows, RunRedisBenchmark(url, options));
  Baseline b;
  b.name = key_space > 0 ? fmt::format("redis-benchmark -r{}", key_space) : "redis-benchmark 1 key";
  b.note = "check: none (its own values)";
  for (const RedisBaselineRow& row : rows) {
    OpTimes* t = row.test == "SET" ? &b.set : row.test == "GET" ? &b.get : nullptr;
    if (t == nullptr || row.requests_per_second <= 0) continue;
    t->round_seconds = {static_cast<double>(pages) / row.requests_per_second};
    t->reported_p50_ms = {row.p50_ms};
    t->reported_p99_ms = {row.p99_ms};
  }
  if (b.set.round_seconds.empty() || b.get.round_seconds.empty()) {
    return Status::Unavailable("redis-benchmark reported no SET or GET rate");
  }
  return b;
}

}  // namespace

Result<std::vector<Baseline>> RunBaselines(StorageBaseline kind, const std::string& file_dir,
                                           const PageSet& src, PageSet& dst, int64_t key_space,
                                           const StorageBenchOptions& o) {
  std::vector<Baseline> baselines;
  if (kind == StorageBaseline::kFiles) {
    // N threads first (the reference), one thread beside it.
    // A direct store (direct=1) is measured against O_DIRECT reads and writes.
    // An fsync=1 store against writes synced the same way.
    const bool direct = o.url.find("direct=1") != std::string::npos ||
                        o.url.find("direct=true") != std::string::npos;
    const bool sync =
        o.url.find("fsync=1") != std::string::npos || o.url.find("fsync=true") != std::string::npos;
    for (int threads : {o.storage.io_threads, 1}) {
      KVTIER_ASSIGN_OR_RETURN(Baseline b, FileBaseline(file_dir, src, dst, o.batch_pages, o.repeats,
                                                       threads, direct, sync));
      baselines.push_back(std::move(b));
      if (o.storage.io_threads == 1) break;
    }
    // Beside them: the N threads' reads checked as the file store checks them (what a checked
    // read can reach here), and their reads from the disk (the files dropped from the page
    // cache: context for a store the page cache cannot hold); never the reference.
    if (!direct) {
      KVTIER_ASSIGN_OR_RETURN(Baseline b, FileBaseline(file_dir, src, dst, o.batch_pages, o.repeats,
                                                       o.storage.io_threads,
                                                       /*direct=*/false, sync, /*cold=*/false,
                                                       /*checked=*/true));
      baselines.push_back(std::move(b));
    }
    if (!direct) {
      Result<Baseline> cold = FileBaseline(file_dir, src, dst, o.batch_pages, o.repeats,
                                           o.storage.io_threads, /*direct=*/false, sync,
                                           /*cold=*/true);
      if (cold.ok()) {
        baselines.push_back(std::move(*cold));
      } else {
        std::fprintf(stderr, "kvtier bench: cold baseline not measured: %s\n",
                     cold.status().message().c_str());
      }
    }
  } else if (kind == StorageBaseline::kMemcpy) {
    baselines.push_back(MemcpyBaseline(src, dst, o.batch_pages, o.repeats));
  } else if (kind == StorageBaseline::kRedisBenchmark) {
    if (key_space > 0) {
      KVTIER_ASSIGN_OR_RETURN(
          Baseline b, RedisBenchmarkBaseline(o.url, src.count, src.page_bytes, key_space, o));
      baselines.push_back(std::move(b));
    }
    KVTIER_ASSIGN_OR_RETURN(Baseline b,
                            RedisBenchmarkBaseline(o.url, src.count, src.page_bytes, 0, o));
    baselines.push_back(std::move(b));
  }
  return baselines;
}

}  // namespace kvtier::tools
