// Internal: the file store's index — which pages one process knows to be stored in a namespace
// directory, their LRU order and byte count against the capacity, the stamps that carry that
// order across restarts, and the restart scan that rebuilds it. No page I/O here: the file
// backend (file_backend.cc, through file_page_io.h) reads and writes the pages and tells the
// index what it found.
//
// Stamps: nanoseconds since the epoch, stored as each page file's mtime. Every stamp handed out
// is strictly greater than every stamp handed out before or loaded at start, so sorting the files
// by mtime at the next start gives the same LRU order.
//
// Invariants (under `mu_`): `entries_` holds the known pages and `lru_` lists exactly their keys,
// most recently used first; `bytes_` is the sum of their sizes and, after Put or Load returns,
// at most `capacity` (except a lone page larger than the capacity, which Put never admits: the
// backend refuses such a Set before writing).
//
// Thread safety: every method may be called from any thread; `remove` runs under the index's
// mutex (so a victim's file goes before another thread can add the same key again) and must not
// call back into the index.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kvtier/page_key.h"
#include "kvtier/status.h"

namespace kvtier::storage {

class FileIndex {
 public:
  // A page found on disk at start.
  struct Found {
    PageKey key;
    int64_t bytes = 0;
    int64_t stamp = 0;
  };

  // `capacity` > 0: the most bytes of pages kept; `remove` deletes an evicted page's file.
  FileIndex(int64_t capacity, std::function<void(const PageKey&)> remove);

  // Loads the pages found at start (any order): oldest stamp least recently used. Later stamps
  // are greater than all of theirs. Evicts down to the capacity (it may have shrunk since).
  void Load(std::vector<Found> found);

  // A stamp for a page about to be written or just hit (strictly increasing).
  int64_t NextStamp();

  // A page just written (or replaced) with `stamp`: most recently used; then evicts the least
  // recently used others until the bytes fit.
  void Put(const PageKey& key, int64_t bytes, int64_t stamp);
  // A page just read and checked: most recently used, with a new stamp, returned (the caller
  // writes it as the file's mtime).
  int64_t Touch(const PageKey& key, int64_t bytes);
  // A page another process wrote, found by a lookup: least recently used (nobody here used it),
  // unless already known. No eviction (its bytes are another process's count too).
  void AddFound(const PageKey& key, int64_t bytes, int64_t stamp);
  // Forgets a page (removed, found absent or corrupt). No effect for an unknown key.
  void Erase(const PageKey& key);

  bool Contains(const PageKey& key) const;
  int64_t capacity() const { return capacity_; }
  int64_t pages() const;
  int64_t bytes() const;
  int64_t evicted() const;
  // Keys from most to least recently used (tests).
  std::vector<PageKey> LruOrder() const;

 private:
  struct Entry {
    int64_t bytes;
    std::list<PageKey>::iterator lru_pos;
  };
  void AddLocked(const PageKey& key, int64_t bytes, bool newest);
  void EraseLocked(const PageKey& key);
  void EvictLocked(const PageKey* keep);

  const int64_t capacity_;
  const std::function<void(const PageKey&)> remove_;
  mutable std::mutex mu_;
  std::unordered_map<PageKey, Entry, PageKeyHash> entries_;
  std::list<PageKey> lru_;
  int64_t bytes_ = 0;
  int64_t evicted_ = 0;
  int64_t last_stamp_ = 0;
};

// The restart scan of a namespace directory (held open as `ns_dirfd`): every regular file named
// by the hex of a key inside the shard directory of its first two digits, with its size and
// mtime. Temporary files (".tmp.<pid>.<n>.<hex>") whose writer process is gone are removed;
// anything else (other names, symlinks, a shard directory that is a symlink) is left alone and
// not indexed. IOError when a shard directory exists but cannot be read.
Result<std::vector<FileIndex::Found>> ScanPages(int ns_dirfd);

// The name prefix of a page file being written.
inline constexpr std::string_view kTempPrefix = ".tmp.";

}  // namespace kvtier::storage
