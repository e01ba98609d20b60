// Tests for the shared host segment's tail-first eviction: pages reserved with their parents are
// evicted a chain's tail before its head, so no READY page is left whose prefix is gone (a page
// no lookup reaches). Chains written interleaved into a segment far smaller than they are keep
// every resident page reachable, where the same workload without parents (plain LRU) strands
// pages; a chain longer than the room keeps its head; pinned pages stay; the shm:// store passes
// a Set's parents to the segment; and the parent links are checked (`kvtier shm inspect
// --check`): a corrupted link or child count is reported, a segment of the previous format
// version is refused with what to do.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kvtier/page_key.h"
#include "kvtier/shared_host_pool.h"
#include "kvtier/storage.h"
#include "pool/shared_host_pool_test_util.h"
#include "pool/shm_layout.h"
#include "support/kv_test_util.h"

namespace kvtier {
namespace {

using testing::ScopedSegmentName;
using testing::SmallSharedGeometry;

constexpr uint64_t kNamespace = 7;

#define ASSERT_OK(expr)                                     \
  do {                                                      \
    const ::kvtier::Status s_ = (expr);                     \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.ToString(); \
  } while (0)

std::unique_ptr<SharedHostPool> MustCreate(const std::string& name, int64_t num_pages) {
  SharedHostPoolConfig c;
  c.name = name;
  c.geometry = SmallSharedGeometry(num_pages);
  c.max_processes = 4;
  c.register_with_cuda = false;
  auto created = SharedHostPool::Create(c);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  return created.ok() ? std::move(created).value() : nullptr;
}

// The page keys of a prompt of `pages` pages (4 tokens each) whose tokens start at `first`: each
// key hashes its parent's, as the cache's keys do.
std::vector<PageKey> ChainKeys(int32_t first, int64_t pages) {
  std::vector<Token> tokens(static_cast<size_t>(pages * 4));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = first + static_cast<int32_t>(i);
  auto keys = ComputePromptPageKeys(tokens, 4);
  EXPECT_TRUE(keys.ok());
  return keys.ok() ? *keys : std::vector<PageKey>{};
}

// Publishes keys[i] alone (with its parent keys[i - 1] when `with_parents`); the outcome.
ReserveOutcome Publish(SharedHostPool& pool, const std::vector<PageKey>& keys, size_t i,
                       bool with_parents) {
  std::vector<std::optional<PageKey>> parents;
  if (with_parents) parents.push_back(i == 0 ? std::nullopt : std::optional(keys[i - 1]));
  auto r = pool.Reserve(kNamespace, std::span(keys).subspan(i, 1), parents);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return ReserveOutcome::kNoSpace;
  if ((*r)[0].outcome == ReserveOutcome::kReserved) {
    const int64_t page = (*r)[0].page;
    EXPECT_TRUE(pool.Commit(std::span(&page, 1)).ok());
  }
  return (*r)[0].outcome;
}

// The leading pages of `keys` a lookup finds (pinned and unpinned again: marks them used).
int64_t CachedPrefix(SharedHostPool& pool, const std::vector<PageKey>& keys,
                     uint64_t namespace_hash = kNamespace) {
  auto pages = pool.PinPrefix(namespace_hash, keys);
  EXPECT_TRUE(pages.ok());
  if (!pages.ok()) return 0;
  EXPECT_TRUE(pool.Unpin(*pages).ok());
  return static_cast<int64_t>(pages->size());
}

// Whether keys[i] is READY in the segment.
bool Resident(SharedHostPool& pool, const std::vector<PageKey>& keys, size_t i) {
  return CachedPrefix(pool, {keys[i]}) == 1;
}

// Writes `chains` chains of `length` pages into a segment of `room` pages, interleaved: page 0 of
// every chain, then page 1 of every chain, ... (a page whose parent is gone is refused with
// parents, written anyway without). Returns the READY pages no lookup reaches (resident beyond
// their chain's cached prefix), counted at the end; with parents it also checks after every step
// that the segment counts none and keeps its invariants.
int64_t StrandedAfterInterleavedChains(bool with_parents, int chains, int64_t length, int64_t room,
                                       int64_t* evictions) {
  ScopedSegmentName name(with_parents ? "chains" : "lru");
  auto pool = MustCreate(name.get(), room);
  if (pool == nullptr) return -1;
  std::vector<std::vector<PageKey>> keys;
  for (int c = 0; c < chains; ++c) keys.push_back(ChainKeys(1000 * (c + 1), length));
  for (size_t i = 0; i < static_cast<size_t>(length); ++i) {
    for (const auto& chain : keys) {
      Publish(*pool, chain, i, with_parents);
      if (!with_parents) continue;
      auto info = pool->Inspect();
      EXPECT_TRUE(info.ok());
      if (info.ok()) {
        EXPECT_EQ(info->unreachable_pages, 0) << "page " << i;
        EXPECT_EQ(info->evictions_with_children, 0) << "page " << i;
      }
      EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants().ToString();
    }
  }
  auto info = pool->Inspect();
  EXPECT_TRUE(info.ok());
  *evictions = info.ok() ? info->evictions : 0;
  int64_t stranded = 0;
  for (const auto& chain : keys) {
    const int64_t prefix = CachedPrefix(*pool, chain);
    for (size_t i = static_cast<size_t>(prefix); i < chain.size(); ++i) {
      if (Resident(*pool, chain, i)) ++stranded;
    }
  }
  return stranded;
}

TEST(SharedHostPoolChainTest, InterleavedChainsLeaveNoUnreachablePage) {
  // 6 chains of 10 pages through 16 pages of room.
  int64_t lru_evictions = 0, chain_evictions = 0;
  const int64_t lru = StrandedAfterInterleavedChains(false, 6, 10, 16, &lru_evictions);
  const int64_t chained = StrandedAfterInterleavedChains(true, 6, 10, 16, &chain_evictions);
  std::cout << "unreachable READY pages at the end: plain LRU (no parents) " << lru << " after "
            << lru_evictions << " evictions; tail-first (parents) " << chained << " after "
            << chain_evictions << " evictions\n";
  EXPECT_GT(lru, 0) << "the workload must strand pages under plain LRU, or it tests nothing";
  EXPECT_GT(chain_evictions, 0);
  EXPECT_EQ(chained, 0);
}

TEST(SharedHostPoolChainTest, TailsGoBeforeHeadsOldestLeafFirst) {
  ScopedSegmentName name("order");
  auto pool = MustCreate(name.get(), 5);
  ASSERT_NE(pool, nullptr);
  const std::vector<PageKey> a = ChainKeys(100, 3), b = ChainKeys(200, 2);
  // Oldest first: a0 a1 a2 b0 b1. Plain LRU would evict a0 first.
  for (size_t i = 0; i < a.size(); ++i) Publish(*pool, a, i, true);
  for (size_t i = 0; i < b.size(); ++i) Publish(*pool, b, i, true);
  const std::vector<PageKey> c = ChainKeys(300, 5);
  // Each new root evicts one page: a2 (the oldest leaf), then a1, a0, then b1, b0.
  const std::vector<std::pair<const std::vector<PageKey>*, size_t>> want = {
      {&a, 2}, {&a, 1}, {&a, 0}, {&b, 1}, {&b, 0}};
  for (size_t step = 0; step < want.size(); ++step) {
    const std::vector<PageKey> root = ChainKeys(400 + 10 * static_cast<int32_t>(step), 1);
    ASSERT_EQ(Publish(*pool, root, 0, true), ReserveOutcome::kReserved);
    EXPECT_FALSE(Resident(*pool, *want[step].first, want[step].second)) << "step " << step;
    auto info = pool->Inspect();
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->unreachable_pages, 0);
    EXPECT_EQ(info->evictions, static_cast<int64_t>(step) + 1);
    // Residency probes pin and so touch pages: probe only the victim, which is gone.
  }
  ASSERT_OK(pool->CheckInvariants());
}

TEST(SharedHostPoolChainTest, OneCallEvictsOldestLeafFirstAsItsParentsBecomeLeaves) {
  // Interleaved, oldest first: a0 b0 a1 b1 a2. The oldest leaf is b1; then its parent b0 (older
  // than the leaf a2); then a2, a1, a0. Evict(k) takes the first k of that order in one lock hold.
  const std::vector<PageKey> a = ChainKeys(100, 3), b = ChainKeys(200, 2);
  const std::vector<std::pair<const std::vector<PageKey>*, size_t>> order = {
      {&b, 1}, {&b, 0}, {&a, 2}, {&a, 1}, {&a, 0}};
  for (int64_t k = 1; k <= 5; ++k) {
    ScopedSegmentName name("evict" + std::to_string(k));
    auto pool = MustCreate(name.get(), 5);
    ASSERT_NE(pool, nullptr);
    Publish(*pool, a, 0, true);
    Publish(*pool, b, 0, true);
    Publish(*pool, a, 1, true);
    Publish(*pool, b, 1, true);
    Publish(*pool, a, 2, true);
    auto evicted = pool->Evict(k);
    ASSERT_TRUE(evicted.ok());
    ASSERT_EQ(*evicted, k);
    for (size_t j = 0; j < order.size(); ++j) {
      EXPECT_EQ(Resident(*pool, *order[j].first, order[j].second), static_cast<int64_t>(j) >= k)
          << "after Evict(" << k << "), victim " << j;
    }
    ASSERT_OK(pool->CheckInvariants());
  }
}

TEST(SharedHostPoolChainTest, ChainLongerThanTheRoomKeepsItsHead) {
  ScopedSegmentName name("long");
  auto pool = MustCreate(name.get(), 4);
  ASSERT_NE(pool, nullptr);
  const std::vector<PageKey> keys = ChainKeys(10, 6);
  for (size_t i = 0; i < 4; ++i)
    ASSERT_EQ(Publish(*pool, keys, i, true), ReserveOutcome::kReserved);
  // The only leaf is the new page's parent: the new page is refused, the prefix stays.
  EXPECT_EQ(Publish(*pool, keys, 4, true), ReserveOutcome::kNoSpace);
  EXPECT_EQ(CachedPrefix(*pool, keys), 4);
  // In one call, too: the tail beyond the room is refused.
  ScopedSegmentName name2("long2");
  auto pool2 = MustCreate(name2.get(), 4);
  ASSERT_NE(pool2, nullptr);
  std::vector<std::optional<PageKey>> parents(keys.size());
  for (size_t i = 1; i < keys.size(); ++i) parents[i] = keys[i - 1];
  auto r = pool2->Reserve(kNamespace, keys, parents);
  ASSERT_TRUE(r.ok());
  std::vector<int64_t> written;
  for (size_t i = 0; i < keys.size(); ++i) {
    // Page 4 finds no room (its parent is the only leaf); page 5's parent is then not there.
    const ReserveOutcome want = i < 4    ? ReserveOutcome::kReserved
                                : i == 4 ? ReserveOutcome::kNoSpace
                                         : ReserveOutcome::kNoParent;
    EXPECT_EQ((*r)[i].outcome, want) << i;
    if ((*r)[i].outcome == ReserveOutcome::kReserved) written.push_back((*r)[i].page);
  }
  ASSERT_OK(pool2->Commit(written));
  EXPECT_EQ(CachedPrefix(*pool2, keys), 4);
  // A page whose parent is not in the segment would be unreachable: refused.
  const std::vector<PageKey> other = ChainKeys(5000, 3);
  EXPECT_EQ(Publish(*pool2, other, 2, true), ReserveOutcome::kNoParent);
  ASSERT_OK(pool2->CheckInvariants());
}

TEST(SharedHostPoolChainTest, PinnedPagesStayAndWithoutAnUnpinnedLeafTheOldestPageGoes) {
  ScopedSegmentName name("pins");
  auto pool = MustCreate(name.get(), 3);
  ASSERT_NE(pool, nullptr);
  const std::vector<PageKey> a = ChainKeys(10, 2), b = ChainKeys(20, 1), c = ChainKeys(30, 1);
  Publish(*pool, a, 0, true);
  Publish(*pool, a, 1, true);
  Publish(*pool, b, 0, true);
  // Pin the leaves a1 and b0; a0 is unpinned but a1's parent.
  auto a1 = pool->PinPrefix(kNamespace, a);
  ASSERT_TRUE(a1.ok());
  ASSERT_EQ(a1->size(), 2u);
  ASSERT_OK(pool->Unpin(std::span(a1->data(), 1)));
  auto b0 = pool->PinPrefix(kNamespace, b);
  ASSERT_TRUE(b0.ok());
  // No unpinned leaf: the capacity holds, the oldest unpinned page (a0) goes, a1 is stranded.
  ASSERT_EQ(Publish(*pool, c, 0, true), ReserveOutcome::kReserved);
  auto info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->evictions_with_children, 1);
  EXPECT_EQ(info->unreachable_pages, 1);
  EXPECT_EQ(info->pinned_pages, 2);
  ASSERT_OK(pool->CheckInvariants());
  // Everything pinned: no space.
  auto c0 = pool->PinPrefix(kNamespace, c);
  ASSERT_TRUE(c0.ok());
  EXPECT_EQ(Publish(*pool, ChainKeys(40, 1), 0, true), ReserveOutcome::kNoSpace);
  ASSERT_OK(pool->Unpin(std::span(a1->data() + 1, 1)));
  ASSERT_OK(pool->Unpin(*b0));
  ASSERT_OK(pool->Unpin(*c0));
  // Parents given with the wrong length are refused.
  std::vector<std::optional<PageKey>> one(1);
  EXPECT_EQ(pool->Reserve(kNamespace, a, one).status().code(), StatusCode::kInvalidArgument);
}

