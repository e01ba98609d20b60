// The decision ring's layout and records (see tp/decision_ring.h).
#include "tp/decision_ring.h"

#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <ctime>
#include <limits>

namespace kvtier::tp {

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

namespace {

constexpr int64_t kRunBytes = 2 * static_cast<int64_t>(sizeof(int64_t));
constexpr int64_t kMaxLayers = 1 << 20;
constexpr int64_t kMaxSlots = int64_t{1} << 40;

int64_t AlignUp(int64_t n) {
  return (n + kRecordAlignment - 1) / kRecordAlignment * kRecordAlignment;
}

int64_t RecordBytes(int64_t src_runs, int64_t dst_runs) {
  return AlignUp(static_cast<int64_t>(sizeof(RecordHeader) + sizeof(CopyBody)) +
                 (src_runs + dst_runs) * kRunBytes);
}

Status CheckFields(const CopyFields& f) {
  if (f.num_slots <= 0) return Status::InvalidArgument("tp copy: no slots");
  if (f.num_layers <= 0 || f.num_layers > kMaxLayers || f.src_layer < 0 || f.dst_layer < 0 ||
      f.src_layer > kMaxLayers || f.dst_layer > kMaxLayers) {
    return Status::InvalidArgument(
        fmt::format("tp copy: layers src {} dst {} count {} out of range", f.src_layer, f.dst_layer,
                    f.num_layers));
  }
  if (static_cast<uint8_t>(f.src) > 1 || static_cast<uint8_t>(f.dst) > 1) {
    return Status::InvalidArgument("tp copy: unknown tier");
  }
  return Status::OK();
}

CopyFields CopyFieldsOf(const TpCopy& c) {
  return CopyFields{c.src,       c.dst,        c.src_layer,
                    c.dst_layer, c.num_layers, static_cast<int64_t>(c.src_slots.size())};
}

Status CheckSlots(std::span<const int64_t> slots, const char* name) {
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0 || slots[i] >= kMaxSlots) {
      return Status::InvalidArgument(
          fmt::format("tp copy: {}[{}] = {} is out of range", name, i, slots[i]));
    }
  }
  return Status::OK();
}

}  // namespace

int64_t SegmentBytes(int64_t ring_bytes) { return DataOffset() + ring_bytes; }

std::vector<SlotRun> SlotRuns(std::span<const int64_t> slots) {
  std::vector<SlotRun> runs;
  SlotRunsOf(
      static_cast<int64_t>(slots.size()), [&](int64_t i) { return slots[static_cast<size_t>(i)]; },
      &runs);
  return runs;
}

Status ValidateCopyRuns(const CopyFields& f, std::span<const SlotRun> src,
                        std::span<const SlotRun> dst) {
  KVTIER_RETURN_IF_ERROR(CheckFields(f));
  for (auto [runs, name] : {std::pair{src, "src_slots"}, {dst, "dst_slots"}}) {
    int64_t n = 0;
    for (const auto& [start, len] : runs) {
      // A run's last slot is start + len - 1 (no overflow: len <= num_slots <= the list's size).
      if (start < 0 || len <= 0 || start >= kMaxSlots || len > kMaxSlots - start) {
        return Status::InvalidArgument(fmt::format(
            "tp copy: {} has slots out of range (a run of {} from {})", name, len, start));
      }
      n += len;
    }
    if (n != f.num_slots) {
      return Status::InvalidArgument(
          fmt::format("tp copy: {} has {} slots, the copy {}", name, n, f.num_slots));
    }
  }
  return Status::OK();
}

int64_t CopyRecordBytes(int64_t src_runs, int64_t dst_runs) {
  return RecordBytes(src_runs, dst_runs);
}

