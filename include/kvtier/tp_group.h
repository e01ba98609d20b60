// kvtier/tp_group.h — one cache decision per tensor-parallel group (docs/tp.md).
//
// In a TP group every rank holds its share of the KV heads (MHA) or a full copy of the latent
// (MLA) in a device pool of its own. One rank, the leader, runs a HierarchicalCache; it alone
// decides hit lengths, prefetch cuts, load-backs, evictions and backups. Every copy its cache
// makes between device and host memory is published, as a compact record with a sequence number,
// on a decision ring in shared memory (one host); every other rank, a follower, applies each
// record in order to its own regions (its device pool, its host pages) through its own transfer
// engine. Ranks cannot disagree: there is one decision, and no collective call on the cache's path.
//
//   leader                                          follower (rank r)
//   TpLeader::Create(config, shape)                 TpFollower::Attach(config, r)
//   cache = HierarchicalCache::Create(cfg, dev,     host pool of shape().host_slots slots
//             leader->WrapEngine(engine, dev))      (its own geometry: its heads)
//   leader->WaitForFollowers()                      while (Serve(engine, dev, host) ...)
//   ... the engine drives `cache` as usual ...
//
// The leader never waits for a follower on a copy: a wrapped Transfer publishes the record and
// runs the leader's own copy. A follower applies records in ring order, each copy complete before
// it reads the next record, so whatever the leader does with a slot after a copy (reuse it, back
// it up, load into it, an engine step published on the ring) reaches every rank after that copy
// too. The leader waits for the followers only where it needs their answer: WaitApplied (the
// engine's step: its result), Fence, a storage decision (which pages every rank holds), a full
// ring. Work that reaches a follower by another channel than the ring (a step broadcast with
// torch.distributed) must come after Fence(); or set ack_each_copy and every Transfer waits for
// every rank as well. A rank that died, failed a copy, or did not answer in time makes the next
// wait fail with an error naming the rank, within the timeout; from then on the group is broken
// and every later Transfer fails at once with the same error (the leader's cache reports them as
// failed copies: LoadBack returns the error, backups are counted failed). The ring is bounded: a
// record that does not fit waits for room up to ack_timeout_s, then fails naming the slowest
// rank.
// Rebuilding: destroy the leader's cache and TpLeader, Create a new one (same name), attach new
// followers, create a new cache over the same device region — the survivors' pools are kept.
// The ring's name (/dev/shm/kvtier.NAME) is only for attaching: the leader removes it as soon as
// every rank has attached (WaitForFollowers, or its first publish), and every rank keeps its
// mapping. From then on no death of any rank or of the leader, SIGKILL included, leaves anything
// in /dev/shm; and a process that names the group later (a new leader, a late follower) finds no
// ring under the name. A leader that dies before every rank attached leaves the name until a
// follower sees it dead (Serve removes it), a new leader of the same name replaces it, or
// `kvtier shm destroy NAME` removes it.
//
// Thread safety: a TpLeader may be used from any thread (the cache's copy threads publish at
// once; records are totally ordered). A TpFollower is driven by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/config_schema.h"
#include "kvtier/status.h"
#include "kvtier/storage.h"
#include "kvtier/transfer.h"