TEST(SharedHostPoolChainTest, ShmStoreRecordsTheParentsOfASet) {
  ScopedSegmentName name("store");
  auto created = MustCreate(name.get(), 4);
  ASSERT_NE(created, nullptr);
  std::shared_ptr<SharedHostPool> pool(std::move(created));
  StorageNamespace ns;
  ns.model_id = "chain-test";
  ns.layout = KvLayout::kPageFirst;
  ns.num_layers = 2;
  ns.slot_bytes = 32;
  ns.page_size = 4;
  auto store = OpenSharedHostStorage(pool, ns);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<std::vector<std::byte>> bytes(
      6, std::vector<std::byte>(static_cast<size_t>(ns.page_bytes())));
  const auto set = [&](const std::vector<PageKey>& keys,
                       const std::vector<std::optional<PageKey>>& parents) {
    std::vector<PageBuffer> buffers;
    for (size_t i = 0; i < keys.size(); ++i) buffers.push_back(PageBuffer::Of(bytes[i]));
    return (*store)->Set(keys, buffers, parents).get();
  };
  // A chain of 3, then a chain of 3 whose parent is not in the segment: refused.
  const std::vector<PageKey> a = ChainKeys(10, 3), b = ChainKeys(20, 4);
  BatchResult r = set(a, {std::nullopt, a[0], a[1]});
  ASSERT_OK(r.status);
  EXPECT_EQ(r.leading_ok(), 3);
  r = set({b[1], b[2], b[3]}, {b[0], b[1], b[2]});
  EXPECT_EQ(r.count(PageStatus::kOk), 0);
  // The segment is full after one more root; the next evicts a's tail, not its head.
  r = set({b[0]}, {std::nullopt});
  EXPECT_EQ(r.leading_ok(), 1);
  r = set({ChainKeys(30, 1)[0]}, {std::nullopt});
  EXPECT_EQ(r.leading_ok(), 1);
  auto info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->evictions, 1);
  EXPECT_EQ(info->unreachable_pages, 0);
  EXPECT_EQ(CachedPrefix(*pool, a, ns.Hash()), 2);
  ASSERT_OK(pool->CheckInvariants());
}