void WriteCopyRecord(const CopyFields& f, std::span<const SlotRun> src,
                     std::span<const SlotRun> dst, uint64_t seq, std::byte* out) {
  const int64_t bytes =
      RecordBytes(static_cast<int64_t>(src.size()), static_cast<int64_t>(dst.size()));
  const RecordHeader h{static_cast<uint32_t>(bytes), static_cast<uint32_t>(RecordType::kCopy), seq};
  CopyBody b{};
  b.src_tier = static_cast<uint8_t>(f.src);
  b.dst_tier = static_cast<uint8_t>(f.dst);
  b.src_runs = static_cast<uint32_t>(src.size());
  b.dst_runs = static_cast<uint32_t>(dst.size());
  b.src_layer = static_cast<int32_t>(f.src_layer);
  b.dst_layer = static_cast<int32_t>(f.dst_layer);
  b.num_layers = static_cast<int32_t>(f.num_layers);
  b.num_slots = f.num_slots;
  std::byte* p = out;
  std::memcpy(p, &h, sizeof(h));
  p += sizeof(h);
  std::memcpy(p, &b, sizeof(b));
  p += sizeof(b);
  for (const auto runs : {src, dst}) {
    if (!runs.empty()) std::memcpy(p, runs.data(), runs.size() * kRunBytes);
    p += static_cast<int64_t>(runs.size()) * kRunBytes;
  }
  // The alignment's tail: zeros, so a record's bytes do not depend on what the ring held.
  std::memset(p, 0, static_cast<size_t>(out + bytes - p));
}

Status ValidateCopy(const TpCopy& copy) {
  if (copy.src_slots.size() != copy.dst_slots.size()) {
    return Status::InvalidArgument(fmt::format("tp copy: {} source slots but {} destination slots",
                                               copy.src_slots.size(), copy.dst_slots.size()));
  }
  KVTIER_RETURN_IF_ERROR(CheckFields(CopyFieldsOf(copy)));
  KVTIER_RETURN_IF_ERROR(CheckSlots(copy.src_slots, "src_slots"));
  return CheckSlots(copy.dst_slots, "dst_slots");
}

int64_t EncodedCopyBytes(const TpCopy& copy) {
  return RecordBytes(static_cast<int64_t>(SlotRuns(copy.src_slots).size()),
                     static_cast<int64_t>(SlotRuns(copy.dst_slots).size()));
}

std::vector<std::byte> EncodeCopy(const TpCopy& copy, uint64_t seq) {
  const auto src = SlotRuns(copy.src_slots);
  const auto dst = SlotRuns(copy.dst_slots);
  std::vector<std::byte> out(static_cast<size_t>(
      RecordBytes(static_cast<int64_t>(src.size()), static_cast<int64_t>(dst.size()))));
  WriteCopyRecord(CopyFieldsOf(copy), src, dst, seq, out.data());
  return out;
}

Result<TpCopy> DecodeCopy(std::span<const std::byte> record, int64_t max_slots) {
  const int64_t n = static_cast<int64_t>(record.size());
  if (n < static_cast<int64_t>(sizeof(RecordHeader) + sizeof(CopyBody))) {
    return Status::Corruption(fmt::format("tp record: {} bytes is too short for a copy", n));
  }
  RecordHeader h;
  CopyBody b;
  std::memcpy(&h, record.data(), sizeof(h));
  std::memcpy(&b, record.data() + sizeof(h), sizeof(b));
  if (h.type != static_cast<uint32_t>(RecordType::kCopy) || h.bytes != n) {
    return Status::Corruption(fmt::format("tp record {}: type {} / {} bytes, expected a copy of {}",
                                          h.seq, h.type, h.bytes, n));
  }
  if (b.src_tier > 1 || b.dst_tier > 1 || b.num_slots <= 0 || b.num_layers <= 0 ||
      b.src_layer < 0 || b.dst_layer < 0 || b.src_runs == 0 || b.dst_runs == 0 ||
      RecordBytes(b.src_runs, b.dst_runs) != n) {
    return Status::Corruption(fmt::format(
        "tp record {}: bad copy header (tiers {}/{}, slots {}, layers {}+{}/{}, runs {}/{})", h.seq,
        b.src_tier, b.dst_tier, b.num_slots, b.src_layer, b.num_layers, b.dst_layer, b.src_runs,
        b.dst_runs));
  }
  if (b.num_slots > max_slots) {
    return Status::Corruption(
        fmt::format("tp record {}: a copy of {} slots, more than a region holds ({} slots)", h.seq,
                    b.num_slots, max_slots));
  }
  TpCopy c;
  c.src = static_cast<TpTier>(b.src_tier);
  c.dst = static_cast<TpTier>(b.dst_tier);
  c.src_layer = b.src_layer;
  c.dst_layer = b.dst_layer;
  c.num_layers = b.num_layers;
  const std::byte* p = record.data() + sizeof(h) + sizeof(b);
  for (auto [runs, out] : {std::pair{b.src_runs, &c.src_slots}, {b.dst_runs, &c.dst_slots}}) {
    for (uint32_t r = 0; r < runs; ++r, p += kRunBytes) {
      int64_t start = 0, len = 0;
      std::memcpy(&start, p, sizeof(start));
      std::memcpy(&len, p + sizeof(start), sizeof(len));
      if (start < 0 || len <= 0 || start > kMaxSlots || len > kMaxSlots - start ||
          static_cast<int64_t>(out->size()) + len > b.num_slots) {
        return Status::Corruption(
            fmt::format("tp record {}: run {} ({}, {}) out of range for {} slots", h.seq, r, start,
                        len, b.num_slots));
      }
      for (int64_t i = 0; i < len; ++i) out->push_back(start + i);
    }
    if (static_cast<int64_t>(out->size()) != b.num_slots) {
      return Status::Corruption(
          fmt::format("tp record {}: runs cover {} of {} slots", h.seq, out->size(), b.num_slots));
    }
  }
  return c;
}

