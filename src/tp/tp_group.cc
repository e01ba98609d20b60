// One cache decision per TP group: the group's configuration and the leader — its ring writer and
// the engine and store wrappers its cache decides through (see kvtier/tp_group.h,
// tp/decision_ring.h, docs/tp.md). The followers' ring reader is tp_follower.cc.
#include "kvtier/tp_group.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "pool/shm_process.h"
#include "pool/shm_segment.h"
#include "tp/decision_ring.h"
#include "tp/group_common.h"

namespace kvtier {

using tp::RankRecord;
using tp::RankState;
using tp::RecordHeader;
using tp::RecordType;
using tp::RingHeader;

namespace {

using tp::After;
using tp::Bump;
using tp::Clock;
using tp::kClaiming;
using tp::SecondsLeft;
using tp::StateOf;
using tp::StorageOp;

Status CheckShape(const TpShape& s) {
  if (s.page_size <= 0 || s.num_layers <= 0 || s.device_slots <= 0 || s.host_slots < 0 ||
      s.device_slots % s.page_size != 0 || s.host_slots % s.page_size != 0) {
    return Status::InvalidArgument(fmt::format(
        "tp shape: device_slots {}, host_slots {}, num_layers {}, page_size {}: need positive "
        "layers and page size, and slot counts that are whole pages",
        s.device_slots, s.host_slots, s.num_layers, s.page_size));
  }
  return Status::OK();
}

}  // namespace

const char* TpTierName(TpTier tier) { return tier == TpTier::kDevice ? "device" : "host"; }

namespace {

ConfigSchema<TpGroupConfig> BuildTpGroupConfigSchema() {
  using C = TpGroupConfig;
  ConfigSchema<C> s;
  s.push_back(StringField<C>("name", Member(&C::name),
                             "the decision ring's shared-memory segment (1-200 of "
                             "[A-Za-z0-9._-]); every rank names the same"));
  s.push_back(IntField<C>("tp_size", Member(&C::tp_size), 1, kMaxTpSize,
                          "ranks in the group, leader included"));
  s.push_back(IntField<C>("ring_bytes", Member(&C::ring_bytes), 64 << 10, int64_t{1} << 30,
                          "decision ring capacity in bytes"));
  s.push_back(FloatField<C>("ack_timeout_s", Member(&C::ack_timeout_s), 0, 3600, true,
                            "seconds the leader waits for every rank to apply a record"));
  s.push_back(FloatField<C>("attach_timeout_s", Member(&C::attach_timeout_s), 0, 3600, true,
                            "seconds the leader waits for the followers to attach (and a "
                            "follower for the leader's ring)"));
  s.push_back(FloatField<C>("liveness_poll_s", Member(&C::liveness_poll_s), 0, 3600, true,
                            "seconds between a waiting side's checks that the other is alive"));
  s.push_back(FloatField<C>("follower_poll_s", Member(&C::follower_poll_s), 0, 1, false,
                            "seconds a follower polls the ring after a record before it sleeps "
                            "(0: sleep at once)"));
  s.push_back(FloatField<C>("follower_doze_s", Member(&C::follower_doze_s), 0, 60, false,
                            "seconds after its last record a follower, its poll over, looks at "
                            "the ring every 50 us instead of sleeping (0: sleep)"));
  s.push_back(FloatField<C>("leader_poll_s", Member(&C::leader_poll_s), 0, 0.01, false,
                            "seconds the leader polls for the followers' acknowledgements "
                            "before it sleeps"));
  s.push_back(BoolField<C>("ack_each_copy", Member(&C::ack_each_copy),
                           "the leader waits for every rank after each of its copies (false: "
                           "the next wait covers them)"));
  return s;
}

}  // namespace

const ConfigSchema<TpGroupConfig>& TpGroupConfigSchema() {
  static const ConfigSchema<TpGroupConfig> schema = BuildTpGroupConfigSchema();
  return schema;
}

Status TpGroupConfig::Validate(const FieldNamer& name_of) const {
  KVTIER_RETURN_IF_ERROR(shm::ValidateSegmentName(name));
  KVTIER_RETURN_IF_ERROR(CheckFields(TpGroupConfigSchema(), *this, name_of));
  if (ring_bytes % tp::kRecordAlignment != 0) {
    return Status::InvalidArgument(fmt::format("{} = {} is not a multiple of {}",
                                               name_of ? name_of("ring_bytes") : "ring_bytes",
                                               ring_bytes, tp::kRecordAlignment));
  }
  return Status::OK();
}

// ---- leader ------------------------------------------------------------------------------------

struct TpLeader::Impl {
  TpGroupConfig config;
  TpShape shape;
  shm::SharedMapping mapping;
  RingHeader* h = nullptr;
  std::byte* data = nullptr;

