// The write policies (see cache/backup_policy.h).
#include "cache/backup_policy.h"

#include <algorithm>

#include "cache/radix_tree.h"

namespace kvtier {

namespace {

// write_through (threshold 1) and write_through_selective: back up once a node has enough hits.
class WriteThrough final : public BackupPolicy {
 public:
  WriteThrough(WritePolicy kind, int64_t threshold) : kind_(kind), threshold_(threshold) {}
  WritePolicy kind() const override { return kind_; }
  bool backs_up_on_use() const override { return true; }
  bool BackUpOnUse(const RadixNode& node) const override { return node.hit_count() >= threshold_; }
  bool back_up_on_eviction() const override { return false; }
  bool store_on_backup() const override { return true; }

 private:
  WritePolicy kind_;
  int64_t threshold_;
};

class WriteBack final : public BackupPolicy {
 public:
  WritePolicy kind() const override { return WritePolicy::kWriteBack; }
  bool backs_up_on_use() const override { return false; }
  bool BackUpOnUse(const RadixNode&) const override { return false; }
  bool back_up_on_eviction() const override { return true; }
  bool store_on_backup() const override { return false; }
};

}  // namespace

std::unique_ptr<BackupPolicy> MakeBackupPolicy(WritePolicy policy, int64_t threshold) {
  switch (policy) {
    case WritePolicy::kWriteBack:
      return std::make_unique<WriteBack>();
    case WritePolicy::kWriteThroughSelective:
      return std::make_unique<WriteThrough>(policy, std::max<int64_t>(threshold, 1));
    case WritePolicy::kWriteThrough:
    default:
      return std::make_unique<WriteThrough>(WritePolicy::kWriteThrough, 1);
  }
}

}  // namespace kvtier
