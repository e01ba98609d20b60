// Internal: the decision ring of a TP group (kvtier/tp_group.h, docs/tp.md) — its shared-memory
// layout and the encoding of its records.
//
//   offset 0       RingHeader (magic, version, sizes, the leader, the shape, the write position,
//                  futex words) and one RankRecord per rank
//   data_offset    ring_bytes of records, each at a 16-byte aligned position
//
// Positions are monotonic byte counts (never wrapped); a record starts at `pos % ring_bytes` and
// never crosses the end (a pad record fills the tail instead). One writer, the leader: it writes
// a record's bytes, then publishes it by storing `write_pos` (release) and waking the followers
// (futex on `post_word`). Each follower reads records in place up to `write_pos` (acquire),
// applies them, and only then advances its `read_pos` and `applied_seq` (release) and wakes the
// leader (`ack_word`): the leader reuses ring bytes only below every attached rank's read_pos.
// A wake is a system call only when the other side sleeps (`post_sleepers`, `ack_sleepers`):
// a follower polls the ring for a while (TpGroupConfig::follower_poll_s) before it sleeps.
//
// A record: RecordHeader {bytes, type, seq}, then for kCopy a CopyBody and the slot lists as runs
// (start, length) of consecutive slots — page-aligned lists are one run per page or fewer; for
// kMessage a uint64 length and the engine's opaque bytes (its step, ordered with the copies);
// kStorage the same framing around a storage decision (get or set: page keys and host pages).
//
// Thread safety: plain data in shared memory; the atomics say who may write what (see above).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/tp_group.h"