  mutable std::mutex mu;  // publication order, stats, `broken`, `host`
  KvRegion host;          // the leader cache's host region (SetHostRegion)
  bool has_host = false;
  uint64_t next_seq = 1;
  Status broken;
  TpLeaderStats stats;                // engine_seconds aside: engine_ns
  std::atomic<int64_t> engine_ns{0};  // the wrapped engine's copies' wall time (WrapEngine)
  // Whether the ring's name was removed (RemoveName): once every rank attached, nobody needs it.
  std::atomic<bool> name_removed{false};

  // Removes the ring's name from /dev/shm, once, while it is still this ring's (a successor of
  // the same name is left alone). Every attached rank keeps its mapping, so the group goes on;
  // a later death of any process leaves nothing behind.
  void RemoveName() {
    if (!name_removed.exchange(true, std::memory_order_acq_rel)) {
      (void)shm::UnlinkSegmentIfSame(mapping);
    }
  }

  // Sets `broken` (the first failure wins) and returns it.
  Status Break(Status st) {
    std::lock_guard lk(mu);
    if (broken.ok()) broken = std::move(st);
    return broken;
  }
  Status Broken() const {
    std::lock_guard lk(mu);
    return broken;
  }
  // Writes a record of `bytes` (a multiple of kRecordAlignment) at the ring's write position —
  // `write(seq, at)` writes it in place, with the sequence number given, under `mu` — and wakes the
  // followers. Checks each rank's state (shared memory, no system call); whether a rank is alive
  // is WaitApplied's to find out (every liveness_poll_s).
  template <typename Write>
  Result<uint64_t> PublishRecord(int64_t bytes, const Write& write);
  // WaitApplied, polling for up to `spin_s` before the first sleep.
  Status Wait(uint64_t seq, double spin_s);
  // Publishes a copy given as runs of slots (validated here).
  Result<uint64_t> PublishRuns(const tp::CopyFields& f, std::span<const tp::SlotRun> src,
                               std::span<const tp::SlotRun> dst);
  // An error when rank `r` cannot take records: failed, detached, not attached or dead
  // (`alive`: also read /proc for its pid, several system calls).
  Status RankProblem(int r, uint64_t seq, bool alive = true) const {
    const RankRecord& rr = h->ranks[r];
    const uint32_t st = StateOf(rr);
    if (st == static_cast<uint32_t>(RankState::kFailed)) {
      return Status::Unavailable(fmt::format("tp group '{}': rank {} (pid {}) failed record {}: {}",
                                             config.name, r, rr.pid, rr.failed_seq, rr.error));
    }
    if (st != static_cast<uint32_t>(RankState::kAttached)) {
      return Status::Unavailable(
          fmt::format("tp group '{}': rank {} is not attached (detached, or never attached: call "
                      "WaitForFollowers first)",
                      config.name, r));
    }
    if (alive && !shm::ProcessAlive(rr.pid, rr.start_time)) {
      return Status::Unavailable(
          fmt::format("tp group '{}': rank {} (pid {}) died; it applied records up to {} of {}",
                      config.name, r, rr.pid, rr.applied_seq.load(std::memory_order_acquire), seq));
    }
    return Status::OK();
  }
};

TpLeader::TpLeader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<TpLeader>> TpLeader::Create(const TpGroupConfig& config,
                                                   const TpShape& shape) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  KVTIER_RETURN_IF_ERROR(CheckShape(shape));
  const shm::CreateSegmentOptions opts{.bytes = tp::SegmentBytes(config.ring_bytes)};
  Result<shm::SharedMapping> seg = shm::CreateSegment(config.name, opts);
  if (!seg.ok() && seg.status().code() == StatusCode::kFailedPrecondition) {
    // A segment of that name exists: replace it unless a live leader (another process) holds it.
    Result<shm::SharedMapping> old = shm::OpenSegment(config.name);
    if (old.ok() && old->bytes() >= static_cast<int64_t>(sizeof(RingHeader))) {
      const auto* oh = reinterpret_cast<const RingHeader*>(old->data());
      if (oh->magic.load(std::memory_order_acquire) == tp::kRingMagic &&
          oh->closed.load(std::memory_order_acquire) == 0 && oh->leader_pid != getpid() &&
          shm::ProcessAlive(oh->leader_pid, oh->leader_start_time)) {
        return Status::FailedPrecondition(fmt::format(
            "tp group '{}' is held by a live leader (pid {})", config.name, oh->leader_pid));
      }
    }
    (void)shm::UnlinkSegment(config.name);
    seg = shm::CreateSegment(config.name, opts);
  }
  if (!seg.ok()) return seg.status().WithContext(fmt::format("tp group '{}'", config.name));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->shape = shape;
  impl->mapping = std::move(*seg);
  // The segment is zero-filled: every atomic starts at 0 (kFree ranks, empty ring).
  auto* h = reinterpret_cast<RingHeader*>(impl->mapping.data());
  h->version = tp::kRingVersion;
  h->tp_size = config.tp_size;
  h->ring_bytes = config.ring_bytes;
  h->data_offset = tp::DataOffset();
  h->leader_pid = getpid();
  h->leader_start_time = shm::ProcessStartTime(getpid());
  h->shape = shape;
  h->magic.store(tp::kRingMagic, std::memory_order_release);
  impl->h = h;
  impl->data = impl->mapping.data() + h->data_offset;
  return std::unique_ptr<TpLeader>(new TpLeader(std::move(impl)));
}

