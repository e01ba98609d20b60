// tools/replay/replay_oracle.h — the storage oracle of a `kvtier replay` run: the storage hits
// the run could have had if every write had been admitted and had completed at once, in a store
// of the same capacity, and the hits the run lost against that bound (writes dropped by a full
// queue, failed or timed out, skipped by the write policy, or still in flight when the page was
// wanted).
//
// The oracle store is a set of page keys of `capacity_pages` pages (-1: unbounded), least
// recently used first out. Requests are taken in the order they were served (warm-up first,
// uncounted). At a request's service the oracle's prefix is its longest run of stored whole pages
// of the prompt from the start; those pages are touched; then every page of the request (prompt,
// and output with --insert-output) is stored. Touches and stores go tail first, so a chain's
// first page is its most recent and eviction takes a chain's tail before its head, as the file
// store's does. The oracle's storage hit of a request is what its prefix covers beyond the
// device and host hits the run had: max(0, prefix - device_hit - host_hit); its lost hit is
// max(0, oracle storage hit - the run's storage hit).
//
// Thread safety: plain functions over values.
#pragma once

#include <cstdint>
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

// `warmup` and `chains`: each request's page keys (prompt, then output where the run inserted
// it), in serving order; `prompt_pages[i]`: the whole pages of chains[i]'s prompt (the only
// pages a lookup matches); `records[i]`: the run's hits of request i. REQUIRES: chains,
// prompt_pages and records of one length.
StorageOracleResult RunStorageOracle(const std::vector<std::vector<PageKey>>& warmup,
                                     const std::vector<std::vector<PageKey>>& chains,
                                     const std::vector<int64_t>& prompt_pages,
                                     const std::vector<RequestRecord>& records, int64_t page_size,
                                     int64_t capacity_pages);

}  // namespace kvtier::tools
