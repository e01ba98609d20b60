// tools/replay/replay_ideal.h — the ideal of a replay run: what its TTFTs would be with the same
// hits, every load at the measured ceilings and overlapped with compute (replay.h, the ideal).
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "replay_report.h"
#include "replay_timeline.h"

namespace kvtier::tools {

// The ideal TTFT of each of a run's requests (`records`, in serving order, on `timeline`, the
// run's scheduling): its hits and its compute, no prefetch wait; the loads at their ceilings:
// every loaded byte (host and storage hits) crosses host -> device at `pcie`
// bytes/s, fully overlapped with the compute, and storage hits are read at `storage` bytes/s
// (<= 0: no storage ceiling, then at pcie), a token's KV being `kv_bytes_per_token`, the read
// pipelined with the copy. The read begins when the run's prefetch could begin, not when the
// request is served: the run starts it at the request's Match, so it overlaps the request's
// queueing. It is hidden behind the longer of the ideal's own queueing for the request and the
// run's measured lead (the wall time from the request's Prefetch call to its service, which also
// covers host work the timeline does not count); only the rest is charged. So the ideal is a lower
// bound per request whenever the run read no faster than the ceiling.
//
// With decode (a closed loop whose clients wait for their output), the ideal keeps the run's
// arrivals: its own would move with its shorter services (a client's next request coming earlier,
// into another's prefill), and it would no longer bound each request. With the same arrivals, in
// the same order, and no longer services, no request of the ideal ends later than in the run.
//
// REQUIRES: pcie > 0; `timeline` fresh (no request served) and as long as `records`.
std::vector<double> IdealTtft(Timeline timeline, const std::vector<RequestRecord>& records,
                              int64_t kv_bytes_per_token, double pcie, double storage);

}  // namespace kvtier::tools
