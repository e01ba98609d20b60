#include "kvtier/testing/device_tier.h"

#include <algorithm>
#include <utility>

#include "kvtier/testing/kv_pattern.h"

namespace kvtier::testing {
namespace {

std::vector<int64_t> Iota(size_t n) {
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int64_t>(i);
  return v;
}

}  // namespace

Result<std::unique_ptr<DeviceTier>> DeviceTier::Create(TransferBackend backend,
                                                       const KvGeometry& geometry, bool mla) {
  return Create(backend, geometry, mla, InitialBytes{});
}

Result<std::unique_ptr<DeviceTier>> DeviceTier::Create(TransferBackend backend,
                                                       const KvGeometry& geometry, bool mla,
                                                       InitialBytes initial) {
  auto t = std::unique_ptr<DeviceTier>(new DeviceTier());
  t->backend_ = backend;
  t->initial_ = initial;
  const int64_t bytes = geometry.buffer_bytes();
  if (backend == TransferBackend::kCpu) {
    t->k_.assign(static_cast<size_t>(bytes), initial.k);
    t->region_.geometry = geometry;
    t->region_.mla = mla;
    t->region_.k = t->k_.data();
    if (!mla) {
      t->v_.assign(static_cast<size_t>(bytes), initial.v);
      t->region_.v = t->v_.data();
    }
    return Result<std::unique_ptr<DeviceTier>>(std::move(t));
  }
  KVTIER_ASSIGN_OR_RETURN(t->pool_, DeviceKvPool::Create(geometry, mla, 0));
  t->region_ = t->pool_.region();
  KVTIER_ASSIGN_OR_RETURN(t->staging_mem_, PinnedHostBuffer::Allocate(bytes * (mla ? 1 : 2)));
  t->staging_ = t->region_;
  t->staging_.memory = MemoryKind::kHost;
  t->staging_.device = -1;
  t->staging_.k = t->staging_mem_.data();
  t->staging_.v = mla ? nullptr : static_cast<std::byte*>(t->staging_mem_.data()) + bytes;
  KVTIER_ASSIGN_OR_RETURN(t->engine_, MakeTransferEngine(backend));
  return Result<std::unique_ptr<DeviceTier>>(std::move(t));
}

Status DeviceTier::Fill(std::span<const int64_t> slots, std::span<const uint64_t> hashes) {
  if (backend_ == TransferBackend::kCpu) return FillKvPattern(region_, slots, hashes);
  std::lock_guard<std::mutex> staging_lock(staging_mu_);
  std::vector<int64_t> idx = Iota(slots.size());
  KVTIER_RETURN_IF_ERROR(FillKvPattern(staging_, idx, hashes));
  KVTIER_RETURN_IF_ERROR(engine_->Transfer(TransferRequest::AllLayers(
      staging_, region_, SlotIndices::Host(idx), SlotIndices::Host(slots))));
  return engine_->Synchronize(nullptr);
}

Status DeviceTier::Verify(std::span<const int64_t> slots, std::span<const uint64_t> hashes) {
  if (backend_ == TransferBackend::kCpu) return VerifyKvPattern(region_, slots, hashes);
  if (slots.empty()) return Status::OK();
  std::lock_guard<std::mutex> staging_lock(staging_mu_);
  std::vector<int64_t> idx = Iota(slots.size());
  KVTIER_RETURN_IF_ERROR(engine_->Transfer(TransferRequest::AllLayers(
      region_, staging_, SlotIndices::Host(slots), SlotIndices::Host(idx))));
  KVTIER_RETURN_IF_ERROR(engine_->Synchronize(nullptr));
  return VerifyKvPattern(staging_, idx, hashes);
}

void DeviceTier::Poison() {
  std::fill(k_.begin(), k_.end(), initial_.k);
  std::fill(v_.begin(), v_.end(), initial_.v);
}

}  // namespace kvtier::testing