// The segment's eviction against a brute-force model (the least recently used unpinned leaf,
// never the new page's parent; without one, the least recently used unpinned page), over random
// forests of pages, pins, single reservations and multi-page Evict calls (which exercise the
// remembered scan). Every key is probed after every step (a probe pins: it makes a resident page
// the most recently used, which the model mirrors).
class EvictionModel {
 public:
  struct Page {
    std::optional<size_t> parent;  // the key index recorded as parent
    int pins = 0;
    bool writing = false;  // reserved, not committed: not in `order`, never a victim
  };
  std::vector<size_t> order;  // resident keys, least recently used first
  std::map<size_t, Page> resident;

  int Children(size_t k) const {
    int n = 0;
    for (const auto& [key, page] : resident) n += key != k && page.parent == k ? 1 : 0;
    return n;
  }
  // The victim, or nullopt (kNoSpace) when none may go.
  std::optional<size_t> Victim(std::optional<size_t> protect) const {
    const auto leaf = [&](size_t k) { return resident.at(k).pins == 0 && Children(k) == 0; };
    for (size_t k : order) {
      if (k != protect && leaf(k)) return k;
    }
    if (protect && resident.count(*protect) != 0 && !resident.at(*protect).writing &&
        leaf(*protect)) {
      return std::nullopt;
    }
    for (size_t k : order) {
      if (k != protect && resident.at(k).pins == 0) return k;
    }
    return std::nullopt;
  }
  void Remove(size_t k) {
    resident.erase(k);
    order.erase(std::find(order.begin(), order.end(), k));
  }
  void Touch(size_t k) {
    order.erase(std::find(order.begin(), order.end(), k));
    order.push_back(k);
  }
};

