// The storage admission policies (see cache/store_admission.h).
#include "cache/store_admission.h"

#include "cache/radix_tree.h"
#include "cache/reuse_sketch.h"

namespace kvtier {

namespace {

// all, hits: the node's hit count (inserts and matches touching it).
class ByHits final : public StoreAdmission {
 public:
  ByHits(StorageAdmission kind, int64_t threshold) : kind_(kind), threshold_(threshold) {}
  StorageAdmission kind() const override { return kind_; }
  int64_t Estimate(const RadixNode& node, size_t) const override { return node.hit_count(); }
  bool Admits(int64_t estimate, bool) const override {
    return kind_ == StorageAdmission::kAll || estimate >= threshold_;
  }

 private:
  StorageAdmission kind_;
  int64_t threshold_;
};

class ByFrequency final : public StoreAdmission {
 public:
  ByFrequency(int64_t threshold, int64_t counters) : threshold_(threshold), sketch_(counters) {}
  StorageAdmission kind() const override { return StorageAdmission::kFrequency; }
  void Record(std::span<const PageKey> keys) override {
    for (const PageKey& k : keys) sketch_.Record(k);
  }
  int64_t Estimate(const RadixNode& node, size_t page) const override {
    return sketch_.Estimate(node.keys()[page]);
  }
  bool Admits(int64_t estimate, bool room) const override { return room || estimate >= threshold_; }

 private:
  int64_t threshold_;
  ReuseSketch sketch_;
};

}  // namespace

std::unique_ptr<StoreAdmission> MakeStoreAdmission(const StorageAdmissionConfig& config) {
  switch (config.policy) {
    case StorageAdmission::kFrequency:
      return std::make_unique<ByFrequency>(config.threshold, config.sketch_counters);
    case StorageAdmission::kHits:
      return std::make_unique<ByHits>(StorageAdmission::kHits, config.threshold);
    case StorageAdmission::kAll:
    default:
      return std::make_unique<ByHits>(StorageAdmission::kAll, config.threshold);
  }
}

}  // namespace kvtier
