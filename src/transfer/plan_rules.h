// Internal: the two planning rules every backend shares (cpu_transfer.cc, cuda/kernel_engine.cc,
// cuda/dma_engine.cc), written once.
//
//   lead layout  the side whose layout a copy walks in address order: the side that is not
//                layer_first (the host side of a load or backup); when both are something else,
//                the destination, whose writes are the costlier stream.
//   slot runs    consecutive slot pairs whose source and destination indices both advance by
//                one, cut where a paged side (page_first_direct, page_head) starts a new page:
//                within a run, a slot's bytes follow the previous slot's on both sides.
//
// FindSlotRuns finds the slot runs of a whole request (the dma backend's planner).
//
// Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/transfer.h"

namespace kvtier::transfer {

inline const KvGeometry& LeadGeometry(const KvGeometry& src, const KvGeometry& dst) {
  return dst.layout != KvLayout::kLayerFirst ? dst : src;
}
inline KvLayout LeadLayout(const TransferRequest& r) {
  return LeadGeometry(r.src->geometry, r.dst->geometry).layout;
}

// The page size that cuts runs on a side of layout `g` (0: runs are never cut there).
inline int64_t RunCutPage(const KvGeometry& g) {
  return g.layout == KvLayout::kPageFirstDirect || g.layout == KvLayout::kPageHead ? g.page_size
                                                                                   : 0;
}

// Whether pair (s, d) continues the run whose last pair was (prev_s, prev_d); src_page /
// dst_page from RunCutPage.
inline bool ContinuesRun(int64_t prev_s, int64_t prev_d, int64_t s, int64_t d, int64_t src_page,
                         int64_t dst_page) {
  return s == prev_s + 1 && d == prev_d + 1 && (src_page == 0 || s % src_page != 0) &&
         (dst_page == 0 || d % dst_page != 0);
}

namespace internal {

// The position of `slot` in its page of `page` slots (also for slot < 0); no division for the
// usual power-of-two pages. page <= 0 (no pages): -1, a position a run never reaches.
inline int64_t PositionInPage(int64_t slot, int64_t page) {
  if (page <= 0) return -1;
  return (page & (page - 1)) == 0 ? slot & (page - 1) : ((slot % page) + page) % page;
}

template <typename S, typename D>
void FindSlotRunsOf(const S* s, const D* d, int64_t n, int64_t src_page, int64_t dst_page,
                    std::vector<int64_t>* starts) {
  if (n > 0) starts->push_back(0);
  // Where pair k - 1 sits in its pages; a pair that continues the run sits one further on, and
  // must not be at a page start (position == page, wrapped).
  int64_t ps = n > 0 ? static_cast<int64_t>(s[0]) : 0, pd = n > 0 ? static_cast<int64_t>(d[0]) : 0;
  int64_t at_s = PositionInPage(ps, src_page), at_d = PositionInPage(pd, dst_page);
  const int64_t end_s = src_page > 0 ? src_page : -2, end_d = dst_page > 0 ? dst_page : -2;
  for (int64_t k = 1; k < n; ++k) {
    const auto sk = static_cast<int64_t>(s[k]);
    const auto dk = static_cast<int64_t>(d[k]);
    if (sk == ps + 1 && dk == pd + 1 && at_s + 1 != end_s && at_d + 1 != end_d) {
      // at_s / at_d stay -1 on a side without pages (-1 + 1 never equals -2).
      at_s += src_page > 0;
      at_d += dst_page > 0;
    } else {
      starts->push_back(k);
      at_s = PositionInPage(sk, src_page);
      at_d = PositionInPage(dk, dst_page);
    }
    ps = sk;
    pd = dk;
  }
  starts->push_back(n);
}

}  // namespace internal

// The slot runs of a request's host index lists: appends to `starts` the position of every pair
// that does not continue the run before it (ContinuesRun, with src_page / dst_page from
// RunCutPage), then si.count: run i is [starts[i], starts[i + 1]). The same runs as testing
// ContinuesRun pair by pair, with one division per run instead of two per pair (the position in
// the page is carried along the run): it is on every copy's path, before the first byte moves.
// REQUIRES: si and di in host memory, si.count == di.count.
inline void FindSlotRuns(const SlotIndices& si, const SlotIndices& di, int64_t src_page,
                         int64_t dst_page, std::vector<int64_t>* starts) {
  const bool s64 = si.type == IndexType::kInt64, d64 = di.type == IndexType::kInt64;
  const auto* s32 = static_cast<const int32_t*>(si.data);
  const auto* d32 = static_cast<const int32_t*>(di.data);
  const auto* sl = static_cast<const int64_t*>(si.data);
  const auto* dl = static_cast<const int64_t*>(di.data);
  if (s64 && d64) return internal::FindSlotRunsOf(sl, dl, si.count, src_page, dst_page, starts);
  if (s64) return internal::FindSlotRunsOf(sl, d32, si.count, src_page, dst_page, starts);
  if (d64) return internal::FindSlotRunsOf(s32, dl, si.count, src_page, dst_page, starts);
  internal::FindSlotRunsOf(s32, d32, si.count, src_page, dst_page, starts);
}

}  // namespace kvtier::transfer
