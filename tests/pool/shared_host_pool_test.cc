// Tests for SharedHostPool in one process: creating, attaching (geometry checked field by field),
// permissions, destroying, bad configs; publishing, pinning and unpinning with every byte checked
// against the pattern; eviction of unpinned READY pages only, in LRU order; tenants (salts) and
// namespaces never seeing each other's pages; detaching releasing what an attachment held; and a
// randomised model-based test of two attachments against a reference model of the index.
// Processes dying at random points are covered by shared_host_pool_multiprocess_test.cc.
#include "kvtier/shared_host_pool.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pool/shared_host_pool_test_util.h"
#include "support/kv_test_util.h"

namespace kvtier {
namespace {

using testing::ScopedSegmentName;
using testing::SmallSharedGeometry;
using testing::Tenant;

#define ASSERT_OK(expr)                                     \
  do {                                                      \
    const ::kvtier::Status s_ = (expr);                     \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.ToString(); \
  } while (0)

SharedHostPoolConfig SmallConfig(const std::string& name, int64_t num_pages) {
  SharedHostPoolConfig c;
  c.name = name;
  c.geometry = SmallSharedGeometry(num_pages);
  c.max_processes = 8;
  return c;
}

std::unique_ptr<SharedHostPool> MustCreate(const SharedHostPoolConfig& config) {
  auto created = SharedHostPool::Create(config);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  return created.ok() ? std::move(created).value() : nullptr;
}

std::unique_ptr<SharedHostPool> MustAttach(const std::string& name) {
  auto attached = SharedHostPool::Attach(name);
  EXPECT_TRUE(attached.ok()) << attached.status().ToString();
  return attached.ok() ? std::move(attached).value() : nullptr;
}

// The keys of a one-page prompt whose tokens are all `token`.
std::vector<PageKey> OnePageKeys(Token token, int64_t page_size = 4) {
  std::vector<Token> tokens(static_cast<size_t>(page_size), token);
  auto keys = ComputePromptPageKeys(tokens, page_size);
  EXPECT_TRUE(keys.ok());
  return keys.ok() ? *keys : std::vector<PageKey>{};
}

void ExpectError(const Status& s, StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(SharedHostPoolTest, CreateAttachCheckGeometryAndDestroy) {
  ScopedSegmentName name("geom");
  auto created = MustCreate(SmallConfig(name.get(), 16));
  ASSERT_NE(created, nullptr);
  EXPECT_EQ(created->num_pages(), 16);
  EXPECT_EQ(created->region().memory, MemoryKind::kHost);
  EXPECT_NE(created->region().v, nullptr);
  ASSERT_OK(created->region().Validate());

  // Plain attach, and attach with the right geometry.
  auto plain = MustAttach(name.get());
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->geometry().num_layers, 2);
  EXPECT_EQ(plain->geometry().num_slots, 64);
  SharedHostPoolAttachOptions options;
  options.expected_geometry = SmallSharedGeometry(16);
  auto checked = SharedHostPool::Attach(name.get(), options);
  ASSERT_TRUE(checked.ok()) << checked.status().ToString();
  options.expected_geometry->num_slots = 0;  // any capacity
  ASSERT_TRUE(SharedHostPool::Attach(name.get(), options).ok());

  // A mismatch names the field, the segment's value and the expected one.
  const auto expect_mismatch = [&](KvGeometry g, bool mla, const std::string& needle) {
    SharedHostPoolAttachOptions o;
    o.expected_geometry = g;
    o.mla = mla;
    auto attached = SharedHostPool::Attach(name.get(), o);
    ASSERT_FALSE(attached.ok()) << needle;
    ExpectError(attached.status(), StatusCode::kInvalidArgument, needle);
  };
  KvGeometry g = SmallSharedGeometry(16);
  g.num_layers = 3;
  expect_mismatch(g, false, "num_layers is 2 in the segment but 3 was expected");
  g = SmallSharedGeometry(16);
  g.slot_bytes = 64;
  expect_mismatch(g, false, "slot_bytes is 32");
  g = SmallSharedGeometry(16);
  g.layout = KvLayout::kPageHead;
  expect_mismatch(g, false, "layout is page_first");
  g = SmallSharedGeometry(8);
  expect_mismatch(g, false, "num_slots is 64");
  expect_mismatch(SmallSharedGeometry(16), true, "mla is false");

  // Bytes written through one attachment are seen through another (one shared mapping).
  static_cast<std::byte*>(created->region().v)[5] = std::byte{0x5A};
  EXPECT_EQ(static_cast<std::byte*>(plain->region().v)[5], std::byte{0x5A});

  // Creating it again fails; CreateOrAttach attaches.
  auto again = SharedHostPool::Create(SmallConfig(name.get(), 16));
  ASSERT_FALSE(again.ok());
  ExpectError(again.status(), StatusCode::kFailedPrecondition, "exists already");
  auto either = SharedHostPool::CreateOrAttach(SmallConfig(name.get(), 16));
  ASSERT_TRUE(either.ok()) << either.status().ToString();
  auto wrong = SharedHostPool::CreateOrAttach(SmallConfig(name.get(), 8));
  ASSERT_FALSE(wrong.ok());
  ExpectError(wrong.status(), StatusCode::kInvalidArgument, "num_slots");

  ASSERT_OK(SharedHostPool::Destroy(name.get()));
  auto gone = SharedHostPool::Attach(name.get());
  ASSERT_FALSE(gone.ok());
  EXPECT_TRUE(gone.status().IsNotFound()) << gone.status().ToString();
  EXPECT_TRUE(SharedHostPool::Destroy(name.get()).IsNotFound());
  // Attached processes keep working on the unlinked segment.
  auto keys = OnePageKeys(1);
  auto r = plain->Reserve(1, keys);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0].outcome, ReserveOutcome::kReserved);
}