TpLeader::~TpLeader() {
  if (impl_ == nullptr || impl_->h == nullptr) return;
  impl_->h->closed.store(1, std::memory_order_release);
  Bump(&impl_->h->post_word);
  impl_->RemoveName();  // unless every rank attached and it is gone already
}

Status TpLeader::WaitForFollowers() {
  Impl& m = *impl_;
  const auto deadline = After(m.config.attach_timeout_s);
  for (;;) {
    const uint32_t word = m.h->ack_word.load(std::memory_order_acquire);
    std::string missing;
    for (int r = 1; r < m.config.tp_size; ++r) {
      if (StateOf(m.h->ranks[r]) != static_cast<uint32_t>(RankState::kAttached)) {
        missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      }
    }
    if (missing.empty()) {
      m.RemoveName();  // nobody attaches any more: a later SIGKILL leaves nothing in /dev/shm
      return Status::OK();
    }
    const double left = SecondsLeft(deadline);
    if (left <= 0) {
      return Status::Unavailable(fmt::format("tp group '{}': rank(s) {} did not attach within {} s",
                                             m.config.name, missing, m.config.attach_timeout_s));
    }
    tp::FutexWait(&m.h->ack_word, word, std::min(left, m.config.liveness_poll_s));
  }
}

Result<uint64_t> TpLeader::Publish(const TpCopy& copy) {
  KVTIER_RETURN_IF_ERROR(tp::ValidateCopy(copy));
  return impl_->PublishRuns({copy.src, copy.dst, copy.src_layer, copy.dst_layer, copy.num_layers,
                             static_cast<int64_t>(copy.src_slots.size())},
                            tp::SlotRuns(copy.src_slots), tp::SlotRuns(copy.dst_slots));
}

