// tools/replay/replay_tp_step.h — the step of `kvtier replay --tp N` (replay_tp.h): the message
// rank 0 publishes on the decision ring per request after its copies (or a question to the
// followers: their load counters, where they run), and one rank's prefill of it, which checks the
// matched KV of the rank's heads and writes the new tokens' KV under the rank's pattern salt.
//
// Thread safety: plain values and functions; each rank runs its steps from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/status.h"
#include "replay_engine.h"

namespace kvtier::tools {

// The step rank 0 publishes per request after its copies: flags, counts, then the tokens
// (hit + new), the matched slots and the new slots.
struct TpStepMessage {
  // What a follower answers to a message that is not a step (`report`): its load counters
  // since the last kResetLoads (TpTimedEngine), or 0 after resetting them. kLoadMedianBps: the
  // median of its loads' bytes per second; kHostNode, kCpuNode: its host pool's and its thread's
  // NUMA node + 1 (0: unknown); kCeilingBps: its engine's host -> device ceiling.
  enum Report : uint32_t {
    kStep = 0,
    kLoadNs = 1,
    kLoadBytes = 2,
    kLoads = 3,
    kResetLoads = 4,
    kLoadMedianBps = 5,
    kHostNode = 6,
    kCpuNode = 7,
    kCeilingBps = 8,
  };

  uint32_t warm = 0;    // warm-up: write and check, no compute
  uint32_t sample = 0;  // --verify sample
  uint32_t report = 0;  // not a step when set: a Report code, the rank's answer as its result
  int64_t cached_tokens = 0;
  int64_t new_tokens = 0;
  std::vector<int32_t> tokens;
  std::vector<int64_t> hit_slots, new_slots;

  // The message's bytes (the decision ring's record body).
  std::vector<std::byte> Encode() const;
  // Corruption when `in` is not a message Encode made (short, or lengths that do not add up).
  static Result<TpStepMessage> Decode(std::span<const std::byte> in);
};

// MHA: each rank fills and checks the pattern under its own salt, so a rank holding another
// rank's bytes (or TP=1's) is caught. MLA: every rank holds the same latent (one salt): a
// follower reads what the leader, the one writer, stored.
uint64_t TpRankSalt(int rank, bool mla);

// Rank `rank`'s prefill of step `m`; `cache` (rank 0) is waited on per layer. Its total in ms.
// Corruption naming the rank when a matched byte is wrong.
Result<double> RunTpStep(PrefillEngine& engine, const TpStepMessage& m, int rank, bool mla,
                         HierarchicalCache* cache, MatchHandle handle, PrefillTiming* timing);

}  // namespace kvtier::tools
