// The `file://` backend's Set path and Remove (file_backend_internal.h): a page written to a
// temporary file in its shard directory by the page I/O (file_page_io.h), optionally synced,
// stamped and published in place (PublishFile), then indexed; a chained Set skips pages whose
// parent this store evicted and drops those whose parent went while the batch ran (chain_lru.h).
// The free-space floor is asked before each write and a full disk (ENOSPC, EDQUOT) gets one retry
// after evicting (file_space_keeper.h); every other failure is a failed page with a warning. Each
// phase's time goes into the write profile (StorageStats' set_*_seconds).
#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/page_file.h"
#include "storage/chain_lru.h"
#include "storage/file/file_backend_internal.h"
#include "util/log.h"

namespace kvtier::storage {
namespace {

// A write past the process's file-size limit (RLIMIT_FSIZE, `ulimit -f`) raises SIGXFSZ, whose
// default action ends the process. The store's writes run on its I/O threads: each blocks SIGXFSZ
// for itself before its first write, so such a write fails with EFBIG (a failed Set) and the
// signal stays pending on that thread, never delivered (it is directed at the writing thread,
// and dropped when the thread ends). The process's disposition of SIGXFSZ and every other
// thread's mask are left as they are.
void BlockFileSizeSignalOnThisThread() {
  thread_local bool blocked = false;
  if (blocked) return;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGXFSZ);
  blocked = ::pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0;
}

}  // namespace

void FileBackend::DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                        std::span<PageStatus> out, Clock::time_point deadline) {
  ParallelFor(static_cast<int64_t>(keys.size()), [&](int64_t i) {
    const size_t k = static_cast<size_t>(i);
    out[k] = Clock::now() > deadline ? PageStatus::kTimedOut : SetOne(keys[k], buffers[k]);
  });
}

// The index records each page's parent: eviction takes a chain's tail first (file_index.h). A
// page whose parent this store evicted is not written (OrphansToSkip); one whose parent went
// while the batch ran is dropped after it (DropOrphans).
void FileBackend::DoSetChained(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                               std::span<const std::optional<PageKey>> parents,
                               std::span<PageStatus> out, Clock::time_point deadline) {
  const std::vector<uint8_t> skip = OrphansToSkip(
      keys, parents, [this](const PageKey& p) { return !WritePending(p) && index_->Gone(p); });
  ParallelFor(static_cast<int64_t>(keys.size()), [&](int64_t i) {
    const size_t k = static_cast<size_t>(i);
    out[k] = skip[k]                   ? PageStatus::kSkipped
             : Clock::now() > deadline ? PageStatus::kTimedOut
                                       : SetOne(keys[k], buffers[k], parents[k]);
  });
  DropOrphans(
      keys, parents, out, [this](const PageKey& p) { return WritePending(p); },
      [this](const PageKey& k, const PageKey& p, bool in_batch) {
        return index_->DropOrphan(k, p, in_batch);
      });
  reclaimer_->Relieve();
}

void FileBackend::DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                           Clock::time_point deadline) {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (Clock::now() > deadline) {
      out[i] = PageStatus::kTimedOut;
      continue;
    }
    index_->Erase(keys[i]);
    out[i] = RemoveFile(keys[i]) ? PageStatus::kOk : PageStatus::kFailed;
  }
}

// A page written (SetOne) or refused: kNoSpace when the page is larger than the capacity, when
// the free space is under the floor and evicting this store's pages does not bring it back,
// or when the file system is full (ENOSPC, EDQUOT: its oldest pages are evicted and the write
// is tried once more): file_space_keeper.h.
PageStatus FileBackend::SetOne(const PageKey& key, const PageBuffer& buffer,
                               const std::optional<PageKey>& parent) {
  if (value_bytes_ > index_->capacity()) return PageStatus::kNoSpace;
  BlockFileSizeSignalOnThisThread();
  if (!space_->AdmitWrite()) return PageStatus::kNoSpace;
  int error = 0;
  PageStatus st = WriteOne(key, buffer, parent, error);
  if (st != PageStatus::kNoSpace) return st;
  if (!space_->RetryAfterFull(error)) return PageStatus::kNoSpace;
  return WriteOne(key, buffer, parent, error);
}

