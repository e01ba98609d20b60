// tools/replay/replay_oracle.h — the storage oracle of a `kvtier replay` run: the storage hits
// the run could have had if every write its admission policy admitted had completed at once, in a
// store of the same capacity, and the hits the run lost against that bound (admitted writes
// dropped by a full backlog or queue, failed or timed out, or still in flight when the page was
// wanted). Admitting every write instead is a different store, not a bound: at a capacity below
// the working set it thrashes (the H100 replay of a 6,141-page store: 0.11 % of the tokens against
// the run's 4.87 % with frequency admission), so it is reported beside the bound as "admit-all".
//
// The policy's decisions are the run's own (HierarchicalCacheConfig's storage.admitted_listener):
// `frequency` admits by room in the write queue too, which depends on the run's timing, so it
// cannot be replayed apart from the run. A page the run admitted once is stored by the oracle at
// every request that has it from then on (the run does not offer a page it holds; the oracle,
// having evicted it, would write it again). An admission made while the next request was being
// served counts for the request before (a backup planned late, done at once, would have been
// there), so the oracle errs towards more hits, as a bound should.
//
// The oracle store is a set of page keys of `capacity_pages` pages (-1: unbounded), least
// recently used first out. Requests are taken in the order they were served (warm-up first,
// uncounted). At a request's service the oracle's prefix is its longest run of stored whole pages
// of the prompt from the start; those pages are touched; then every admitted page of the request
// (prompt, and output with --insert-output) is stored, and then every page admitted while it was
// served that the oracle does not hold, whichever request the page belongs to (a backup planned
// after its own request's service, as an open loop's queueing makes it, is in the run's store from
// then on; without this the demo's run served 122 % of the oracle). Touches and stores go tail
// first, so a chain's first page is its most recent and eviction takes a chain's tail before its
// head, as the file store's does. The oracle's storage hit of a request is what its prefix covers
// beyond the device and host hits the run had: max(0, prefix - device_hit - host_hit); its lost hit
// is max(0, oracle storage hit - the run's storage hit).
//
// Thread safety: RunStorageOracle is a plain function over values; AdmissionLog is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvtier/page_key.h"
#include "replay_report.h"

namespace kvtier::tools {

struct StorageOracleResult {
  int64_t capacity_pages = -1;
  int64_t storage_tokens = 0;  // the oracle's storage hits, summed over the counted requests
  int64_t lost_tokens = 0;     // summed max(0, oracle's - the run's) storage hit
  int64_t lost_requests = 0;   // requests with a lost hit
  std::vector<int64_t> oracle_storage_hit, lost_hit;  // per counted request
};

// For every page key the run's admission admitted, the request being served when it first did:
// the index of a counted request, or warm-up request w of W as w - W (negative).
using AdmittedAt = std::unordered_map<PageKey, int64_t, PageKeyHash>;

// The run's admissions as the cache makes them (storage.admitted_listener, on whichever thread
// planned the store), each key under the request being served when it was first admitted.
class AdmissionLog {
 public:
  // From now on admissions belong to request `index` (AdmittedAt's numbering).
  void Serving(int64_t index) { serving_.store(index, std::memory_order_relaxed); }
  void Admitted(std::span<const PageKey> keys);
  AdmittedAt Take();

 private:
  std::atomic<int64_t> serving_{0};
  std::mutex mu_;
  AdmittedAt at_;  // guarded by mu_
};

// `warmup` and `chains`: each request's page keys (prompt, then output where the run inserted
// it), in serving order; `prompt_pages[i]`: the whole pages of chains[i]'s prompt (the only
// pages a lookup matches); `records[i]`: the run's hits of request i. REQUIRES: chains,
// prompt_pages and records of one length. `admitted`: the run's admissions (the bound); nullptr:
// every page admitted (admit-all).
StorageOracleResult RunStorageOracle(const std::vector<std::vector<PageKey>>& warmup,
                                     const std::vector<std::vector<PageKey>>& chains,
                                     const std::vector<int64_t>& prompt_pages,
                                     const std::vector<RequestRecord>& records, int64_t page_size,
                                     int64_t capacity_pages, const AdmittedAt* admitted);

}  // namespace kvtier::tools