namespace kvtier {

inline constexpr int kMaxTpSize = 64;
// A dozing follower's sleep between two looks at the ring (TpGroupConfig::follower_doze_s).
inline constexpr double kTpDozeStepS = 50e-6;

struct TpGroupConfig {
  // The ring's shared-memory segment (shm name rules: 1-200 of [A-Za-z0-9._-]).
  std::string name;
  int tp_size = 2;                 // ranks in the group, leader included; in [1, kMaxTpSize]
  int64_t ring_bytes = 4 << 20;    // decision ring capacity; in [64 KiB, 1 GiB]
  double ack_timeout_s = 10.0;     // the leader's wait for every rank to apply a record
  double attach_timeout_s = 30.0;  // WaitForFollowers / Attach
  double liveness_poll_s = 0.05;   // how often a waiting side checks the other side is alive
  // How long a follower polls the ring for the next record after its last one (or after Serve
  // begins) before it sleeps on a futex; in [0, 1]. While it polls, its ring thread is busy (one
  // core's worth of CPU for that long after each record); in exchange the leader's publish finds
  // it awake and makes no wake system call, and the follower starts the copy microseconds after
  // the leader (docs/tp.md). The default suits a serving engine whose ranks have cores of their
  // own: a request's records come within a few ms of each other. 0: sleep at once (lowest CPU,
  // every publish to a sleeping follower pays a futex wake). The follower's own config counts.
  double follower_poll_s = 0.005;
  // How long after its last record (or after attaching) a follower, once its poll ran out, keeps
  // checking the ring every kTpDozeStepS instead of sleeping on the futex; in [0, 60]. A dozing
  // follower has not announced itself as a sleeper, so the leader's publish makes no wake system
  // call (~5-10 us of the scheduler thread's CPU on a VM, at the first record of nearly every
  // request: requests come more than follower_poll_s apart); it sees the record up to about
  // kTpDozeStepS plus the timer's slack later, and costs its own core a short wake-up per step.
  // 0: sleep on the futex as soon as the poll ran out. The follower's own config counts.
  double follower_doze_s = 0.25;
  // How long the leader polls for the followers' acknowledgements after its own copy before it
  // sleeps on a futex; in [0, 0.01]. Only while no lagging follower sleeps (they are applying the
  // record). Counted in the leader's decision CPU; ~ the cost of a sleep and wake-up (docs/tp.md).
  double leader_poll_s = 20e-6;
  // Whether each Transfer of the leader's wrapped engine also waits, after its own copy (GPU: its
  // completion), until every follower has applied it. false (the default): the acknowledgements
  // are left to the next wait (see above), so a copy costs the leader's scheduler a publish, not
  // the slowest rank's copy. true: for an engine that sends its steps to the followers by another
  // channel than the ring and cannot call Fence() first.
  bool ack_each_copy = false;

  // InvalidArgument naming the field and its value: the schema's bounds (TpGroupConfigSchema),
  // the name's rules and ring_bytes a multiple of the ring's record alignment.
  Status Validate(const FieldNamer& name_of = nullptr) const;
};

// Every field of TpGroupConfig, its bounds and help, declared once (kvtier/config_schema.h): read
// by Validate, the Python TpGroup's fields and defaults, and `kvtier replay --tp`'s flags.
const ConfigSchema<TpGroupConfig>& TpGroupConfigSchema();

// What every rank's pools must agree on: slot indices mean the same page on every rank.
struct TpShape {
  int64_t device_slots = 0;  // of each rank's device region
  int64_t host_slots = 0;    // of each rank's host region (0: no host tier)
  int64_t num_layers = 0;
  int64_t page_size = 0;
  bool mla = false;
};

enum class TpTier : uint8_t { kDevice = 0, kHost = 1 };
const char* TpTierName(TpTier tier);

// One copy the group decided: layers [src_layer, src_layer + num_layers) of src_slots of the
// `src` tier to the same number of layers from dst_layer of dst_slots of the `dst` tier.
struct TpCopy {
  TpTier src = TpTier::kDevice;
  TpTier dst = TpTier::kHost;
  int64_t src_layer = 0;
  int64_t dst_layer = 0;
  int64_t num_layers = 0;
  std::vector<int64_t> src_slots;
  std::vector<int64_t> dst_slots;
  bool operator==(const TpCopy&) const = default;
};

struct TpLeaderStats {
  int64_t records = 0;          // published
  int64_t record_bytes = 0;     // ring bytes they took
  int64_t slots = 0;            // slots they copy (each rank)
  int64_t waits = 0;            // waits for the followers (WaitApplied, Fence, ack_each_copy,
                                // storage decisions, a full ring); point to point
  int64_t waits_ready = 0;      // of them: every rank had applied the record already
  int64_t waits_slept = 0;      // of them: the leader slept on the futex (its poll ran out)
  double ack_wait_seconds = 0;  // waiting for the followers, after the leader's own copy
  int64_t wakes = 0;            // publishes that made a futex wake call (a follower slept)
  double engine_seconds = 0;    // in WrapEngine's copies: publish, own copy (and its wait) (wall)
};

class TpLeader {
 public:
  // Creates the ring segment `config.name` (a stale one whose leader died, or one this process
  // made before, is replaced; one a live leader holds while ranks may still attach is
  // FailedPrecondition) and announces `shape`. Followers may attach from then on, until every
  // rank has attached: then the name is removed (see the file comment).
  static Result<std::unique_ptr<TpLeader>> Create(const TpGroupConfig& config,
                                                  const TpShape& shape);
  // Marks the ring closed (followers' Serve returns kClosed), removes the segment's name if it is
  // still there and still this ring's.
  ~TpLeader();
  TpLeader(const TpLeader&) = delete;
  TpLeader& operator=(const TpLeader&) = delete;