// One attempt at writing a page: a temporary file in its shard directory, renamed into place.
// kNoSpace with `error` ENOSPC or EDQUOT when the file system has no room (said by SetOne, not
// here), kFailed with a warning for any other failure (EFBIG past the file-size limit: said at
// the 1st, 2nd, 4th ... time, as a full disk is). Every phase's time goes into write_profile_
// (StorageStats' set_*_seconds).
PageStatus FileBackend::WriteOne(const PageKey& key, const PageBuffer& buffer,
                                 const std::optional<PageKey>& parent, int& error) {
  const auto full = [](int e) { return e == ENOSPC || e == EDQUOT; };
  using WClock = WriteProfile::Clock;
  const WClock::time_point start = WClock::now();
  const std::string hex = key.Hex();
  Fd shard = OpenShard(hex, /*create=*/true);
  if (!shard.ok()) {
    error = errno;
    if (full(error)) return PageStatus::kNoSpace;
    util::Log(util::LogLevel::kWarning, "storage {}: cannot open the directory {}/{}: {}", url(),
              ns_name_, hex.substr(0, 2),
              error == ELOOP ? "a symlink is on its path, which a store never follows"
                             : std::strerror(error));
    return PageStatus::kFailed;
  }
  const WClock::time_point dir_opened = WClock::now();
  const std::string temp =
      fmt::format("{}{}.{}.{}", kTempPrefix, ::getpid(), temp_counter_.fetch_add(1), hex);
  Fd fd(::openat(
      shard.get(), temp.c_str(),
      O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | (config_.direct ? O_DIRECT : 0),
      0600));
  if (!fd.ok()) {
    error = errno;
    if (full(error)) return PageStatus::kNoSpace;
    util::Log(util::LogLevel::kWarning, "storage {}: cannot create {}/{}/{}: {}", url(), ns_name_,
              hex.substr(0, 2), temp, std::strerror(error));
    return PageStatus::kFailed;
  }
  const WClock::time_point opened = WClock::now();
  WriteTimes io;
  bool ok = io_.WritePage(fd.get(), key, buffer, parent, &io);
  const WClock::time_point written = WClock::now();
  ok = ok && (!config_.fsync || ::fdatasync(fd.get()) == 0);
  const WClock::time_point synced = config_.fsync ? WClock::now() : written;
  // Room in the reclaimer for the one file this write may detach (the page its Put evicts, or
  // the key's older file it replaces): the waiting files stay within their bound, so the files
  // on disk within the capacity. Unlinks on this thread only when the reclaimer falls behind.
  reclaimer_->Reserve(value_bytes_);
  struct Room {
    FileReclaimer& r;
    int64_t bytes;
    ~Room() { r.Release(bytes); }
  } room{*reclaimer_, value_bytes_};
  const WClock::time_point reserved = WClock::now();
  int64_t stamp = 0;
  bool replaced = false;  // the key's older file swapped out to `temp` (PublishFile)
  if (ok) {
    stamp = index_->NextStamp();
    const timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(stamp)};
    ok = ::futimens(fd.get(), times) == 0 &&
         PublishFile(shard.get(), temp.c_str(), hex.c_str(), &replaced);
  }
  if (!ok) {
    error = errno;
    ::unlinkat(shard.get(), temp.c_str(), 0);
    if (full(error)) return PageStatus::kNoSpace;
    if (error == EFBIG) {  // every page fails alike: said as a full disk is, not per page
      if (const int64_t n = CountAndSay(file_too_large_)) {
        util::Log(util::LogLevel::kWarning,
                  "storage {}: cannot write a page file of {} bytes: {} (the process's file-size "
                  "limit, ulimit -f, is below it); {} page(s) not written so far",
                  url(), value_bytes_, std::strerror(error), n);
      }
      return PageStatus::kFailed;
    }
    util::Log(util::LogLevel::kWarning, "storage {}: cannot write {}/{}/{}: {}", url(), ns_name_,
              hex.substr(0, 2), hex, std::strerror(error));
    return PageStatus::kFailed;
  }
  if (config_.fsync) ::fsync(shard.get());
  // The older file of the key, swapped out: unlinked by the reclaimer, as the evicted ones.
  if (replaced) reclaimer_->Add(std::move(shard), temp, value_bytes_);
  const WClock::time_point published = WClock::now();
  space_->NoteWritten();
  index_->Put(key, value_bytes_, stamp, parent);
  const WClock::time_point indexed = WClock::now();
  reclaimer_->Relieve();  // files detached beyond the reservations (none, mostly)
  // The unlink phase: what this writer unlinked itself, making room and after its Put.
  write_profile_.Add(WriteProfile::Ns(opened - start), WriteProfile::Ns(dir_opened - start), io,
                     WriteProfile::Ns(synced - written), WriteProfile::Ns(published - reserved),
                     WriteProfile::Ns(indexed - published),
                     WriteProfile::Ns((reserved - synced) + (WClock::now() - indexed)));
  return PageStatus::kOk;
}

}  // namespace kvtier::storage