std::vector<std::byte> EncodeMessage(std::span<const std::byte> message, RecordType type) {
  std::vector<std::byte> out(
      static_cast<size_t>(MessageRecordBytes(static_cast<int64_t>(message.size()))));
  const std::span<const std::byte> parts[1] = {message};
  WriteMessageRecord(parts, type, 0, out.data());
  return out;
}

int64_t MessageRecordBytes(int64_t payload_bytes) {
  return AlignUp(static_cast<int64_t>(sizeof(RecordHeader) + sizeof(uint64_t)) + payload_bytes);
}

void WriteMessageRecord(std::span<const std::span<const std::byte>> parts, RecordType type,
                        uint64_t seq, std::byte* out) {
  uint64_t len = 0;
  for (const auto& part : parts) len += part.size();
  const int64_t bytes = MessageRecordBytes(static_cast<int64_t>(len));
  const RecordHeader h{static_cast<uint32_t>(bytes), static_cast<uint32_t>(type), seq};
  std::memcpy(out, &h, sizeof(h));
  std::memcpy(out + sizeof(h), &len, sizeof(len));
  std::byte* p = out + sizeof(h) + sizeof(len);
  for (const auto& part : parts) {
    if (!part.empty()) std::memcpy(p, part.data(), part.size());
    p += part.size();
  }
  std::memset(p, 0, static_cast<size_t>(out + bytes - p));
}

Result<std::span<const std::byte>> DecodeMessage(std::span<const std::byte> record) {
  RecordHeader h{};
  uint64_t len = 0;
  constexpr size_t kHead = sizeof(RecordHeader) + sizeof(uint64_t);
  if (record.size() >= kHead) {
    std::memcpy(&h, record.data(), sizeof(h));
    std::memcpy(&len, record.data() + sizeof(h), sizeof(len));
  }
  if (record.size() < kHead ||
      (h.type != static_cast<uint32_t>(RecordType::kMessage) &&
       h.type != static_cast<uint32_t>(RecordType::kStorage)) ||
      len > record.size() - kHead) {
    return Status::Corruption(fmt::format(
        "tp record {}: not a message of {} bytes in {} record bytes", h.seq, len, record.size()));
  }
  return record.subspan(kHead, static_cast<size_t>(len));
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, double timeout_s) {
  if (!(timeout_s > 0)) return;
  timespec ts{};
  const double whole = std::floor(timeout_s);
  ts.tv_sec = static_cast<time_t>(std::min(whole, 1e6));
  ts.tv_nsec = static_cast<long>((timeout_s - whole) * 1e9);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace kvtier::tp
