// tools/replay/replay_tp.h — `kvtier replay --tp N`: the replay as a tensor-parallel group, one
// process per rank (per GPU, or per cpu "device"), one cache decision per group
// (kvtier/tp_group.h).
//
// Rank 0 (the process the user starts) runs the cache and starts ranks 1 .. N-1 as copies of
// itself (`--tp-rank R --tp-group NAME`, hidden flags). Each rank has a device pool of its share
// of the KV heads (MLA: the full latent), host pages of the leader's shape and its own transfer
// engine; the leader's cache decides and every rank applies its copies (the decision ring). Each
// request's prefill is split by heads: rank 0 publishes the step (tokens, matched and new slots)
// on the ring after the request's copies, every rank runs its share (compute stand-in, checking
// the matched KV of its heads, writing the new tokens' KV) and reports its time; a wrong byte on
// any rank stops the run naming the rank.
//
// The same requests are first served at TP=1 (one process, the whole model) for the comparison:
// hit rates must be equal (exit code 1 otherwise), TTFT is LoadBack's wall time plus the slowest
// rank's prefill. --tp-equal-bytes: for each rank r a TP=1 pass on rank r's GPU at rank r's
// bytes per copy (MHA: one rank's share of the KV heads; MLA: the whole latent, on GPU 0 the TP=1
// pass itself) is rank r's load bandwidth baseline (their hits must be equal too); the cpu
// device runs one such pass for all ranks.
// Sequential scheduling. --storage file: each pass gets a file store of per-head objects
// (docs/tp.md), host layout page_head; each rank reads and writes its heads; every request's
// backups land before the next (hits do not depend on the store's speed).
//
// Thread safety: called once from main.
#pragma once

#include <string>
#include <vector>

#include "kvtier/tp_group.h"
#include "replay.h"

namespace kvtier::tools {

struct TpReplayArgs {
  int tp = 1;         // --tp: ranks; 1 = the plain replay
  int rank = 0;       // --tp-rank (hidden): a follower started by rank 0
  std::string group;  // --tp-group (hidden): its decision ring
  std::string store;  // --tp-store (hidden): the pass's per-head file store URL
  // The decision ring's settings (name and tp_size are set per group by TpGroupConfigOf), with
  // flags from TpGroupConfigSchema: --tp-timeout (ack_timeout_s; 60 s here, the library's 10 s is
  // short beside a replay's first steps), --tp-follower-poll, --tp-follower-doze,
  // --tp-leader-poll, --tp-ack-each-copy.
  TpGroupConfig ring = [] {
    TpGroupConfig c;
    c.ack_timeout_s = 60;
    return c;
  }();
  bool equal_bytes = false;  // --tp-equal-bytes: TP=1 load baselines on each rank's GPU
};

// The decision ring's settings the flags give, for the group `name` (leader and followers alike).
TpGroupConfig TpGroupConfigOf(const TpReplayArgs& args, std::string name);

// `kvtier replay --tp N` (rank 0), or the follower rank the arguments name. `self_args` are the
// process's arguments after the program name (rank 0 starts the followers with them). Exit code
// as RunReplay: 0, 1 (wrong bytes, unequal hit rates, a failed rank), 2 (bad options).
int RunReplayTp(const ReplayOptions& options, const TpReplayArgs& args,
                const std::vector<std::string>& self_args);

}  // namespace kvtier::tools