TEST(SharedHostPoolTest, CapacityInBytesRoundsDownToWholePages) {
  ScopedSegmentName name("cap");
  SharedHostPoolConfig c = SmallConfig(name.get(), 0);
  const int64_t page_bytes = 2 * 2 * 4 * 32;  // K+V x layers x page_size x slot_bytes
  c.capacity_bytes = 10 * page_bytes + page_bytes - 1;
  auto pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->num_pages(), 10);
  auto info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->page_bytes, page_bytes);
  EXPECT_EQ(info->empty_pages, 10);
}

TEST(SharedHostPoolTest, SegmentIsOwnerOnlyOrGroupShared) {
  ScopedSegmentName name("perm");
  auto pool = MustCreate(SmallConfig(name.get(), 4));
  ASSERT_NE(pool, nullptr);
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm/kvtier." + name.get()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  pool.reset();
  ASSERT_OK(SharedHostPool::Destroy(name.get()));

  SharedHostPoolConfig c = SmallConfig(name.get(), 4);
  c.group_id = getgid();
  pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
  ASSERT_EQ(stat(("/dev/shm/kvtier." + name.get()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, getgid());
}

TEST(SharedHostPoolTest, HugePagesFallBackWhenUnavailable) {
  ScopedSegmentName name("huge");
  SharedHostPoolConfig c = SmallConfig(name.get(), 4);
  c.huge_pages = true;
  auto pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
  auto info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->huge_pages, pool->huge_pages());
  if (!pool->huge_pages()) {
    EXPECT_EQ(info->path, "/dev/shm/kvtier." + name.get());
  }
  auto keys = OnePageKeys(3);
  ASSERT_TRUE(pool->Reserve(1, keys).ok());
}

TEST(SharedHostPoolTest, BadConfigsNameTheField) {
  ScopedSegmentName name("bad");
  const auto expect_invalid = [&](const SharedHostPoolConfig& c, const std::string& needle) {
    EXPECT_TRUE(c.Validate().IsInvalidArgument()) << needle;
    auto created = SharedHostPool::Create(c);
    ASSERT_FALSE(created.ok()) << needle;
    ExpectError(created.status(), StatusCode::kInvalidArgument, needle);
  };
  SharedHostPoolConfig c = SmallConfig("", 4);
  expect_invalid(c, "must be 1 to 200 characters");
  c.name = "a/b";
  expect_invalid(c, "has the character '/'");
  c.name = ".hidden";
  expect_invalid(c, "must not start with '.'");
  c.name = std::string(201, 'x');
  expect_invalid(c, "1 to 200");
  c = SmallConfig(name.get(), 4);
  c.geometry.slot_bytes = 6;
  expect_invalid(c, "slot_bytes = 6");
  c = SmallConfig(name.get(), 4);
  c.geometry.num_layers = 0;
  expect_invalid(c, "num_layers = 0");
  c = SmallConfig(name.get(), 4);
  c.capacity_bytes = 1 << 20;
  expect_invalid(c, "exactly one of capacity_bytes");
  c = SmallConfig(name.get(), 0);
  expect_invalid(c, "exactly one of capacity_bytes");
  c.capacity_bytes = 100;
  expect_invalid(c, "less than one page");
  c = SmallConfig(name.get(), 4);
  c.max_processes = 0;
  expect_invalid(c, "max_processes = 0");
  c = SmallConfig(name.get(), 4);
  c.geometry.num_slots = 6;
  expect_invalid(c, "num_slots = 6");
  EXPECT_TRUE(SharedHostPool::Attach("no/such").status().IsInvalidArgument());
  EXPECT_TRUE(SharedHostPool::Attach(name.get()).status().IsNotFound());
}

TEST(SharedHostPoolTest, PublishPinUnpinByteExact) {
  ScopedSegmentName name("pub");
  auto writer = MustCreate(SmallConfig(name.get(), 16));
  auto reader = MustAttach(name.get());
  ASSERT_NE(reader, nullptr);
  const Tenant tenant{"", 42};
  std::vector<Token> tokens = testing::WorkloadPrompt(1, 0, 1, 6, 4);
  tokens.resize(24);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<Token>(i * 7 + 1);
  auto prompt = testing::PagesOf(tokens, 4, tenant);
  ASSERT_TRUE(prompt.ok());
  ASSERT_EQ(prompt->keys.size(), 6u);

  // Nothing published: an empty prefix.
  auto none = reader->PinPrefix(tenant.namespace_hash, prompt->keys);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  // Reserve 4 of the 6 pages: WRITING pages are invisible to readers and busy for writers.
  auto first =
      writer->Reserve(tenant.namespace_hash, std::span<const PageKey>(prompt->keys).first(4));
  ASSERT_TRUE(first.ok());
  std::vector<int64_t> pages;
  for (const PageReservation& r : *first) {
    ASSERT_EQ(r.outcome, ReserveOutcome::kReserved);
    pages.push_back(r.page);
  }
  auto busy = reader->Reserve(tenant.namespace_hash, prompt->keys);
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ((*busy)[0].outcome, ReserveOutcome::kBeingWritten);
  EXPECT_EQ((*busy)[3].outcome, ReserveOutcome::kBeingWritten);
  EXPECT_EQ((*busy)[4].outcome, ReserveOutcome::kReserved);
  EXPECT_EQ((*busy)[5].outcome, ReserveOutcome::kReserved);
  ASSERT_OK(reader->Abort(std::vector<int64_t>{(*busy)[4].page, (*busy)[5].page}));
  EXPECT_TRUE(reader->PinPrefix(tenant.namespace_hash, prompt->keys)->empty());
  ExpectError(reader->Commit(pages), StatusCode::kFailedPrecondition, "not WRITING for this");
  ExpectError(writer->Commit(std::vector<int64_t>{16}), StatusCode::kInvalidArgument,
              "pages[0] = 16 is not in [0, 16)");

  // Write the bytes (the pattern), commit, and read them through the other attachment.
  for (size_t k = 0; k < pages.size(); ++k) {
    const int64_t page = pages[k];
    ASSERT_OK(FillKvPattern(writer->region(), writer->PageSlots({&page, 1}),
                            std::span<const uint64_t>(prompt->hashes).subspan(k * 4, 4)));
  }
  ASSERT_OK(writer->Commit(pages));
  ExpectError(writer->Commit(pages), StatusCode::kFailedPrecondition, "not WRITING");
  auto pinned = reader->PinPrefix(tenant.namespace_hash, prompt->keys);
  ASSERT_TRUE(pinned.ok());
  ASSERT_EQ(*pinned, pages);
  for (size_t k = 0; k < pages.size(); ++k) {
    ASSERT_OK(testing::VerifyPage(*reader, (*pinned)[k], *prompt, k));
  }
  auto info = writer->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->ready_pages, 4);
  EXPECT_EQ(info->pinned_pages, 4);
  ASSERT_EQ(info->processes.size(), 2u);
  for (const auto& p : info->processes) {
    EXPECT_EQ(p.pid, getpid());
    EXPECT_TRUE(p.alive);
    EXPECT_EQ(p.pinned_refs, p.is_caller ? 0 : 4);
  }
  // Unpin errors change nothing; a correct unpin releases.
  ExpectError(writer->Unpin(*pinned), StatusCode::kFailedPrecondition, "holds 0 reference");
  std::vector<int64_t> twice = {(*pinned)[0], (*pinned)[0]};
  ExpectError(reader->Unpin(twice), StatusCode::kFailedPrecondition, "unpinned 2 time(s)");
  ASSERT_OK(reader->Unpin(*pinned));
  ASSERT_OK(writer->CheckInvariants());

  // Publishing the whole prompt writes only the 2 missing pages.
  testing::PublishStats stats;
  ASSERT_OK(testing::Publish(*reader, tenant, *prompt, &stats));
  EXPECT_EQ(stats.already_ready, 4);
  EXPECT_EQ(stats.reserved, 2);
  auto hit = testing::CheckPrefix(*writer, tenant, *prompt);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(*hit, 6);
  ASSERT_OK(writer->CheckInvariants());
}

