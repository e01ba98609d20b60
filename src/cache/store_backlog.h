// Internal: the writes to storage that wait in the cache before they reach the store — at most
// `capacity_bytes` of them — ordered by how likely their pages are to be read again
// (StoreAdmission's estimate of a store's first page). The backup planner puts a store here when
// the store's queue (max_backup_queue_pages) is full, and takes the next one out when it has room.
//
// Order: Next takes the highest estimate (equal estimates: the oldest first). MakeRoom, for a
// newcomer, gives up the lowest estimates (equal estimates: the newest first), each strictly
// below the newcomer's; when those cannot free enough bytes, nothing is given up and the newcomer
// is the one dropped. So when the disk cannot take everything, what is dropped is what is least
// likely to be reused, not what came last.
//
// Thread safety: none; the cache's mutex guards it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace kvtier {

struct CopyOp;  // cache/copy_tracker.h

class StoreBacklog {
 public:
  explicit StoreBacklog(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}
  StoreBacklog(const StoreBacklog&) = delete;
  StoreBacklog& operator=(const StoreBacklog&) = delete;

  // REQUIRES: empty().
  void set_capacity_bytes(int64_t bytes) { capacity_bytes_ = bytes; }
  int64_t capacity_bytes() const { return capacity_bytes_; }
  int64_t bytes() const { return bytes_; }
  int64_t free_bytes() const { return capacity_bytes_ - bytes_; }
  int64_t tokens() const { return tokens_; }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

  // Makes room for `bytes` of a store whose estimate is `estimate`: removes and appends to
  // `victims` the entries of lowest estimate, each below `estimate`, until `bytes` fit. False
  // (nothing removed) when that cannot free enough, or `bytes` exceed the capacity.
  bool MakeRoom(int64_t bytes, int64_t estimate, std::vector<std::shared_ptr<CopyOp>>* victims);
  // REQUIRES: bytes <= free_bytes().
  void Add(std::shared_ptr<CopyOp> op, int64_t estimate, int64_t bytes, int64_t pages,
           int64_t tokens);
  // The entry of the highest estimate (equal: the oldest), removed and returned when its pages
  // are at most `room_pages`; else null (it waits for more room: smaller ones do not pass it).
  std::shared_ptr<CopyOp> Next(int64_t room_pages);

 private:
  struct Entry {
    std::shared_ptr<CopyOp> op;
    int64_t estimate;
    int64_t bytes;
    int64_t pages;
    int64_t tokens;
    uint64_t seq;  // arrival order
  };
  void Remove(size_t i);

  int64_t capacity_bytes_;
  int64_t bytes_ = 0;
  int64_t tokens_ = 0;
  uint64_t next_seq_ = 0;
  std::vector<Entry> entries_;  // unordered; backlogs hold few entries (a scan is cheap)
};

}  // namespace kvtier