Result<uint64_t> TpLeader::Impl::PublishRuns(const tp::CopyFields& f,
                                             std::span<const tp::SlotRun> src,
                                             std::span<const tp::SlotRun> dst) {
  KVTIER_RETURN_IF_ERROR(tp::ValidateCopyRuns(f, src, dst));
  const int64_t need =
      tp::CopyRecordBytes(static_cast<int64_t>(src.size()), static_cast<int64_t>(dst.size()));
  if (need > config.ring_bytes / 2) {
    return Status::InvalidArgument(fmt::format(
        "tp group '{}': a copy of {} slots takes {} ring bytes, more than half the ring "
        "(ring_bytes = {})",
        config.name, f.num_slots, need, config.ring_bytes));
  }
  // The write runs under `mu`: the slot count is added there, not under a lock of its own.
  return PublishRecord(need, [&](uint64_t s, std::byte* at) {
    tp::WriteCopyRecord(f, src, dst, s, at);
    stats.slots += f.num_slots;
  });
}

Result<uint64_t> TpLeader::PublishMessage(std::span<const std::byte> message) {
  if (static_cast<int64_t>(message.size()) > impl_->config.ring_bytes / 2 - 64) {
    return Status::InvalidArgument(
        fmt::format("tp group '{}': a message of {} bytes takes more than half the ring "
                    "(ring_bytes = {})",
                    impl_->config.name, message.size(), impl_->config.ring_bytes));
  }
  const std::span<const std::byte> parts[1] = {message};
  return impl_->PublishRecord(tp::MessageRecordBytes(static_cast<int64_t>(message.size())),
                              [&](uint64_t seq, std::byte* at) {
                                tp::WriteMessageRecord(parts, RecordType::kMessage, seq, at);
                              });
}

template <typename Write>
Result<uint64_t> TpLeader::Impl::PublishRecord(int64_t need, const Write& write) {
  const int64_t ring = config.ring_bytes;
  for (;;) {
    std::unique_lock lk(mu);
    if (!broken.ok()) return broken;
    const uint64_t seq = next_seq;
    for (int r = 1; r < config.tp_size; ++r) {
      Status st = RankProblem(r, seq, /*alive=*/false);
      if (!st.ok()) {
        if (broken.ok()) broken = st;
        return st;
      }
    }
    // Every rank attached, and none can attach once a record exists: the name has done its job
    // (a leader that never called WaitForFollowers removes it here).
    if (!name_removed.load(std::memory_order_relaxed)) RemoveName();
    const uint64_t pos = h->write_pos.load(std::memory_order_relaxed);
    const int64_t off = static_cast<int64_t>(pos % static_cast<uint64_t>(ring));
    const int64_t pad = need > ring - off ? ring - off : 0;
    uint64_t min_read = pos;
    int slowest = 0;
    for (int r = 1; r < config.tp_size; ++r) {
      const uint64_t rp = h->ranks[r].read_pos.load(std::memory_order_acquire);
      if (rp < min_read) {
        min_read = rp;
        slowest = r;
      }
    }
    if (static_cast<int64_t>(pos - min_read) + pad + need > ring) {
      // Full: wait (unlocked: other threads' waits and the followers' progress go on) until every
      // rank has applied every record published so far — then the ring is empty — and try again.
      // Within ack_timeout_s, or the group is broken naming the slowest rank.
      const RankRecord& rr = h->ranks[slowest];
      const std::string full = fmt::format(
          "tp group '{}': the decision ring ({} bytes) is full: rank {} (pid {}) had applied "
          "records up to {} of {}",
          config.name, ring, slowest, rr.pid, rr.applied_seq.load(std::memory_order_acquire),
          seq - 1);
      lk.unlock();
      Status st = Wait(seq - 1, config.leader_poll_s);
      if (!st.ok()) return Status::Unavailable(fmt::format("{}; {}", full, st.message()));
      continue;
    }
    if (pad > 0) {
      const RecordHeader ph{static_cast<uint32_t>(pad), static_cast<uint32_t>(RecordType::kPad), 0};
      std::memcpy(data + off, &ph, sizeof(ph));
    }
    write(seq, data + (off + pad) % ring);
    h->write_pos.store(pos + static_cast<uint64_t>(pad + need), std::memory_order_release);
    next_seq = seq + 1;
    ++stats.records;
    stats.record_bytes += need;
    lk.unlock();
    if (tp::BumpIfSleeping(&h->post_word, &h->post_sleepers)) {
      std::lock_guard relock(mu);
      ++stats.wakes;
    }
    return seq;
  }
}