TEST(SharedHostPoolTest, EvictsOnlyUnpinnedReadyPagesInLruOrder) {
  ScopedSegmentName name("lru");
  auto pool = MustCreate(SmallConfig(name.get(), 4));
  ASSERT_NE(pool, nullptr);
  const uint64_t ns = 9;
  std::map<char, std::vector<PageKey>> key;
  for (char c : std::string("ABCDEFGH")) key[c] = OnePageKeys(static_cast<Token>(c));
  const auto publish = [&](char c) {
    auto r = pool->Reserve(ns, key[c]);
    EXPECT_TRUE(r.ok());
    if ((*r)[0].outcome == ReserveOutcome::kReserved) {
      EXPECT_TRUE(pool->Commit(std::vector<int64_t>{(*r)[0].page}).ok());
    }
    return (*r)[0].outcome;
  };
  const auto cached = [&](char c) {
    auto p = pool->PinPrefix(ns, key[c]);
    EXPECT_TRUE(p.ok());
    const bool hit = !p->empty();
    EXPECT_TRUE(pool->Unpin(*p).ok());
    return hit;
  };
  for (char c : std::string("ABCD")) ASSERT_EQ(publish(c), ReserveOutcome::kReserved);
  // Use order now A B C D; touch A, pin B: LRU order C D A, B pinned.
  ASSERT_TRUE(cached('A'));
  auto pinned_b = pool->PinPrefix(ns, key['B']);
  ASSERT_TRUE(pinned_b.ok());
  ASSERT_EQ(pinned_b->size(), 1u);
  ASSERT_EQ(publish('E'), ReserveOutcome::kReserved);  // evicts C
  EXPECT_FALSE(cached('C'));
  ASSERT_EQ(publish('F'), ReserveOutcome::kReserved);  // evicts D
  EXPECT_FALSE(cached('D'));
  EXPECT_TRUE(cached('B'));
  // Order now A E F, B pinned. A WRITING page is never evicted either.
  auto writing = pool->Reserve(ns, key['G']);  // evicts A
  ASSERT_TRUE(writing.ok());
  ASSERT_EQ((*writing)[0].outcome, ReserveOutcome::kReserved);
  EXPECT_FALSE(cached('A'));
  auto evicted = pool->Evict(10);  // E and F; not B (pinned), not G (WRITING)
  ASSERT_TRUE(evicted.ok());
  EXPECT_EQ(*evicted, 2);
  EXPECT_TRUE(cached('B'));
  EXPECT_EQ(pool->Evict(10).value(), 0);
  // Pool: B pinned, G writing, 2 empty. Fill the empties, then there is no space.
  ASSERT_EQ(publish('E'), ReserveOutcome::kReserved);
  ASSERT_EQ(publish('F'), ReserveOutcome::kReserved);
  ASSERT_EQ(pool->Reserve(ns, key['C']).value()[0].outcome, ReserveOutcome::kReserved);  // E out
  ASSERT_EQ(pool->Reserve(ns, key['D']).value()[0].outcome, ReserveOutcome::kReserved);  // F out
  ASSERT_EQ(publish('H'), ReserveOutcome::kNoSpace);
  auto info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->writing_pages, 3);
  EXPECT_EQ(info->ready_pages, 1);
  EXPECT_EQ(info->evictions, 7);
  ASSERT_OK(pool->Unpin(*pinned_b));
  ASSERT_EQ(publish('H'), ReserveOutcome::kReserved);  // B out
  EXPECT_FALSE(cached('B'));
  EXPECT_TRUE(pool->Evict(-1).status().IsInvalidArgument());
  ASSERT_OK(pool->CheckInvariants());
}