namespace kvtier::tp {

inline constexpr uint64_t kRingMagic = 0x3150544b52454954ULL;  // "TIERKTP1" little-endian
inline constexpr uint32_t kRingVersion = 2;
inline constexpr int64_t kRecordAlignment = 16;

enum class RecordType : uint32_t { kPad = 1, kCopy = 2, kMessage = 3, kStorage = 4 };

struct RecordHeader {
  uint32_t bytes;  // the whole record, a multiple of kRecordAlignment
  uint32_t type;   // RecordType
  uint64_t seq;    // kCopy: 1, 2, ... in publication order; kPad: 0
};
static_assert(sizeof(RecordHeader) == 16);

struct CopyBody {
  uint8_t src_tier;  // TpTier
  uint8_t dst_tier;
  uint16_t reserved;
  uint32_t src_runs;  // (start, length) pairs of int64 after the body: src_runs, then dst_runs
  uint32_t dst_runs;
  int32_t src_layer;
  int32_t dst_layer;
  int32_t num_layers;
  int64_t num_slots;
};
static_assert(sizeof(CopyBody) == 32);

enum class RankState : uint32_t { kFree = 0, kAttached = 1, kFailed = 2 };

struct alignas(64) RankRecord {
  std::atomic<uint32_t> state;  // RankState; the follower's
  uint32_t reserved;
  int64_t pid;                        // the follower's, while attached
  uint64_t start_time;                // /proc/<pid>/stat field 22 (tells a reused pid apart)
  std::atomic<uint64_t> read_pos;     // ring bytes consumed (records applied)
  std::atomic<uint64_t> applied_seq;  // the last record applied
  uint64_t failed_seq;                // kFailed: the record whose copy failed
  char error[192];                    // kFailed: its message (NUL-terminated)
  // Results of messages and storage decisions by sequence number: slot seq % kResultSlots holds
  // {seq, value}, written before applied_seq moves past seq (value first, then seq, release).
  struct SeqResult {
    std::atomic<uint64_t> seq;
    std::atomic<uint64_t> value;
  } results[256];
};
inline constexpr uint64_t kResultSlots = 256;

struct RingHeader {
  std::atomic<uint64_t> magic;  // stored last by the creator (release)
  uint32_t version;
  int32_t tp_size;
  int64_t ring_bytes;
  int64_t data_offset;
  int64_t leader_pid;
  uint64_t leader_start_time;
  TpShape shape;
  std::atomic<uint32_t> closed;     // the leader is gone (its destructor)
  std::atomic<uint32_t> post_word;  // futex: bumped per publication
  std::atomic<uint32_t> ack_word;   // futex: bumped per follower acknowledgement or attach
  // Threads in (or about to enter) a futex wait on post_word (followers) / ack_word (the
  // leader's): a bump of the word makes the wake system call only when one is there.
  std::atomic<uint32_t> post_sleepers;
  std::atomic<uint32_t> ack_sleepers;
  uint32_t reserved;
  std::atomic<uint64_t> write_pos;  // ring bytes published
  RankRecord ranks[kMaxTpSize];     // [0] unused (the leader)
};

// Bytes of a segment holding a ring of `ring_bytes`.
int64_t SegmentBytes(int64_t ring_bytes);
inline int64_t DataOffset() {
  return (static_cast<int64_t>(sizeof(RingHeader)) + 4095) / 4096 * 4096;
}

using SlotRun = std::pair<int64_t, int64_t>;  // (start, length)
static_assert(sizeof(SlotRun) == 16);         // a record's run, as written

// The runs (start, length) of consecutive slots in `slots`, in order.
std::vector<SlotRun> SlotRuns(std::span<const int64_t> slots);
// The same for `count` slots `at(0) .. at(count-1)`, into `runs` (cleared first; its capacity is
// reused, so a caller that keeps it allocates nothing per copy).
template <typename At>
void SlotRunsOf(int64_t count, const At& at, std::vector<SlotRun>* runs) {
  runs->clear();
  if (count <= 0) return;
  // The current run in registers, stored when it ends.
  int64_t start = at(0), length = 1;
  for (int64_t i = 1; i < count; ++i) {
    const int64_t s = at(i);
    // Unsigned difference, after s > start: no overflow whatever the (not yet validated) slots.
    if (s > start &&
        static_cast<uint64_t>(s) - static_cast<uint64_t>(start) == static_cast<uint64_t>(length)) {
      ++length;
    } else {
      runs->emplace_back(start, length);
      start = s;
      length = 1;
    }
  }
  runs->emplace_back(start, length);
}

// A copy's fields besides its slot lists (the record's CopyBody, before the runs are counted).
struct CopyFields {
  TpTier src = TpTier::kDevice;
  TpTier dst = TpTier::kHost;
  int64_t src_layer = 0, dst_layer = 0, num_layers = 0;
  int64_t num_slots = 0;
};
// Checks the fields and the runs' slots (slots >= 0 within range, equal counts, layers in
// range): ValidateCopy's checks on the run form.
Status ValidateCopyRuns(const CopyFields& f, std::span<const SlotRun> src,
                        std::span<const SlotRun> dst);
// Bytes of a copy record of these many runs.
int64_t CopyRecordBytes(int64_t src_runs, int64_t dst_runs);
// Writes the copy record (CopyRecordBytes bytes) of `f` and the runs with sequence number `seq`
// at `out` — in place, e.g. into the ring.
void WriteCopyRecord(const CopyFields& f, std::span<const SlotRun> src,
                     std::span<const SlotRun> dst, uint64_t seq, std::byte* out);

// Checks `copy` (equal non-empty lengths within int32 runs, slots >= 0, layers in range).
Status ValidateCopy(const TpCopy& copy);
// The record of `copy` with sequence number `seq`: bytes a multiple of kRecordAlignment.
std::vector<std::byte> EncodeCopy(const TpCopy& copy, uint64_t seq);
// Bytes EncodeCopy would return (without encoding).
int64_t EncodedCopyBytes(const TpCopy& copy);
// Decodes a kCopy record (`record` spans its header.bytes); Corruption naming what is wrong,
// among it a copy of more than `max_slots` slots (a rank passes its regions' size), refused
// before its slot lists are expanded: a damaged record must not make a rank allocate without
// limit.
Result<TpCopy> DecodeCopy(std::span<const std::byte> record,
                          int64_t max_slots = std::numeric_limits<int64_t>::max());

// The record of an engine message or a storage decision (seq 0; the leader sets it when it
// publishes).
std::vector<std::byte> EncodeMessage(std::span<const std::byte> message,
                                     RecordType type = RecordType::kMessage);
// Bytes of the record of a message of `payload_bytes`.
int64_t MessageRecordBytes(int64_t payload_bytes);
// Writes the record of a message whose payload is the concatenation of `parts` (type kMessage or
// kStorage) with sequence number `seq` at `out` (MessageRecordBytes bytes): EncodeMessage in place.
void WriteMessageRecord(std::span<const std::span<const std::byte>> parts, RecordType type,
                        uint64_t seq, std::byte* out);
// The payload of a kMessage or kStorage record; Corruption when the length does not fit.
Result<std::span<const std::byte>> DecodeMessage(std::span<const std::byte> record);

// Futex wait/wake on a shared (not process-private) word. Wait returns on a change, a wake, a
// signal or after `timeout_s`.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, double timeout_s);
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace kvtier::tp