Status TpLeader::WaitApplied(uint64_t seq) { return impl_->Wait(seq, impl_->config.leader_poll_s); }

Status TpLeader::Fence() {
  uint64_t last = 0;
  {
    std::lock_guard lk(impl_->mu);
    if (!impl_->broken.ok()) return impl_->broken;
    last = impl_->next_seq - 1;
  }
  return last == 0 ? Status::OK() : impl_->Wait(last, impl_->config.leader_poll_s);
}

Status TpLeader::Impl::Wait(uint64_t seq, double spin_s) {
  Impl& m = *this;
  const auto start = Clock::now();
  const auto deadline = After(m.config.ack_timeout_s);
  // A lagging rank's pid is checked (/proc: several system calls) once a liveness_poll_s has
  // passed without its acknowledgement, and again every liveness_poll_s, and before a timeout is
  // reported — not on every wake: a record the ranks apply promptly costs no system call here
  // beyond the futex wait.
  auto next_liveness = start + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(m.config.liveness_poll_s));
  const auto spin_until =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spin_s));
  Status result;
  bool first = true, slept = false, ready_at_once = false;
  for (;;) {
    Status broken = m.Broken();
    if (!broken.ok()) {
      result = broken;
      break;
    }
    const uint32_t word = m.h->ack_word.load(std::memory_order_acquire);
    const auto now = Clock::now();
    const bool check_alive = now >= next_liveness || now >= deadline;
    if (check_alive) {
      next_liveness = now + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(m.config.liveness_poll_s));
    }
    int lagging = 0;
    for (int r = 1; r < m.config.tp_size && result.ok(); ++r) {
      const RankRecord& rr = m.h->ranks[r];
      if (StateOf(rr) == static_cast<uint32_t>(RankState::kAttached) &&
          rr.applied_seq.load(std::memory_order_acquire) >= seq) {
        continue;
      }
      result = m.RankProblem(r, seq, check_alive);
      if (result.ok() && lagging == 0) lagging = r;
    }
    if (!result.ok()) {
      result = m.Break(std::move(result));
      break;
    }
    if (lagging == 0) {
      ready_at_once = first;
      break;
    }
    first = false;
    const double left = SecondsLeft(deadline);
    // Poll for a short while before sleeping (spin, then block: the poll is bounded by about
    // what a sleep and wake-up cost the thread, so a wait costs at most about twice the cheaper
    // of the two): an acknowledgement due right after the leader's own copy then costs no
    // sleep and wake-up.
    if (now < spin_until && now < deadline) {
      tp::CpuRelax();
      continue;
    }
    if (left <= 0 && check_alive) {
      const RankRecord& rr = m.h->ranks[lagging];
      result = m.Break(Status::Unavailable(fmt::format(
          "tp group '{}': rank {} (pid {}) did not apply record {} within {} s (applied up to {})",
          m.config.name, lagging, rr.pid, seq, m.config.ack_timeout_s,
          rr.applied_seq.load(std::memory_order_acquire))));
      break;
    }
    slept = true;
    tp::SleepOn(
        &m.h->ack_word, &m.h->ack_sleepers, word,
        std::max(0.0, std::min({left, m.config.liveness_poll_s, SecondsLeft(next_liveness)})));
  }
  std::lock_guard lk(m.mu);
  ++m.stats.waits;
  m.stats.waits_ready += ready_at_once ? 1 : 0;
  m.stats.waits_slept += slept ? 1 : 0;
  m.stats.ack_wait_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

Result<uint64_t> TpLeader::MessageResult(int rank, uint64_t seq) const {
  if (rank < 1 || rank >= impl_->config.tp_size) {
    return Status::InvalidArgument(fmt::format("tp: no follower rank {}", rank));
  }
  const auto& slot = impl_->h->ranks[rank].results[seq % tp::kResultSlots];
  const uint64_t before = slot.seq.load(std::memory_order_acquire);
  const uint64_t value = slot.value.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (before != seq || slot.seq.load(std::memory_order_relaxed) != seq) {
    return Status::FailedPrecondition(fmt::format(
        "tp: rank {}'s result of record {} is not there (not applied yet, or {} later records "
        "took its place)",
        rank, seq, tp::kResultSlots));
  }
  return value;
}