TEST(SharedHostPoolTest, TenantsAndNamespacesNeverSeeEachOthersPages) {
  ScopedSegmentName name("tenant");
  auto pool = MustCreate(SmallConfig(name.get(), 32));
  auto other = MustAttach(name.get());
  ASSERT_NE(other, nullptr);
  std::vector<Token> tokens(16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<Token>(100 + i);
  // Tenant salts: same tokens, same namespace, different salts -> different keys.
  const Tenant a{"", 7}, b{"tenant-b", 7};
  // Namespaces: same tokens and salt, different deployment -> same keys, different namespace.
  const Tenant c{"", 8};
  auto pa = testing::PagesOf(tokens, 4, a), pb = testing::PagesOf(tokens, 4, b),
       pc = testing::PagesOf(tokens, 4, c);
  ASSERT_TRUE(pa.ok() && pb.ok() && pc.ok());
  EXPECT_EQ(pa->keys, pc->keys);
  for (size_t k = 0; k < pa->keys.size(); ++k) EXPECT_NE(pa->keys[k], pb->keys[k]);

  testing::PublishStats stats;
  ASSERT_OK(testing::Publish(*pool, a, *pa, &stats));
  EXPECT_EQ(stats.reserved, 4);
  EXPECT_EQ(testing::CheckPrefix(*other, a, *pa).value(), 4);
  EXPECT_EQ(testing::CheckPrefix(*other, b, *pb).value(), 0);
  EXPECT_EQ(testing::CheckPrefix(*other, c, *pc).value(), 0);
  // Each publishes its own pages (nothing "already ready" from the other tenant), and each reads
  // back its own bytes.
  for (const auto& [tenant, prompt] : {std::pair(b, &*pb), std::pair(c, &*pc)}) {
    testing::PublishStats s;
    ASSERT_OK(testing::Publish(*other, tenant, *prompt, &s));
    EXPECT_EQ(s.reserved, 4);
    EXPECT_EQ(s.already_ready, 0);
  }
  std::vector<int64_t> pages_a, pages_b, pages_c;
  EXPECT_EQ(testing::CheckPrefix(*pool, a, *pa, &pages_a).value(), 4);
  EXPECT_EQ(testing::CheckPrefix(*pool, b, *pb, &pages_b).value(), 4);
  EXPECT_EQ(testing::CheckPrefix(*pool, c, *pc, &pages_c).value(), 4);
  std::vector<int64_t> all = pages_a;
  all.insert(all.end(), pages_b.begin(), pages_b.end());
  all.insert(all.end(), pages_c.begin(), pages_c.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::unique(all.begin(), all.end()), all.end()) << "tenants share a host page";
  ASSERT_OK(pool->CheckInvariants());
}

TEST(SharedHostPoolTest, TooManyPinsAreRefusedWholly) {
  ScopedSegmentName name("pins");
  auto pool = MustCreate(SmallConfig(name.get(), 4));
  ASSERT_NE(pool, nullptr);
  auto keys = OnePageKeys(9);
  auto r = pool->Reserve(1, keys);
  ASSERT_OK(pool->Commit(std::vector<int64_t>{(*r)[0].page}));
  // One call naming the page 65,536 times: the last pin would overflow, so none is taken.
  std::vector<PageKey> many(65536, keys[0]);
  auto refused = pool->PinPrefix(1, many);
  ASSERT_FALSE(refused.ok());
  ExpectError(refused.status(), StatusCode::kFailedPrecondition, "more than 65535 references");
  auto info = pool->Inspect();
  EXPECT_EQ(info->pinned_pages, 0);
  many.resize(65535);
  auto pinned = pool->PinPrefix(1, many);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  EXPECT_EQ(pinned->size(), 65535u);
  EXPECT_EQ(pool->Evict(1).value(), 0);  // pinned
  ASSERT_OK(pool->Unpin(*pinned));
  ASSERT_OK(pool->CheckInvariants());
}

TEST(SharedHostPoolTest, DetachReleasesPinsAndWritingPages) {
  ScopedSegmentName name("detach");
  auto pool = MustCreate(SmallConfig(name.get(), 8));
  ASSERT_NE(pool, nullptr);
  auto keys = OnePageKeys(5);
  auto r = pool->Reserve(1, keys);
  ASSERT_OK(pool->Commit(std::vector<int64_t>{(*r)[0].page}));
  {
    auto other = MustAttach(name.get());
    ASSERT_NE(other, nullptr);
    ASSERT_EQ(other->PinPrefix(1, keys)->size(), 1u);
    ASSERT_EQ(other->Reserve(1, OnePageKeys(6)).value()[0].outcome, ReserveOutcome::kReserved);
    auto info = pool->Inspect();
    EXPECT_EQ(info->pinned_pages, 1);
    EXPECT_EQ(info->writing_pages, 1);
  }
  auto info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->pinned_pages, 0);
  EXPECT_EQ(info->writing_pages, 0);
  EXPECT_EQ(info->ready_pages, 1);
  EXPECT_EQ(info->processes.size(), 1u);
  EXPECT_EQ(info->reaped_processes, 0);  // a clean detach is not a reaped death
  ASSERT_OK(pool->CheckInvariants());
}

