// One cache decision per TP group: a follower rank — attaching to the leader's ring, applying its
// records in order to this rank's regions and store, acknowledging them (see kvtier/tp_group.h,
// tp/decision_ring.h, docs/tp.md).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <thread>

#include "kvtier/tp_group.h"
#include "pool/shm_process.h"
#include "pool/shm_segment.h"
#include "tp/decision_ring.h"
#include "tp/group_common.h"

namespace kvtier {

using tp::After;
using tp::Bump;
using tp::kClaiming;
using tp::RankRecord;
using tp::RankState;
using tp::RecordHeader;
using tp::RecordType;
using tp::RingHeader;
using tp::SecondsLeft;
using tp::StateOf;
using tp::StorageOp;

namespace {

struct StorageDecision {
  StorageOp op;
  std::vector<PageKey> keys;
  std::vector<int64_t> pages;
};

Result<StorageDecision> DecodeStorage(std::span<const std::byte> in) {
  uint32_t o = 0;
  uint64_t n = 0;
  if (in.size() >= 16) {
    std::memcpy(&o, in.data(), 4);
    std::memcpy(&n, in.data() + 8, 8);
  }
  if (in.size() < 16 || (o != 1 && o != 2) || n > (uint64_t{1} << 24) ||
      in.size() != 16 + n * (sizeof(PageKey) + 8)) {
    return Status::Corruption("tp storage decision: bad header or length");
  }
  StorageDecision d{static_cast<StorageOp>(o), std::vector<PageKey>(n), std::vector<int64_t>(n)};
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(d.keys[i].bytes.data(), in.data() + 16 + i * sizeof(PageKey), sizeof(PageKey));
  }
  if (n > 0) std::memcpy(d.pages.data(), in.data() + 16 + n * sizeof(PageKey), n * 8);
  return d;
}

// The storage buffer of the host page starting at slot `page` (page_first, page_first_direct
// and page_head keep a page of each buffer contiguous at SlotBase, as PageStaging does).
Result<PageBuffer> HostPage(const KvRegion& host, int64_t page) {
  const KvGeometry& g = host.geometry;
  if (g.layout == KvLayout::kLayerFirst || page < 0 || page % g.page_size != 0 ||
      page >= g.num_slots) {
    return Status::InvalidArgument(
        fmt::format("tp storage decision: host page {} of a {} region of {} slots", page,
                    LayoutName(g.layout), g.num_slots));
  }
  const size_t bytes = static_cast<size_t>(g.page_size * g.num_layers * g.slot_bytes);
  std::span<std::byte> k(host.LayerBase(0, 0) + g.SlotBase(page), bytes);
  if (host.mla) return PageBuffer::Of(k);
  return PageBuffer::Of(k, std::span<std::byte>(host.LayerBase(1, 0) + g.SlotBase(page), bytes));
}

}  // namespace

// ---- follower ----------------------------------------------------------------------------------

struct TpFollower::Impl {
  TpGroupConfig config;
  int rank = 0;
  shm::SharedMapping mapping;
  RingHeader* h = nullptr;
  std::byte* data = nullptr;
  TpShape shape;
  TpFollowerStats stats;
  tp::Clock::time_point next_leader_check{};  // Serve checks the leader's pid from then on
  tp::Clock::time_point last_record{};        // the last record applied (or the attach)

  RankRecord& me() { return h->ranks[rank]; }

  Status Fail(uint64_t seq, Status st) {
    RankRecord& r = me();
    r.failed_seq = seq;
    const std::string msg = st.ToString();
    std::snprintf(r.error, sizeof(r.error), "%s", msg.c_str());
    r.state.store(static_cast<uint32_t>(RankState::kFailed), std::memory_order_release);
    Bump(&h->ack_word);
    return st;
  }