Status TpLeader::health() const { return impl_->Broken(); }
const TpGroupConfig& TpLeader::config() const { return impl_->config; }
const TpShape& TpLeader::shape() const { return impl_->shape; }
TpLeaderStats TpLeader::stats() const {
  std::lock_guard lk(impl_->mu);
  TpLeaderStats s = impl_->stats;
  s.engine_seconds = static_cast<double>(impl_->engine_ns.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

namespace {

// The leader cache's engine: publish, copy here (with ack_each_copy: then wait for every rank).
class TpLeaderEngine final : public TransferEngine {
 public:
  // `publish`: the leader's TpLeader::Impl::PublishRuns.
  using PublishFn = std::function<Result<uint64_t>(
      const tp::CopyFields&, std::span<const tp::SlotRun>, std::span<const tp::SlotRun>)>;
  // `wait`: the leader's WaitApplied.
  using WaitFn = std::function<Status(uint64_t seq)>;
  // `spent`: adds a copy's wall time to the leader's stats (engine_seconds).
  using SpentFn = std::function<void(double seconds)>;
  TpLeaderEngine(std::unique_ptr<TransferEngine> inner, PublishFn publish, WaitFn wait,
                 SpentFn spent, const KvRegion& device, bool ack_each_copy)
      : inner_(std::move(inner)),
        publish_(std::move(publish)),
        wait_(std::move(wait)),
        spent_(std::move(spent)),
        device_(device),
        ack_each_copy_(ack_each_copy) {}
  TransferBackend backend() const override { return inner_->backend(); }
  Status Synchronize(CudaStream stream) override { return inner_->Synchronize(stream); }

 protected:
  Status DoTransfer(const TransferRequest& request, const TransferOptions& options) override {
    if (request.src_slots.memory != MemoryKind::kHost ||
        request.dst_slots.memory != MemoryKind::kHost) {
      return Status::InvalidArgument("tp leader engine: slot lists must be in host memory");
    }
    const tp::CopyFields f{TierOf(*request.src), TierOf(*request.dst), request.src_layer,
                           request.dst_layer,    request.num_layers,   request.src_slots.count};
    if (f.src == f.dst) {
      return Status::InvalidArgument(
          fmt::format("tp leader engine: a copy within the {} tier is not a cache decision",
                      TpTierName(f.src)));
    }
    // Transfer validated the request: the leader's own copy does not validate it again.
    if (f.num_slots == 0) return TransferValidated(*inner_, request, options);
    const auto t0 = tp::Clock::now();
    // The slot lists as runs, straight from the request into the ring (no copy of the lists;
    // this thread's run buffers are reused).
    thread_local std::vector<tp::SlotRun> src_runs, dst_runs;
    RunsOf(request.src_slots, &src_runs);
    RunsOf(request.dst_slots, &dst_runs);
    KVTIER_ASSIGN_OR_RETURN(const uint64_t seq, publish_(f, src_runs, dst_runs));
    Status own = TransferValidated(*inner_, request, options);
    Status acks;
    if (ack_each_copy_) {
      // The leader's own copy must be done too before the cache treats the slots as written on
      // every rank.
      if (own.ok() && inner_->backend() != TransferBackend::kCpu) {
        own = inner_->Synchronize(options.stream);
      }
      // The ranks started the same copy within microseconds of this one (a follower polls the
      // ring for follower_poll_s after each record), so their acknowledgements are due about
      // now: poll up to leader_poll_s, then sleep (Wait).
      acks = wait_(seq);
    }
    // Otherwise no wait: a follower applies this copy before any record published after it
    // (tp_group.h); its acknowledgement is the next wait's.
    spent_(std::chrono::duration<double>(tp::Clock::now() - t0).count());
    return own.ok() ? acks : own;
  }

 private:
  // The list's runs, its index type dispatched once (not per slot, as SlotIndices::at does).
  static void RunsOf(const SlotIndices& slots, std::vector<tp::SlotRun>* runs) {
    if (slots.type == IndexType::kInt64) {
      const auto* p = static_cast<const int64_t*>(slots.data);
      tp::SlotRunsOf(
          slots.count, [p](int64_t i) { return p[i]; }, runs);
    } else {
      const auto* p = static_cast<const int32_t*>(slots.data);
      tp::SlotRunsOf(
          slots.count, [p](int64_t i) { return static_cast<int64_t>(p[i]); }, runs);
    }
  }
  TpTier TierOf(const KvRegion& r) const {
    const bool same = r.has_layer_table() ? r.k_layers.data() == device_.k_layers.data()
                                          : (r.k == device_.k && r.v == device_.v);
    return same ? TpTier::kDevice : TpTier::kHost;
  }
  std::unique_ptr<TransferEngine> inner_;
  PublishFn publish_;
  WaitFn wait_;
  SpentFn spent_;
  KvRegion device_;
  bool ack_each_copy_;
};

}  // namespace

namespace {

// The leader cache's store: publish, run on the leader's view, wait for every rank, and keep a
// page only where every rank's leading pages include it.
class TpLeaderStorage final : public StorageBackend {
 public:
  TpLeaderStorage(std::shared_ptr<StorageBackend> own, TpLeader* leader,
                  std::function<Result<KvRegion>()> host, bool followers_write)
      : StorageBackend("tp-leader+" + own->url(), own->ns(), own->options()),
        own_(std::move(own)),
        leader_(leader),
        host_(std::move(host)),
        followers_write_(followers_write) {}
  ~TpLeaderStorage() override { Close(); }
  Status Begin() { return Start(); }

  // The group's one decision: the leader's own store's evictions (its heads of each page). A
  // follower's store evicting its heads of a page is learnt from the group's next miss of it
  // (a page is a hit only when every rank's is), as for a store whose eviction is out of sight.
  void TrackEvictions(bool on) override { own_->TrackEvictions(on); }
  std::vector<PageKey> TakeEvictions(int64_t* dropped = nullptr) override {
    return own_->TakeEvictions(dropped);
  }

 protected:
  ExistsResult DoExists(std::span<const PageKey> keys,
                        std::chrono::steady_clock::time_point) override {
    return own_->Exists(std::vector<PageKey>(keys.begin(), keys.end())).get();
  }
  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, std::chrono::steady_clock::time_point) override {
    Run(StorageOp::kGet, keys, buffers, out);
  }
  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, std::chrono::steady_clock::time_point) override {
    if (!followers_write_) {
      const BatchResult r = own_->Set(std::vector<PageKey>(keys.begin(), keys.end()),
                                      std::vector<PageBuffer>(buffers.begin(), buffers.end()))
                                .get();
      for (size_t i = 0; i < out.size() && i < r.pages.size(); ++i) out[i] = r.pages[i];
      return;
    }
    Run(StorageOp::kSet, keys, buffers, out);
  }
  void DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                std::chrono::steady_clock::time_point) override {
    // The leader's objects only: followers' objects of a removed page are never read again
    // (a page is a hit only when every rank's is).
    const BatchResult r = own_->Remove(std::vector<PageKey>(keys.begin(), keys.end())).get();
    for (size_t i = 0; i < out.size() && i < r.pages.size(); ++i) out[i] = r.pages[i];
  }

 private:
  void Run(StorageOp op, std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
           std::span<PageStatus> out) {
    Result<KvRegion> host = host_();
    if (!host.ok()) return Fill(out, PageStatus::kFailed);
    std::vector<int64_t> pages;
    const KvGeometry& g = host->geometry;
    for (const PageBuffer& b : buffers) {
      const int64_t off = b.segments[0].data() - host->LayerBase(0, 0);
      pages.push_back(off / (g.num_layers * g.slot_bytes));  // page_head/page_first: slot * L * S
    }
    Result<uint64_t> seq = leader_->PublishStorage(static_cast<int>(op), keys, pages);
    if (!seq.ok()) return Fill(out, PageStatus::kFailed);
    std::vector<PageKey> k(keys.begin(), keys.end());
    std::vector<PageBuffer> bufs(buffers.begin(), buffers.end());
    const BatchResult own = op == StorageOp::kGet ? own_->Get(std::move(k), std::move(bufs)).get()
                                                  : own_->Set(std::move(k), std::move(bufs)).get();
    if (!leader_->WaitApplied(*seq).ok()) return Fill(out, PageStatus::kFailed);
    uint64_t leading = static_cast<uint64_t>(own.status.ok() ? own.leading_ok() : 0);
    for (int r = 1; r < leader_->config().tp_size; ++r) {
      Result<uint64_t> theirs = leader_->MessageResult(r, *seq);
      leading = std::min<uint64_t>(leading, theirs.ok() ? *theirs : 0);
    }
    for (size_t i = 0; i < out.size(); ++i) {
      const PageStatus mine =
          own.status.ok() && i < own.pages.size() ? own.pages[i] : PageStatus::kFailed;
      out[i] = i < leading ? PageStatus::kOk
               : mine == PageStatus::kOk
                   ? (op == StorageOp::kGet ? PageStatus::kAbsent : PageStatus::kFailed)
                   : mine;
    }
  }
  static void Fill(std::span<PageStatus> out, PageStatus s) {
    for (PageStatus& p : out) p = s;
  }
  std::shared_ptr<StorageBackend> own_;
  TpLeader* leader_;
  std::function<Result<KvRegion>()> host_;
  bool followers_write_;
};

}  // namespace