// Reference model of the index: what each key is, who holds it, and the LRU clock.
struct ModelPage {
  bool ready = false;
  int writer = -1;
  int refs[2] = {0, 0};
  uint64_t last_use = 0;
  int64_t page = -1;
};

TEST(SharedHostPoolTest, RandomOperationsMatchAReferenceModel) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ScopedSegmentName name("model");
  constexpr int64_t kPages = 12;
  std::unique_ptr<SharedHostPool> att[2];
  att[0] = MustCreate(SmallConfig(name.get(), kPages));
  att[1] = MustAttach(name.get());
  ASSERT_NE(att[1], nullptr);
  const std::vector<Tenant> tenants = testing::WorkloadTenants();

  std::map<std::pair<uint64_t, PageKey>, ModelPage> model;
  uint64_t clock = 0;
  std::vector<int64_t> pinned[2];   // pages each attachment holds pins on (with repeats)
  std::vector<int64_t> writing[2];  // pages each attachment has WRITING
  std::map<int64_t, std::pair<uint64_t, PageKey>> page_key;  // host page -> model key

  const auto evict_lru = [&]() -> bool {
    auto victim = model.end();
    for (auto it = model.begin(); it != model.end(); ++it) {
      const ModelPage& m = it->second;
      if (m.ready && m.refs[0] == 0 && m.refs[1] == 0 &&
          (victim == model.end() || m.last_use < victim->second.last_use)) {
        victim = it;
      }
    }
    if (victim == model.end()) return false;
    model.erase(victim);
    return true;
  };

  std::map<ReserveOutcome, int64_t> outcomes;  // every outcome must have happened
  int64_t hits = 0;
  for (int op = 0; op < 3000; ++op) {
    const int a = static_cast<int>(rng() % 2);
    SharedHostPool& pool = *att[a];
    const Tenant& tenant = tenants[rng() % tenants.size()];
    const std::vector<Token> tokens =
        testing::WorkloadPrompt(seed, static_cast<int64_t>(rng() % 40), 3, 4, 4);
    auto prompt = testing::PagesOf(tokens, 4, tenant);
    ASSERT_TRUE(prompt.ok());
    const int kind = static_cast<int>(rng() % 6);
    SCOPED_TRACE("op " + std::to_string(op) + " kind " + std::to_string(kind));
    if (kind == 0 || kind == 1) {  // reserve
      auto got = pool.Reserve(tenant.namespace_hash, prompt->keys);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      for (size_t k = 0; k < prompt->keys.size(); ++k) {
        const auto mk = std::pair(tenant.namespace_hash, prompt->keys[k]);
        ReserveOutcome want;
        auto it = model.find(mk);
        if (it != model.end()) {
          want = it->second.ready ? ReserveOutcome::kAlreadyReady : ReserveOutcome::kBeingWritten;
        } else if (static_cast<int64_t>(model.size()) < kPages || evict_lru()) {
          want = ReserveOutcome::kReserved;
          ModelPage m;
          m.writer = a;
          m.last_use = ++clock;
          m.page = (*got)[k].page;
          model[mk] = m;
        } else {
          want = ReserveOutcome::kNoSpace;
        }
        ASSERT_EQ((*got)[k].outcome, want) << "key " << k;
        ++outcomes[want];
        if (want == ReserveOutcome::kAlreadyReady) {
          ASSERT_EQ((*got)[k].page, it->second.page);
        }
        if (want == ReserveOutcome::kReserved) {
          const int64_t page = (*got)[k].page;
          writing[a].push_back(page);
          page_key[page] = mk;
          ASSERT_OK(FillKvPattern(pool.region(), pool.PageSlots({&page, 1}),
                                  std::span<const uint64_t>(prompt->hashes).subspan(k * 4, 4)));
        }
      }
    } else if (kind == 2 && !writing[a].empty()) {  // commit or abort some WRITING pages
      const size_t n = 1 + rng() % writing[a].size();
      std::vector<int64_t> pages(writing[a].begin(), writing[a].begin() + n);
      writing[a].erase(writing[a].begin(), writing[a].begin() + n);
      const bool commit = rng() % 4 != 0;
      ASSERT_OK(commit ? pool.Commit(pages) : pool.Abort(pages));
      for (int64_t p : pages) {
        auto it = model.find(page_key[p]);
        ASSERT_NE(it, model.end());
        if (commit) {
          it->second.ready = true;
          it->second.writer = -1;
          it->second.last_use = ++clock;
        } else {
          model.erase(it);
        }
      }
    } else if (kind == 3) {  // pin a prefix and check its bytes
      auto got = pool.PinPrefix(tenant.namespace_hash, prompt->keys);
      ASSERT_TRUE(got.ok());
      std::vector<int64_t> want;
      for (const PageKey& key : prompt->keys) {
        auto it = model.find(std::pair(tenant.namespace_hash, key));
        if (it == model.end() || !it->second.ready) break;
        ++it->second.refs[a];
        it->second.last_use = ++clock;
        want.push_back(it->second.page);
      }
      ASSERT_EQ(*got, want);
      hits += static_cast<int64_t>(want.size());
      for (size_t k = 0; k < got->size(); ++k) {
        ASSERT_OK(testing::VerifyPage(pool, (*got)[k], *prompt, k));
      }
      pinned[a].insert(pinned[a].end(), got->begin(), got->end());
    } else if (kind == 4 && !pinned[a].empty()) {  // unpin some
      std::shuffle(pinned[a].begin(), pinned[a].end(), rng);
      const size_t n = 1 + rng() % pinned[a].size();
      std::vector<int64_t> pages(pinned[a].begin(), pinned[a].begin() + n);
      pinned[a].erase(pinned[a].begin(), pinned[a].begin() + n);
      ASSERT_OK(pool.Unpin(pages));
      for (int64_t p : pages) --model[page_key[p]].refs[a];
    } else if (kind == 5 && rng() % 4 == 0) {  // evict a few
      const int64_t n = static_cast<int64_t>(rng() % 3);
      int64_t want = 0;
      while (want < n && evict_lru()) ++want;
      auto got = pool.Evict(n);
      ASSERT_TRUE(got.ok());
      ASSERT_EQ(*got, want);
    }
    ASSERT_OK(pool.CheckInvariants());
    auto info = pool.Inspect();
    ASSERT_TRUE(info.ok());
    int64_t ready = 0, writes = 0;
    for (const auto& [k, m] : model) (m.ready ? ready : writes) += 1;
    ASSERT_EQ(info->ready_pages, ready);
    ASSERT_EQ(info->writing_pages, writes);
    ASSERT_EQ(info->empty_pages, kPages - ready - writes);
  }
  for (ReserveOutcome o : {ReserveOutcome::kReserved, ReserveOutcome::kAlreadyReady,
                           ReserveOutcome::kBeingWritten, ReserveOutcome::kNoSpace}) {
    EXPECT_GT(outcomes[o], 0) << ReserveOutcomeName(o);
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(att[0]->Inspect()->evictions, 0);
}

}  // namespace
}  // namespace kvtier
