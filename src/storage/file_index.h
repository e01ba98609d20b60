// Internal: the file store's index — which pages one process knows to be stored in a namespace
// directory, their LRU order and byte count against the capacity, the stamps that carry that
// order across restarts, and the restart scan that rebuilds it. No page I/O here: the file
// backend (file_backend.cc, through file_page_io.h) reads and writes the pages and tells the
// index what it found.
//
// Eviction takes a chain's tail before its head (chain_lru.h): a page written with its parent's
// key is evicted only after every stored page naming it as parent, so eviction never leaves a
// stored page whose prefix page is gone. Each page file's header names its parent too (page
// format version 2, page_format.h), so the restart scan rebuilds the chains. Roots (plain LRU
// among the leaves): pages written without a parent, and pages of format version 1 (an older
// kvtier) or whose header does not check out found at a restart or by a lookup. A page another
// process wrote into the same directory, found by a lookup (AddFound from Exists, Touch from Get),
// is added with the parent its header names, so this process evicts it after its children too.
//
// Stamps: nanoseconds since the epoch, stored as each page file's mtime. Every stamp handed out
// is strictly greater than every stamp handed out before or loaded at start. A write's stamp is
// stored with the file, before its rename. A hit's (Touch) is needed on disk only when the file's
// mtime is older than it by more than the backend's granularity (kStampGranularityNs in
// file_backend.cc, 1 s), so a page read over and over costs one inode write a second, not one
// per read; and it is not written on the read path: the backend keeps it pending (a bounded map,
// HitStamper in file_backend.cc) and its stamper thread writes it behind the reads, within about
// 0.5 s, and every pending one at Close (within 2 s), each only onto the file that was hit and
// only when that file's mtime is older (never over a page written after the hit). The order in
// this index is exact. The order a restart recovers by sorting the files by mtime is exact to
// within the granularity, once the pending stamps are written: of two pages last used further
// apart the later is the more recent after the restart, while a page hit again within the
// granularity of its stamp keeps its earlier place. Approximations beyond that: a crash (or a
// Close past its budget) loses the pending stamps, so a restart orders pages hit in the last
// ~0.5 s by their earlier stamps; and when more hits are pending than the bound (64 Ki pages)
// the oldest pending is dropped (counted), its page keeping its earlier stamp on disk.
//
// Invariants (under `mu_`): `pages_` holds the known pages, their parents and recency; its bytes
// are the sum of their sizes and, after Put or Load returns, at most `capacity` (except a lone page
// larger than the capacity, which Put never admits: the backend refuses such a Set before writing;
// and pinned pages filling it: eviction skips pages `pinned` names, and a page Put finds no
// unpinned room for is evicted itself).
//
// Thread safety: every method may be called from any thread; `remove` runs under the index's
// mutex (so a victim's file goes before another thread can add the same key again) and must not
// call back into the index.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "kvtier/page_key.h"
#include "kvtier/status.h"
#include "storage/chain_lru.h"

namespace kvtier::storage {

class FileIndex {
 public:
  // A page found on disk at start.
  struct Found {
    Found() = default;
    Found(const PageKey& key, int64_t bytes, int64_t stamp,
          std::optional<PageKey> parent = std::nullopt, uint16_t version = 0)
        : key(key), bytes(bytes), stamp(stamp), parent(parent), version(version) {}

    PageKey key;
    int64_t bytes = 0;
    int64_t stamp = 0;
    std::optional<PageKey> parent;  // what its header names (nullopt: none, or unknown)
    // Its header's format version; 0 when the header does not check out (the page is a miss when
    // read: kept in the index until then, as before the scan read headers).
    uint16_t version = 0;
  };

  // `capacity` > 0: the most bytes of pages kept; `remove` deletes an evicted page's file;
  // `pinned` (null: none) names pages eviction must skip (storage/page_pins.h; called under the
  // index's mutex).
  FileIndex(int64_t capacity, std::function<void(const PageKey&)> remove,
            std::function<bool(const PageKey&)> pinned = nullptr);

  // Loads the pages found at start (any order) with their parents: oldest stamp least recently
  // used. Later stamps are greater than all of theirs. Evicts down to the capacity (it may have
  // shrunk since), a chain's tail first.
  void Load(std::vector<Found> found);

