// A CacheParts (cache/cache_parts.h) on the cpu backend for the parts' unit tests: the "device"
// tier in host memory (DeviceTier), a host pool of `host_pages` pages (0: no host tier) and an
// optional storage backend, wired as HierarchicalCache::Create wires them. Tests drive one part's
// calls under the core's lock, as the orchestrator does, and let a CacheWork declared before the
// lock run the copies after it.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/cache_parts.h"
#include "cache/cache_test_util.h"
#include "kvtier/page_key.h"
#include "kvtier/storage.h"

namespace kvtier::testing {

constexpr int64_t kRigLayers = 2;
constexpr int64_t kRigSlotBytes = 8;

inline std::vector<Token> Seq(int64_t n, Token base) {
  std::vector<Token> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = base + static_cast<Token>(i);
  return t;
}

// A memory:// store whose namespace describes the rig's host pages (page_first).
inline std::shared_ptr<StorageBackend> RigMemoryStore(int64_t page, StorageOptions options = {}) {
  StorageNamespace ns;
  ns.model_id = "parts-test";
  ns.layout = KvLayout::kPageFirst;
  ns.num_layers = kRigLayers;
  ns.slot_bytes = kRigSlotBytes;
  ns.page_size = page;
  auto b = OpenStorage("memory://?capacity=64MiB", ns, options);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::shared_ptr<StorageBackend>(std::move(*b)) : nullptr;
}

struct PartsRig {
  std::unique_ptr<DeviceTier> device;
  std::unique_ptr<CacheParts> parts;

  static std::unique_ptr<PartsRig> Make(HierarchicalCacheConfig cfg, int64_t page,
                                        int64_t device_pages, int64_t host_pages) {
    auto rig = std::make_unique<PartsRig>();
    KvGeometry g{KvLayout::kLayerFirst, kRigLayers, device_pages * page, kRigSlotBytes, page, 1};
    auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
    EXPECT_TRUE(dev.ok()) << dev.status().ToString();
    rig->device = std::move(*dev);
    cfg.host_capacity_bytes = host_pages * page * kRigLayers * kRigSlotBytes * 2;
    if (host_pages == 0) cfg.host_ratio = 0;
    cfg.transfer.cpu_threads = 1;
    EXPECT_TRUE(cfg.Validate().ok()) << cfg.Validate().ToString();
    auto engine = MakeTransferEngine(TransferBackend::kCpu, cfg.transfer);
    EXPECT_TRUE(engine.ok());
    rig->parts = std::make_unique<CacheParts>(cfg, page);
    const Status st = rig->parts->Open(rig->device->region(), std::move(*engine));
    EXPECT_TRUE(st.ok()) << st.ToString();
    return rig;
  }

  CacheParts& p() { return *parts; }
  int64_t P() const { return parts->P; }

  // The engine's prefill of `tokens` (whole pages), recomputing everything: engine pages from the
  // ledger, filled with the KV pattern, inserted into the tree (pages of a prefix the tree has on
  // the device already are freed, as duplicates). Returns the deepest node.
  RadixNode* InsertOnDevice(std::span<const Token> tokens, std::string_view ns = "") {
    CacheLock lk(*parts);
    const int64_t pages = static_cast<int64_t>(tokens.size()) / P();
    auto got = parts->ledger->Allocate(pages, DevicePageLedger::kEngine);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    const std::vector<int64_t> slots = PageSlots(*got, P());
    EXPECT_TRUE(device->Fill(slots, Hashes(tokens, ns)).ok());
    auto keys = ComputePromptPageKeys(tokens, P(), ns);
    EXPECT_TRUE(keys.ok());
    std::vector<RadixTree::InsertSegment> segments;
    parts->tree.Insert(ns, tokens, *got, *keys, &segments);
    std::vector<int64_t> taken, duplicates;
    for (const auto& seg : segments) {
      auto& to = seg.kind == RadixTree::SegmentKind::kOnDevice ? duplicates : taken;
      for (int64_t k = seg.begin; k < seg.end; k += P()) to.push_back((*got)[k / P()]);
    }
    parts->ledger->Transfer(taken, DevicePageLedger::kTree);
    EXPECT_TRUE(parts->ledger->Free(duplicates).ok());
    return segments.empty() ? nullptr : segments.back().node;
  }

  // Reaps what completed (and runs what that starts) until nothing is in flight.
  void Settle() {
    CacheWork work(&parts->executor);
    CacheLock lk(*parts);
    parts->Drain(lk, &work, /*backups_only=*/false);
  }

  void ExpectConsistent() {
    CacheLock lk(*parts);
    const Status st = CheckCacheConsistency(*parts);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
};

}  // namespace kvtier::testing
