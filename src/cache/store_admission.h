// Internal: the storage admission policy of a cache (kvtier/hierarchical_cache.h,
// StorageAdmission) as a small interface beside BackupPolicy: the backup planner offers the pages
// of a store page by page, the policy estimates how likely each is to be read again and says
// whether it is written.
//
//   all        estimate: the node's hit count; admits every page
//   hits       estimate: the node's hit count; admits a page whose estimate >= threshold
//   frequency  estimate: the page key's count in a ReuseSketch (cache/reuse_sketch.h) of the
//              accesses Record saw; admits a page whose estimate >= threshold, or any page while
//              the writes waiting have room (the store's queue takes the store now, or the
//              backlog holds it whole)
//
// Thread safety: none; the cache's mutex guards it (Record changes the sketch).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/page_key.h"

namespace kvtier {

class RadixNode;

class StoreAdmission {
 public:
  virtual ~StoreAdmission() = default;
  virtual StorageAdmission kind() const = 0;
  // Accesses of pages (a Match's matched prefix, the pages an Insert added). Only `frequency`
  // keeps them.
  virtual void Record(std::span<const PageKey> keys) { (void)keys; }
  // How likely page `page` of `node` is to be read again: higher is likelier; comparable between
  // pages of one policy only. REQUIRES: page < node's pages (and, for frequency, its keys).
  virtual int64_t Estimate(const RadixNode& node, size_t page) const = 0;
  // Whether a page of `estimate` is written; `room`: the writes waiting (the store's queue and
  // the backlog) take the whole store without dropping anything.
  virtual bool Admits(int64_t estimate, bool room) const = 0;
};

std::unique_ptr<StoreAdmission> MakeStoreAdmission(const StorageAdmissionConfig& config);

}  // namespace kvtier