  // Applies the record at ring position `pos`; returns the bytes it took.
  Result<int64_t> ApplyAt(uint64_t pos, TransferEngine& engine, const KvRegion& device,
                          const KvRegion& host, const MessageHandler& on_message,
                          StorageBackend* storage) {
    const int64_t ring = h->ring_bytes;
    const int64_t off = static_cast<int64_t>(pos % static_cast<uint64_t>(ring));
    RecordHeader rh;
    std::memcpy(&rh, data + off, sizeof(rh));
    const uint64_t next = me().applied_seq.load(std::memory_order_relaxed) + 1;
    if (rh.bytes < sizeof(rh) || rh.bytes % tp::kRecordAlignment != 0 || rh.bytes > ring - off) {
      return Fail(next, Status::Corruption(fmt::format(
                            "tp record at ring offset {}: {} bytes does not fit", off, rh.bytes)));
    }
    if (rh.type == static_cast<uint32_t>(RecordType::kPad)) {
      if (rh.bytes != ring - off) {
        return Fail(next, Status::Corruption("tp pad record does not end at the ring's end"));
      }
      return static_cast<int64_t>(rh.bytes);
    }
    if (rh.seq != next) {
      return Fail(next, Status::Corruption(
                            fmt::format("tp record {} where {} was expected", rh.seq, next)));
    }
    if (rh.type == static_cast<uint32_t>(RecordType::kMessage)) {
      Result<std::span<const std::byte>> msg = tp::DecodeMessage(std::span(data + off, rh.bytes));
      if (!msg.ok()) return Fail(next, msg.status());
      if (on_message) {
        Result<uint64_t> value = on_message(*msg);
        if (!value.ok()) {
          return Fail(next,
                      value.status().WithContext(fmt::format("tp rank {} message {}", rank, next)));
        }
        SetResult(next, *value);
      }
      Applied(next, 0);
      return static_cast<int64_t>(rh.bytes);
    }
    if (rh.type == static_cast<uint32_t>(RecordType::kStorage)) {
      Result<uint64_t> ok = ApplyStorage(std::span(data + off, rh.bytes), host, storage);
      if (!ok.ok()) {
        return Fail(next, ok.status().WithContext(
                              fmt::format("tp rank {} storage decision {}", rank, next)));
      }
      SetResult(next, *ok);
      Applied(next, 0);
      return static_cast<int64_t>(rh.bytes);
    }
    // Bounded by the larger region: the slot lists are expanded from their runs.
    Result<TpCopy> copy = tp::DecodeCopy(std::span(data + off, rh.bytes),
                                         std::max(shape.device_slots, shape.host_slots));
    if (!copy.ok()) return Fail(next, copy.status());
    const KvRegion& src = copy->src == TpTier::kDevice ? device : host;
    const KvRegion& dst = copy->dst == TpTier::kDevice ? device : host;
    const TransferRequest req{&src,
                              &dst,
                              SlotIndices::Host(copy->src_slots),
                              SlotIndices::Host(copy->dst_slots),
                              copy->src_layer,
                              copy->dst_layer,
                              copy->num_layers};
    Status st = engine.Transfer(req);
    if (st.ok() && engine.backend() != TransferBackend::kCpu) st = engine.Synchronize(nullptr);
    if (!st.ok()) {
      return Fail(next, st.WithContext(fmt::format("tp rank {} applying record {}", rank, next)));
    }
    Applied(next, static_cast<int64_t>(copy->src_slots.size()));
    return static_cast<int64_t>(rh.bytes);
  }
  // Runs a storage decision on this rank's store; its leading pages that succeeded.
  static Result<uint64_t> ApplyStorage(std::span<const std::byte> record, const KvRegion& host,
                                       StorageBackend* storage) {
    if (storage == nullptr) return Status::FailedPrecondition("this rank has no storage tier");
    KVTIER_ASSIGN_OR_RETURN(std::span<const std::byte> payload, tp::DecodeMessage(record));
    KVTIER_ASSIGN_OR_RETURN(StorageDecision d, DecodeStorage(payload));
    std::vector<PageBuffer> buffers;
    for (int64_t p : d.pages) {
      KVTIER_ASSIGN_OR_RETURN(PageBuffer b, HostPage(host, p));
      buffers.push_back(b);
    }
    BatchResult r = d.op == StorageOp::kGet
                        ? storage->Get(std::move(d.keys), std::move(buffers)).get()
                        : storage->Set(std::move(d.keys), std::move(buffers)).get();
    return static_cast<uint64_t>(r.status.ok() ? r.leading_ok() : 0);
  }
  void SetResult(uint64_t seq, uint64_t value) {
    auto& slot = me().results[seq % tp::kResultSlots];
    slot.seq.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    slot.value.store(value, std::memory_order_relaxed);
    slot.seq.store(seq, std::memory_order_release);
  }
  void Applied(uint64_t seq, int64_t slots) {
    me().applied_seq.store(seq, std::memory_order_release);
    ++stats.records;
    stats.slots += slots;
    stats.applied_seq = seq;
  }
};