TEST(SharedHostPoolChainTest, EvictionMatchesABruteForceModel) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int64_t kRoom = 10;
  constexpr size_t kKeys = 30;
  ScopedSegmentName name("model");
  auto pool = MustCreate(name.get(), kRoom);
  ASSERT_NE(pool, nullptr);
  std::vector<PageKey> keys(kKeys);
  for (size_t i = 0; i < kKeys; ++i) {
    for (auto& b : keys[i].bytes) b = static_cast<uint8_t>(rng());
  }
  EvictionModel model;
  std::vector<std::pair<size_t, int64_t>> held;  // (key, page) pinned by the test
  const auto probe = [&](int step) {
    for (size_t k = 0; k < kKeys; ++k) {
      auto pages = pool->PinPrefix(kNamespace, std::span(&keys[k], 1));
      ASSERT_TRUE(pages.ok());
      ASSERT_EQ(pages->size(), model.resident.count(k)) << "key " << k << " step " << step;
      if (!pages->empty()) {
        model.Touch(k);
        ASSERT_OK(pool->Unpin(*pages));
      }
    }
    ASSERT_OK(pool->CheckInvariants());
  };
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 6) {  // reserve + commit a chain of 1-4 fresh keys; the first with a resident
                   // parent, an absent one or none
      std::vector<size_t> chain;
      const size_t length = rng() % 3 == 0 ? 2 + rng() % 3 : 1;
      for (size_t tries = 0; chain.size() < length && tries < 20; ++tries) {
        const size_t k = rng() % kKeys;
        if (model.resident.count(k) == 0 &&
            std::find(chain.begin(), chain.end(), k) == chain.end()) {
          chain.push_back(k);
        }
      }
      if (chain.empty()) continue;
      std::optional<size_t> first_parent;
      const int how = static_cast<int>(rng() % 4);
      if (how > 0 && how < 3 && !model.order.empty()) {
        first_parent = model.order[rng() % model.order.size()];
      } else if (how == 3) {
        first_parent = rng() % kKeys;
        if (std::find(chain.begin(), chain.end(), *first_parent) != chain.end()) {
          first_parent.reset();
        }
      }
      std::vector<PageKey> chain_keys;
      std::vector<std::optional<PageKey>> parents;
      for (size_t i = 0; i < chain.size(); ++i) {
        chain_keys.push_back(keys[chain[i]]);
        const std::optional<size_t> parent = i == 0 ? first_parent : chain[i - 1];
        parents.push_back(parent ? std::optional(keys[*parent]) : std::nullopt);
      }
      auto r = pool->Reserve(kNamespace, chain_keys, parents);
      ASSERT_TRUE(r.ok());
      std::vector<int64_t> written;
      for (size_t i = 0; i < chain.size(); ++i) {
        const std::optional<size_t> parent = i == 0 ? first_parent : chain[i - 1];
        ReserveOutcome want = ReserveOutcome::kReserved;
        if (parent && model.resident.count(*parent) == 0) {
          want = ReserveOutcome::kNoParent;
        } else if (static_cast<int64_t>(model.resident.size()) == kRoom) {
          const std::optional<size_t> victim = model.Victim(parent);
          if (victim) {
            model.Remove(*victim);
          } else {
            want = ReserveOutcome::kNoSpace;
          }
        }
        ASSERT_EQ((*r)[i].outcome, want) << "step " << step << " key " << i;
        if (want != ReserveOutcome::kReserved) continue;
        written.push_back((*r)[i].page);
        model.resident[chain[i]] = {parent, 0, true};
      }
      ASSERT_OK(pool->Commit(written));
      for (size_t k : chain) {
        if (model.resident.count(k) == 0) continue;
        model.resident[k].writing = false;
        model.order.push_back(k);
      }
    } else if (op < 8 && !model.order.empty()) {  // pin a resident page and hold it
      const size_t k = model.order[rng() % model.order.size()];
      auto pages = pool->PinPrefix(kNamespace, std::span(&keys[k], 1));
      ASSERT_TRUE(pages.ok());
      ASSERT_EQ(pages->size(), 1u);
      held.emplace_back(k, (*pages)[0]);
      ++model.resident[k].pins;
      model.Touch(k);
    } else if (op == 8 && !held.empty()) {  // unpin one held page
      const size_t i = rng() % held.size();
      ASSERT_OK(pool->Unpin(std::span(&held[i].second, 1)));
      --model.resident[held[i].first].pins;
      held.erase(held.begin() + static_cast<ptrdiff_t>(i));
    } else if (op == 9) {  // evict several in one call
      const int64_t n = 1 + static_cast<int64_t>(rng() % 4);
      int64_t want = 0;
      for (; want < n; ++want) {
        const std::optional<size_t> victim = model.Victim(std::nullopt);
        if (!victim) break;
        model.Remove(*victim);
      }
      auto evicted = pool->Evict(n);
      ASSERT_TRUE(evicted.ok());
      ASSERT_EQ(*evicted, want) << "step " << step;
    }
    if (rng() % 8 == 0) probe(step);  // a probe touches every resident page: not every step
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Maps the segment's file to corrupt it.
class SegmentBytes {
 public:
  explicit SegmentBytes(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd_, 0);
    bytes_ = static_cast<size_t>(::lseek(fd_, 0, SEEK_END));
    base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(base_, MAP_FAILED);
  }
  ~SegmentBytes() {
    ::munmap(base_, bytes_);
    ::close(fd_);
  }
  shm::SegmentHeader* header() { return static_cast<shm::SegmentHeader*>(base_); }
  shm::PageRecord* page(int64_t p) {
    return reinterpret_cast<shm::PageRecord*>(static_cast<std::byte*>(base_) +
                                              header()->page_offset) +
           p;
  }

 private:
  int fd_ = -1;
  size_t bytes_ = 0;
  void* base_ = nullptr;
};