  // Waits until ranks 1 .. tp_size-1 have attached, then removes the ring's name (nobody attaches
  // any more; the ranks keep their mappings). Unavailable naming the missing ranks after
  // attach_timeout_s (the name stays: they may still come).
  Status WaitForFollowers();

  // Publishes `copy` and returns its sequence number (1, 2, ...). InvalidArgument for a bad copy
  // (unequal lengths, negative slots or layers); Unavailable when the group is broken, a rank has
  // not attached, or the ring had no room after ack_timeout_s (the wait breaks the group).
  Result<uint64_t> Publish(const TpCopy& copy);
  // Publishes an engine message (its step: tokens, slots to compute, ...) in the same order as
  // the copies, so a follower sees it after every copy decided before it. Its sequence number;
  // errors as Publish (InvalidArgument when it takes more than half the ring).
  Result<uint64_t> PublishMessage(std::span<const std::byte> message);
  // Waits until every follower has applied records up to `seq`. Unavailable naming the rank when
  // one died, reported a failed copy, or did not answer within ack_timeout_s; the group is
  // broken from then on.
  Status WaitApplied(uint64_t seq);
  // WaitApplied of the last record published (by any thread): every copy decided so far is done
  // on every rank. OK at once when nothing was published. Call it before anything that reaches
  // a follower by another channel than the ring.
  Status Fence();

  // Publishes a storage decision (op 1: get, 2: set) of `keys` into / out of the host pages
  // starting at `pages` (WrapStorage's records; for tests).
  Result<uint64_t> PublishStorage(int op, std::span<const PageKey> keys,
                                  std::span<const int64_t> pages);

  // The value rank `rank` returned for record `seq` (a message: its handler's value, e.g. the
  // rank's step time; a storage decision: its leading pages that succeeded). Read it after
  // WaitApplied(seq). FailedPrecondition when it is not there (not applied, or the last 256
  // results of that rank no longer include it).
  Result<uint64_t> MessageResult(int rank, uint64_t seq) const;

  // A TransferEngine for the leader's HierarchicalCache: each Transfer between `device_region`
  // (recognised by its buffers) and any other region (the host tier) is published and run on
  // `inner` (with ack_each_copy: then waited for on every rank). Slot lists must be in host
  // memory.
  // The TpLeader must outlive the engine.
  std::unique_ptr<TransferEngine> WrapEngine(std::unique_ptr<TransferEngine> inner,
                                             const KvRegion& device_region);

  // A StorageBackend for the leader's HierarchicalCache (StorageTierConfig::backend) over `own`,
  // the leader's view of the store (its heads: tp/head_split_storage.h). Each Get (a prefetch)
  // and, with `followers_write`, each Set (a store) is published with its page keys and host
  // pages, run on `own`, then waited for on every rank; a page counts as read or written only
  // when every rank's leading pages include it (a rank's miss is the group's miss, never wrong
  // bytes). Exists is the leader's alone (it decides). MLA: followers_write = false — the
  // leader is the one writer, every rank reads. REQUIRES SetHostRegion before the first call
  // (until then every Get/Set fails its pages). Null when its I/O threads cannot be started.
  std::shared_ptr<StorageBackend> WrapStorage(std::shared_ptr<StorageBackend> own,
                                              bool followers_write);
  // The leader cache's host region (host_region() once the cache exists): storage decisions
  // name its pages by slot.
  void SetHostRegion(const KvRegion& host);