Result<uint64_t> TpLeader::PublishStorage(int op, std::span<const PageKey> keys,
                                          std::span<const int64_t> pages) {
  if (keys.size() != pages.size()) {
    return Status::InvalidArgument(
        fmt::format("tp group: a storage decision of {} page keys and {} host pages", keys.size(),
                    pages.size()));
  }
  const uint32_t head[2] = {static_cast<uint32_t>(op), 0};
  const uint64_t n = keys.size();
  const std::span<const std::byte> parts[4] = {std::as_bytes(std::span(head)),
                                               std::as_bytes(std::span(&n, 1)), std::as_bytes(keys),
                                               std::as_bytes(pages)};
  static_assert(sizeof(PageKey) == sizeof(PageKey{}.bytes));
  const int64_t payload = static_cast<int64_t>(16 + n * (sizeof(PageKey) + 8));
  if (payload > impl_->config.ring_bytes / 2 - 64) {
    return Status::InvalidArgument("tp group: a storage decision takes more than half the ring");
  }
  return impl_->PublishRecord(tp::MessageRecordBytes(payload), [&](uint64_t seq, std::byte* at) {
    tp::WriteMessageRecord(parts, RecordType::kStorage, seq, at);
  });
}

void TpLeader::SetHostRegion(const KvRegion& host) {
  std::lock_guard lk(impl_->mu);
  impl_->host = host;
  impl_->has_host = true;
}