TEST(SharedHostPoolChainTest, CorruptedParentLinksAreReportedAndOldVersionsRefused) {
  ScopedSegmentName name("corrupt");
  auto pool = MustCreate(name.get(), 4);
  ASSERT_NE(pool, nullptr);
  const std::vector<PageKey> a = ChainKeys(10, 3);
  for (size_t i = 0; i < a.size(); ++i) Publish(*pool, a, i, true);
  ASSERT_OK(pool->CheckInvariants());
  auto info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  SegmentBytes seg(info->path);
  auto pages = pool->PinPrefix(kNamespace, a);
  ASSERT_TRUE(pages.ok());
  ASSERT_EQ(pages->size(), 3u);
  ASSERT_OK(pool->Unpin(*pages));
  shm::PageRecord* head = seg.page((*pages)[0]);
  shm::PageRecord* tail = seg.page((*pages)[2]);

  const auto expect_corruption = [&](const char* needle) {
    const Status s = pool->CheckInvariants();
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    auto inspected = pool->Inspect();  // never crashes on a corrupted link
    EXPECT_TRUE(inspected.ok());
  };
  ++head->children;
  expect_corruption("children");
  --head->children;
  tail->has_parent = 7;
  expect_corruption("has_parent");
  tail->has_parent = 1;
  const int32_t next = tail->child_next;
  tail->child_next = 1 << 20;
  expect_corruption("child bucket");
  tail->child_next = next;
  tail->parent[0] ^= 1;  // now names a page that is not resident: stranded, and out of its chain
  expect_corruption("child");
  info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->unreachable_pages, 1);
  tail->parent[0] ^= 1;
  ASSERT_OK(pool->CheckInvariants());

  // A segment of the previous format version is refused, naming what to do.
  seg.header()->version = 1;
  SharedHostPoolAttachOptions options;
  options.register_with_cuda = false;
  auto old = SharedHostPool::Attach(name.get(), options);
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(old.status().message().find("create it again"), std::string::npos)
      << old.status().message();
  seg.header()->version = shm::kSegmentVersion;
}

}  // namespace
}  // namespace kvtier