  // OK while the group works; the error that broke it otherwise.
  Status health() const;
  const TpGroupConfig& config() const;
  const TpShape& shape() const;
  TpLeaderStats stats() const;

 private:
  struct Impl;
  explicit TpLeader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

enum class TpServeResult : uint8_t {
  kIdle = 0,     // nothing arrived within the wait
  kApplied = 1,  // applied one or more records
  kClosed = 2,   // the leader closed the ring; nothing more will come
};

struct TpFollowerStats {
  int64_t records = 0;  // applied
  int64_t slots = 0;    // slots copied
  uint64_t applied_seq = 0;
};

class TpFollower {
 public:
  // Opens ring `config.name` (waiting up to attach_timeout_s for the leader to create it) and
  // claims rank `rank` (in [1, tp_size)). FailedPrecondition when a live process holds the rank
  // or config.tp_size differs from the leader's; Unavailable on timeout (also for a group that
  // has formed: its name is gone once every rank attached).
  static Result<std::unique_ptr<TpFollower>> Attach(const TpGroupConfig& config, int rank);
  ~TpFollower();  // releases the rank
  TpFollower(const TpFollower&) = delete;
  TpFollower& operator=(const TpFollower&) = delete;

  const TpShape& shape() const;
  int rank() const;

  // Applies, in order, every record published so far, waiting up to `wait_s` for the first one
  // when there is none: each copy runs on `engine` between `device` and `host` (this rank's
  // regions; their slot counts must be shape()'s); each message goes to `on_message` (ignored
  // when it is empty), whose value the leader reads with MessageResult. A record is acknowledged
  // once applied. A copy or message that fails is
  // reported to the leader (its WaitApplied fails naming this rank and the error) and returned
  // here; the rank takes no more records. Unavailable when the leader died (the ring's name, if
  // the leader died before every rank attached, is removed then).
  // Storage decisions run on `storage` (this rank's view of the store: its heads) into / out of
  // `host`'s pages; their leading pages that succeeded go back to the leader. A storage decision
  // without `storage` fails the rank.
  using MessageHandler = std::function<Result<uint64_t>(std::span<const std::byte>)>;
  Result<TpServeResult> Serve(TransferEngine& engine, const KvRegion& device, const KvRegion& host,
                              double wait_s, const MessageHandler& on_message = {},
                              StorageBackend* storage = nullptr);
  TpFollowerStats stats() const;

 private:
  struct Impl;
  explicit TpFollower(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Rank `rank_pages.tp_rank`'s view of a store shared across TP sizes (docs/tp.md): the store at
// `url` holds one object per KV head (its namespace names the head split, not the TP size), and
// the view reads and writes this rank's heads of each page. `rank_pages` describes the rank's
// host pages: layout page_head, head_num its heads (MLA: the latent, one "head"), tp_rank and
// tp_size. MHA: heads [tp_rank * head_num, (tp_rank + 1) * head_num); MLA: every rank reads the
// latent and only rank 0 writes (other ranks' Sets write nothing). For the leader's
// WrapStorage and a follower's Serve. InvalidArgument naming the field for a bad namespace;
// the URL's errors as OpenStorage.
Result<std::shared_ptr<StorageBackend>> OpenTpRankStorage(const std::string& url,
                                                          const StorageNamespace& rank_pages,
                                                          const StorageOptions& options = {});

// The geometry of rank `rank`'s share of a region of `full` geometry in a TP group of `tp_size`:
// MHA: slot_bytes / tp_size (heads split evenly; head_num / tp_size); MLA: the full latent.
// InvalidArgument when the heads do not split evenly.
Result<KvGeometry> TpShardGeometry(const KvGeometry& full, bool mla, int tp_size);

}  // namespace kvtier