std::shared_ptr<StorageBackend> TpLeader::WrapStorage(std::shared_ptr<StorageBackend> own,
                                                      bool followers_write) {
  Impl* m = impl_.get();
  auto host = [m]() -> Result<KvRegion> {
    std::lock_guard lk(m->mu);
    if (!m->has_host) {
      return Status::FailedPrecondition("tp leader storage: SetHostRegion was not called");
    }
    return m->host;
  };
  auto s = std::make_shared<TpLeaderStorage>(std::move(own), this, host, followers_write);
  if (!s->Begin().ok()) return nullptr;
  return s;
}

std::unique_ptr<TransferEngine> TpLeader::WrapEngine(std::unique_ptr<TransferEngine> inner,
                                                     const KvRegion& device_region) {
  Impl* m = impl_.get();
  auto publish = [m](const tp::CopyFields& f, std::span<const tp::SlotRun> src,
                     std::span<const tp::SlotRun> dst) { return m->PublishRuns(f, src, dst); };
  auto wait = [m](uint64_t seq) { return m->Wait(seq, m->config.leader_poll_s); };
  auto spent = [m](double seconds) {  // relaxed: a total read by stats(), no lock per copy
    m->engine_ns.fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
  };
  return std::make_unique<TpLeaderEngine>(std::move(inner), std::move(publish), std::move(wait),
                                          std::move(spent), device_region, m->config.ack_each_copy);
}

}  // namespace kvtier
