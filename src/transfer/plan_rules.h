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
// Thread safety: pure functions.
#pragma once

#include <cstdint>

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

}  // namespace kvtier::transfer