TpFollower::TpFollower(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<TpFollower>> TpFollower::Attach(const TpGroupConfig& config, int rank) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  if (rank < 1 || rank >= config.tp_size) {
    return Status::InvalidArgument(
        fmt::format("tp follower rank {} not in [1, tp_size = {})", rank, config.tp_size));
  }
  const auto deadline = After(config.attach_timeout_s);
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->rank = rank;
  for (;;) {
    Result<shm::SharedMapping> seg = shm::OpenSegment(config.name);
    if (seg.ok() && seg->bytes() >= static_cast<int64_t>(sizeof(RingHeader))) {
      auto* h = reinterpret_cast<RingHeader*>(seg->data());
      if (h->magic.load(std::memory_order_acquire) == tp::kRingMagic &&
          h->closed.load(std::memory_order_acquire) == 0) {
        if (h->version != tp::kRingVersion || h->tp_size != config.tp_size ||
            h->ring_bytes != config.ring_bytes || seg->bytes() < tp::SegmentBytes(h->ring_bytes) ||
            h->data_offset != tp::DataOffset()) {
          return Status::FailedPrecondition(fmt::format(
              "tp group '{}': the leader's ring (version {}, tp_size {}, ring_bytes {}) does not "
              "match this follower's (version {}, tp_size {}, ring_bytes {})",
              config.name, h->version, h->tp_size, h->ring_bytes, tp::kRingVersion, config.tp_size,
              config.ring_bytes));
        }
        impl->mapping = std::move(*seg);
        impl->h = h;
        break;
      }
    }
    if (SecondsLeft(deadline) <= 0) {
      return Status::Unavailable(fmt::format("tp group '{}': no leader's ring within {} s",
                                             config.name, config.attach_timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  RingHeader* h = impl->h;
  RankRecord& r = h->ranks[rank];
  uint32_t expected = static_cast<uint32_t>(RankState::kFree);
  if (!r.state.compare_exchange_strong(expected, kClaiming, std::memory_order_acq_rel)) {
    return Status::FailedPrecondition(fmt::format(
        "tp group '{}': rank {} is taken (pid {}, state {}); rebuild the group to replace it",
        config.name, rank, r.pid, expected));
  }
  if (h->write_pos.load(std::memory_order_acquire) != 0) {
    r.state.store(static_cast<uint32_t>(RankState::kFree), std::memory_order_release);
    return Status::FailedPrecondition(fmt::format(
        "tp group '{}' has published records already; rebuild the group (a new TpLeader) to "
        "add rank {}",
        config.name, rank));
  }
  r.pid = getpid();
  r.start_time = shm::ProcessStartTime(r.pid);
  r.failed_seq = 0;
  r.error[0] = '\0';
  r.read_pos.store(0, std::memory_order_relaxed);
  r.applied_seq.store(0, std::memory_order_relaxed);
  r.state.store(static_cast<uint32_t>(RankState::kAttached), std::memory_order_release);
  Bump(&h->ack_word);
  impl->data = impl->mapping.data() + h->data_offset;
  impl->shape = h->shape;
  impl->last_record = tp::Clock::now();
  return std::unique_ptr<TpFollower>(new TpFollower(std::move(impl)));
}

TpFollower::~TpFollower() {
  if (impl_ == nullptr || impl_->h == nullptr) return;
  RankRecord& r = impl_->me();
  uint32_t attached = static_cast<uint32_t>(RankState::kAttached);
  r.state.compare_exchange_strong(attached, static_cast<uint32_t>(RankState::kFree),
                                  std::memory_order_acq_rel);
  Bump(&impl_->h->ack_word);
}

const TpShape& TpFollower::shape() const { return impl_->shape; }
int TpFollower::rank() const { return impl_->rank; }
TpFollowerStats TpFollower::stats() const { return impl_->stats; }

Result<TpServeResult> TpFollower::Serve(TransferEngine& engine, const KvRegion& device,
                                        const KvRegion& host, double wait_s,
                                        const MessageHandler& on_message, StorageBackend* storage) {
  Impl& m = *impl_;
  const TpShape& s = m.shape;
  if (device.geometry.num_slots != s.device_slots || device.geometry.num_layers != s.num_layers ||
      device.mla != s.mla ||
      (s.host_slots > 0 && (host.geometry.num_slots != s.host_slots ||
                            host.geometry.num_layers != s.num_layers || host.mla != s.mla))) {
    return Status::InvalidArgument(fmt::format(
        "tp rank {}: regions (device {} slots, host {} slots, {} layers, mla {}) do not match the "
        "leader's shape (device {} slots, host {} slots, {} layers, mla {})",
        m.rank, device.geometry.num_slots, host.geometry.num_slots, device.geometry.num_layers,
        device.mla, s.device_slots, s.host_slots, s.num_layers, s.mla));
  }
  if (StateOf(m.me()) != static_cast<uint32_t>(RankState::kAttached)) {
    return Status::FailedPrecondition(
        fmt::format("tp rank {} is not attached (a copy failed, or it detached)", m.rank));
  }
  const auto deadline = After(wait_s);
  const auto spin_until = std::min(deadline, After(m.config.follower_poll_s));
  bool applied = false;
  for (;;) {
    const uint32_t word = m.h->post_word.load(std::memory_order_acquire);
    const uint64_t wp = m.h->write_pos.load(std::memory_order_acquire);
    uint64_t rp = m.me().read_pos.load(std::memory_order_relaxed);
    while (rp < wp) {
      KVTIER_ASSIGN_OR_RETURN(const int64_t bytes,
                              m.ApplyAt(rp, engine, device, host, on_message, storage));
      rp += static_cast<uint64_t>(bytes);
      m.me().read_pos.store(rp, std::memory_order_release);
      tp::BumpIfSleeping(&m.h->ack_word, &m.h->ack_sleepers);
      applied = true;
    }
    if (applied) {
      m.last_record = tp::Clock::now();
      return TpServeResult::kApplied;
    }
    if (m.h->closed.load(std::memory_order_acquire) != 0) return TpServeResult::kClosed;
    const auto now = tp::Clock::now();
    if (now < spin_until) {
      tp::CpuRelax();
      continue;
    }
    // The leader's pid is checked in /proc (several system calls) once per liveness_poll_s.
    if (now >= m.next_leader_check) {
      m.next_leader_check = After(m.config.liveness_poll_s);
      if (!shm::ProcessAlive(m.h->leader_pid, m.h->leader_start_time)) {
        // A leader that died before every rank attached left the ring's name: the first rank to
        // see it dead removes it (only while the name is still this ring's).
        (void)shm::UnlinkSegmentIfSame(m.mapping);
        return Status::Unavailable(
            fmt::format("tp group '{}': the leader (pid {}) died", m.config.name, m.h->leader_pid));
      }
    }
    const double left = SecondsLeft(deadline);
    if (left <= 0) return TpServeResult::kIdle;
    if (std::chrono::duration<double>(now - m.last_record).count() < m.config.follower_doze_s) {
      // Dozing: not announced as a sleeper, so the leader's next publish costs it no wake call.
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, kTpDozeStepS)));
      continue;
    }
    tp::SleepOn(&m.h->post_word, &m.h->post_sleepers, word,
                std::max(0.0, std::min({left, m.config.liveness_poll_s,
                                        SecondsLeft(m.next_leader_check)})));
  }
}

}  // namespace kvtier