  // A stamp for a page about to be written or just hit (strictly increasing).
  int64_t NextStamp();

  // A page just written (or replaced) with `stamp`: most recently used, its parent recorded when
  // given (nullopt: unknown, or the one recorded before); then evicts until the bytes fit, each
  // victim the least recently used page no stored page names as parent (the page itself last:
  // when it is the only such page, the tail of a chain longer than the room).
  void Put(const PageKey& key, int64_t bytes, int64_t stamp,
           const std::optional<PageKey>& parent = std::nullopt);
  // A page just read and checked: most recently used, with a new stamp, returned (the caller has
  // it written behind the read as the file's mtime when the mtime is older by more than its
  // granularity: "Stamps" above). `parent`:
  // what its header names (nullopt keeps the parent recorded; an unknown key, one another process
  // wrote, is then a root).
  int64_t Touch(const PageKey& key, int64_t bytes,
                const std::optional<PageKey>& parent = std::nullopt);
  // A page another process wrote, found by a lookup, with the parent its header names (nullopt:
  // none, or a header of version 1 or that does not check out: a root): least recently used
  // (nobody here used it), unless already known. No eviction (its bytes are another process's
  // count too). Whether it was added.
  bool AddFound(const PageKey& key, int64_t bytes, int64_t stamp,
                const std::optional<PageKey>& parent = std::nullopt);
  // Evicts `key` (its file removed) when `parent` is not stored and either `parent_in_batch` (a
  // page of the same Set) or evicted by this index: a page written after its parent went
  // (DropOrphans in chain_lru.h). Whether it did.
  bool DropOrphan(const PageKey& key, const PageKey& parent, bool parent_in_batch);
  // Whether `key` is not stored and was evicted here (OrphansToSkip in chain_lru.h).
  bool Gone(const PageKey& key) const;
  // Forgets a page (removed, found absent or corrupt). No effect for an unknown key.
  void Erase(const PageKey& key);

  bool Contains(const PageKey& key) const;
  int64_t capacity() const { return capacity_; }
  int64_t pages() const;
  int64_t bytes() const;
  int64_t evicted() const;
  // Keys from most to least recently used (tests).
  std::vector<PageKey> LruOrder() const;
  // The parent recorded for `key` (tests; nullopt: none or unknown key).
  std::optional<PageKey> ParentOf(const PageKey& key) const;

 private:
  void EvictLocked(const PageKey* keep);

  const int64_t capacity_;
  const std::function<void(const PageKey&)> remove_;
  const std::function<bool(const PageKey&)> pinned_;
  mutable std::mutex mu_;
  ChainLru<PageKey, PageKeyHash> pages_;
  int64_t evicted_ = 0;
  int64_t last_stamp_ = 0;
};

// The restart scan of a namespace directory (held open as `ns_dirfd`) of the namespace whose hash
// is `namespace_hash`: every regular file named by the hex of a key inside the shard directory of
// its first two digits, with its size, mtime and the parent its header names (one open and one
// read of the header's bytes per page; the payload is not read, its checks wait for the Get),
// in no particular order. Shards are scanned by 16 threads at once (joined before it returns).
// Temporary files (".tmp.<pid>.<n>.<hex>") whose writer process is gone are removed; anything
// else (other names, symlinks, a shard directory that is a symlink) is left alone and not indexed.
// IOError when a shard directory exists but cannot be read.
Result<std::vector<FileIndex::Found>> ScanPages(int ns_dirfd, uint64_t namespace_hash);

// Fills `f.parent` and `f.version` from the header of the page file open as `fd` (`f.key` and
// `f.bytes`, its size, already set) when it checks out; leaves them unset otherwise (a file
// shorter than a page's header block, a read error or short read, a header that does not check
// out). One pread of kMaxPageHeaderBytes at offset 0; the payload is not read.
void ReadFoundHeader(int fd, uint64_t namespace_hash, FileIndex::Found& f);

// The name prefix of a page file being written.
inline constexpr std::string_view kTempPrefix = ".tmp.";

}  // namespace kvtier::storage
