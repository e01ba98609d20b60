// tools/replay/replay_tp_pass.h — one pass of `kvtier replay --tp N` (replay_tp.h): every request
// served once at `tp` ranks, from its two sides. Rank 0 (RunTpPass, replay_tp_pass.cc) runs the
// cache, whose decisions and copies reach the followers through the leader's decision ring, runs
// its own share of each prefill and gathers what the pass measured; a follower (RunTpFollower,
// replay_tp_follower.cc) applies the ring's records to its own pools and runs its share of each
// step, until rank 0 closes the ring.
//
// Thread safety: each side is one thread of its own process.
#pragma once

#include "kvtier/status.h"
#include "kvtier/tp_group.h"
#include "replay_tp.h"
#include "replay_tp_rank.h"
#include "replay_tp_report.h"

namespace kvtier::tools {

// Serves every request at `tp` ranks (rank 0 here; the followers through `leader`, null at
// TP=1) into `out`. A wrong byte on any rank, a rank that does not answer within the group's
// timeout or a cache inconsistency after the pass is an error naming it.
// REQUIRES: at tp > 1, the tp - 1 followers have attached to `leader` (WaitForFollowers).
Status RunTpPass(const TpSetup& s, int tp, TpLeader* leader, TpPassResult* out);

// A follower rank: its own device pool (its heads), host pages of the leader's shape, its engine;
// applies every record until rank 0 closes the ring (then OK). `a` names its rank, the group's
// ring and the pass's per-head store.
Status RunTpFollower(const TpSetup& s, const TpReplayArgs& a);

}  // namespace kvtier::tools
