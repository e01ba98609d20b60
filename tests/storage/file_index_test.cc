// The file store's index on its own: LRU order, eviction down to the capacity (never the page
// just written), strictly increasing stamps, the restart load in stamp order, pages another
// process wrote, and the restart scan of a real directory (page files indexed; other names,
// symlinks, wrong shards and a symlinked shard left alone; stale temporary files removed) with the
// parent each page's header names, which the load turns back into chains evicted tail first.
// Touches while another thread holds the index (removing a victim's file) are queued, not waited
// for, and applied before the next eviction decision, each with its stamp then.
#include "storage/file/file_index.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "storage/file/file_io.h"
#include "storage/file/file_page_io.h"
#include "storage/page_format.h"

namespace kvtier::storage {
namespace {

namespace fs = std::filesystem;

PageKey KeyOf(int i) {
  std::vector<int32_t> tokens = {i, i + 1, i + 2, i + 3};
  return ComputePromptPageKeys(tokens, 4)->front();
}

struct Recorder {
  std::vector<PageKey> removed;
  std::function<void(const PageKey&)> fn() {
    return [this](const PageKey& k) { removed.push_back(k); };
  }
};

TEST(FileIndexTest, PutEvictsLeastRecentlyUsedButNeverThePageJustWritten) {
  Recorder r;
  FileIndex index(300, r.fn());
  for (int i = 0; i < 3; ++i) index.Put(KeyOf(i), 100, index.NextStamp());
  EXPECT_EQ(index.bytes(), 300);
  EXPECT_EQ(index.LruOrder(), (std::vector<PageKey>{KeyOf(2), KeyOf(1), KeyOf(0)}));
  index.Touch(KeyOf(0), 100);  // 0 becomes the most recent
  index.Put(KeyOf(3), 100, index.NextStamp());
  EXPECT_EQ(r.removed, std::vector<PageKey>{KeyOf(1)});
  EXPECT_EQ(index.LruOrder(), (std::vector<PageKey>{KeyOf(3), KeyOf(0), KeyOf(2)}));
  // A page larger than what is left evicts all others but itself.
  index.Put(KeyOf(4), 250, index.NextStamp());
  EXPECT_EQ(index.LruOrder(), std::vector<PageKey>{KeyOf(4)});
  EXPECT_EQ(index.bytes(), 250);
  EXPECT_EQ(index.evicted(), 4);
  EXPECT_EQ(index.pages(), 1);
  // Replacing a page counts its bytes once.
  index.Put(KeyOf(4), 250, index.NextStamp());
  EXPECT_EQ(index.bytes(), 250);
  index.Erase(KeyOf(4));
  index.Erase(KeyOf(4));  // unknown: no effect
  EXPECT_EQ(index.bytes(), 0);
  EXPECT_FALSE(index.Contains(KeyOf(4)));
}

TEST(FileIndexTest, StampsIncreaseStrictlyPastEveryLoadedStamp) {
  FileIndex index(1 << 20, nullptr);
  const int64_t far_future = int64_t{4'000'000'000} * 1'000'000'000;  // year 2096
  index.Load({{KeyOf(0), 10, far_future}});
  int64_t last = far_future;
  for (int i = 0; i < 1000; ++i) {
    const int64_t s = i % 2 ? index.NextStamp() : index.Touch(KeyOf(0), 10).value();
    ASSERT_GT(s, last);
    last = s;
  }
}

TEST(FileIndexTest, LoadOrdersByStampAndEvictsDownToTheCapacity) {
  Recorder r;
  FileIndex index(250, r.fn());
  index.Load({{KeyOf(0), 100, 30}, {KeyOf(1), 100, 10}, {KeyOf(2), 100, 20}});
  EXPECT_EQ(r.removed, std::vector<PageKey>{KeyOf(1)});  // the oldest stamp
  EXPECT_EQ(index.LruOrder(), (std::vector<PageKey>{KeyOf(0), KeyOf(2)}));
  // A page another process wrote is the least recently used, and does not evict.
  index.AddFound(KeyOf(5), 100, 5);
  EXPECT_EQ(index.LruOrder(), (std::vector<PageKey>{KeyOf(0), KeyOf(2), KeyOf(5)}));
  EXPECT_EQ(index.bytes(), 300);
  index.AddFound(KeyOf(0), 100, 1);  // already known: unchanged
  EXPECT_EQ(index.LruOrder().front(), KeyOf(0));
  index.Put(KeyOf(6), 100, index.NextStamp());
  EXPECT_EQ(r.removed, (std::vector<PageKey>{KeyOf(1), KeyOf(5), KeyOf(2)}));
}

// A page another process wrote, found by a lookup with the parent its header names, is evicted
// after its children: the child 1 is found first, then its parent 0 (so 0 is the older: a plain
// LRU would take 0, stranding 1); overfilled, the index takes 1 then 0. Touch records the parent
// of a page new to the index (a Get found it) and keeps a known page's when given none.
TEST(FileIndexTest, FoundPagesKeepTheirParents) {
  Recorder r;
  FileIndex index(250, r.fn());
  EXPECT_TRUE(index.AddFound(KeyOf(1), 100, 2, KeyOf(0)));
  EXPECT_TRUE(index.AddFound(KeyOf(0), 100, 1));
  EXPECT_FALSE(index.AddFound(KeyOf(0), 100, 1, KeyOf(9)));  // known: unchanged
  EXPECT_EQ(index.ParentOf(KeyOf(1)), KeyOf(0));
  EXPECT_EQ(index.ParentOf(KeyOf(0)), std::nullopt);
  EXPECT_EQ(index.LruOrder(), (std::vector<PageKey>{KeyOf(1), KeyOf(0)}));
  index.Put(KeyOf(2), 100, index.NextStamp());
  EXPECT_EQ(r.removed, std::vector<PageKey>{KeyOf(1)});
  index.Put(KeyOf(3), 100, index.NextStamp());
  EXPECT_EQ(r.removed, (std::vector<PageKey>{KeyOf(1), KeyOf(0)}));

  index.Touch(KeyOf(4), 10, KeyOf(3));  // new here: the parent its header named
  EXPECT_EQ(index.ParentOf(KeyOf(4)), KeyOf(3));
  index.Touch(KeyOf(4), 10);  // known: keeps it
  EXPECT_EQ(index.ParentOf(KeyOf(4)), KeyOf(3));
}

class ScanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = "/tmp/kvtier_scan_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Touch(const std::string& rel, int64_t mtime_s, size_t bytes = 5) {
    fs::create_directories(fs::path(dir_ + "/" + rel).parent_path());
    std::ofstream(dir_ + "/" + rel) << std::string(bytes, 'x');
    const timespec t[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(mtime_s), 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, (dir_ + "/" + rel).c_str(), t, 0), 0);
  }
  std::string dir_;
};

TEST_F(ScanTest, IndexesPageFilesOnlyAndRemovesStaleTemporaries) {
  const std::string a = KeyOf(1).Hex(), b = KeyOf(2).Hex(), c = KeyOf(3).Hex();
  Touch(a.substr(0, 2) + "/" + a, 100, 7);
  Touch(b.substr(0, 2) + "/" + b, 50, 9);
  // Another key's name in the wrong shard, an odd name: not indexed, left alone.
  const std::string wrong_shard = (c.substr(0, 2) == "00" ? "01/" : "00/") + c;
  Touch(wrong_shard, 10);
  Touch(a.substr(0, 2) + "/notes.txt", 10);
  // A symlink named as a page, and a shard directory that is a symlink: not indexed.
  fs::create_directories(dir_ + "/outside");
  Touch("outside/" + c, 10);
  fs::create_symlink(dir_ + "/outside/" + c, dir_ + "/" + b.substr(0, 2) + "/" + c);
  const std::string d = KeyOf(4).Hex();
  if (!fs::exists(dir_ + "/" + d.substr(0, 2))) {
    fs::create_symlink(dir_ + "/outside", dir_ + "/" + d.substr(0, 2));
    Touch("outside/" + d, 10);
  }
  // A temporary file of a process that is gone (pid 2^22 + 1 is beyond pid_max's default and
  // its usual ceiling), and one of this live process.
  const std::string dead_tmp = a.substr(0, 2) + "/.tmp.4194305.0." + a;
  const std::string live_tmp = a.substr(0, 2) + "/.tmp." + std::to_string(::getpid()) + ".1." + a;
  Touch(dead_tmp, 10);
  Touch(live_tmp, 10);

  Fd ns(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY));
  auto found = ScanPages(ns.get(), /*namespace_hash=*/1);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  std::sort(found->begin(), found->end(),
            [](const auto& x, const auto& y) { return x.stamp < y.stamp; });
  ASSERT_EQ(found->size(), 2u);
  EXPECT_EQ((*found)[0].key, KeyOf(2));
  EXPECT_EQ((*found)[0].bytes, 9);
  EXPECT_EQ((*found)[0].stamp, int64_t{50} * 1'000'000'000);
  EXPECT_EQ((*found)[1].key, KeyOf(1));
  EXPECT_FALSE(fs::exists(dir_ + "/" + dead_tmp));
  EXPECT_TRUE(fs::exists(dir_ + "/" + live_tmp));
  EXPECT_TRUE(fs::exists(dir_ + "/" + wrong_shard));
  EXPECT_TRUE(fs::exists(dir_ + "/outside/" + c));
  for (const auto& f : *found) {  // junk bytes: no header, no parent
    EXPECT_EQ(f.version, 0);
    EXPECT_FALSE(f.parent);
  }
}

// The scan reads each page's header: the parent a version-2 header names, none for one naming
// none or for version 1, and none (version 0) for a header of another namespace.
TEST_F(ScanTest, ReadsTheParentEachHeaderNames) {
  constexpr uint64_t kNs = 77;
  constexpr int64_t kPage = 1000;
  const PageFileIo io(kNs, static_cast<int64_t>(kFilePayloadOffset) + kPage, /*direct=*/false);
  std::vector<std::byte> payload(kPage, std::byte{0x5A});
  auto write = [&](const PageKey& key, const std::optional<PageKey>& parent) {
    const std::string hex = key.Hex();
    fs::create_directories(dir_ + "/" + hex.substr(0, 2));
    Fd fd(::open((dir_ + "/" + hex.substr(0, 2) + "/" + hex).c_str(),
                 O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(io.WritePage(fd.get(), key, PageBuffer::Of(payload), parent));
  };
  write(KeyOf(1), std::nullopt);
  write(KeyOf(2), KeyOf(1));
  write(KeyOf(3), KeyOf(2));
  // Version 1 over page 4's header block.
  write(KeyOf(4), std::nullopt);
  PageHeader v1 = NewPageHeader(kNs, KeyOf(4), kPage);
  std::vector<std::byte> block(kFilePayloadOffset);
  EncodePageHeader(v1, block);
  {
    const std::string hex = KeyOf(4).Hex();
    Fd fd(::open((dir_ + "/" + hex.substr(0, 2) + "/" + hex).c_str(), O_WRONLY | O_CLOEXEC));
    ASSERT_TRUE(WriteFull(fd.get(), block.data(), block.size(), 0));
  }
  Fd ns(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY));
  auto found = ScanPages(ns.get(), kNs);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  std::map<PageKey, FileIndex::Found> by_key;
  for (const auto& f : *found) by_key[f.key] = f;
  ASSERT_EQ(by_key.size(), 4u);
  EXPECT_EQ(by_key[KeyOf(1)].parent, std::nullopt);
  EXPECT_EQ(by_key[KeyOf(1)].version, kPageFormatV2);
  EXPECT_EQ(by_key[KeyOf(2)].parent, KeyOf(1));
  EXPECT_EQ(by_key[KeyOf(3)].parent, KeyOf(2));
  EXPECT_EQ(by_key[KeyOf(3)].version, kPageFormatV2);
  EXPECT_EQ(by_key[KeyOf(4)].parent, std::nullopt);
  EXPECT_EQ(by_key[KeyOf(4)].version, kPageFormatV1);
  // Another namespace's scan of the same files: no header checks out.
  auto other = ScanPages(ns.get(), kNs + 1);
  ASSERT_TRUE(other.ok());
  for (const auto& f : *other) {
    EXPECT_EQ(f.version, 0);
    EXPECT_FALSE(f.parent);
  }
}

// Loaded with their parents, pages are evicted tail first even where the stamps say the head is
// older (a prefix read touches its head first): the chain 0 <- 1 <- 2, stamps ascending, loses 2
// then 1 (a plain LRU would take 0, stranding 1 and 2); the root 3 with the oldest stamp of all
// goes first.
TEST(FileIndexTest, LoadRebuildsChainsAndEvictsTheirTailsFirst) {
  Recorder r;
  FileIndex index(250, r.fn());
  index.Load({{KeyOf(0), 100, 10},
              {KeyOf(2), 100, 30, KeyOf(1)},
              {KeyOf(3), 100, 5},
              {KeyOf(1), 100, 20, KeyOf(0)}});
  EXPECT_EQ(r.removed, (std::vector<PageKey>{KeyOf(3), KeyOf(2)}));
  EXPECT_EQ(index.ParentOf(KeyOf(1)), KeyOf(0));
  index.Put(KeyOf(9), 100, index.NextStamp());
  EXPECT_EQ(r.removed, (std::vector<PageKey>{KeyOf(3), KeyOf(2), KeyOf(1)}));
}

// A writer holding the index while it removes a victim's file: `remove` blocks until released,
// after signalling that it entered; `inside` says it is still blocked. (The 60 s bound is a hang
// guard for a broken build: a passing test releases it, so nothing depends on the machine's
// speed; a bound of 1 s could run out on a loaded machine before the test's touches.)
struct BlockingRemover {
  std::vector<PageKey> removed;  // under the index's mutex
  bool block = false;
  std::atomic<bool> inside{false};
  std::promise<void> entered;
  std::promise<void> release;
  std::function<void(const PageKey&)> fn() {
    return [this](const PageKey& k) {
      removed.push_back(k);
      if (!block) return;
      block = false;
      inside = true;
      entered.set_value();
      release.get_future().wait_for(std::chrono::seconds(60));
      inside = false;
    };
  }
};

struct TouchLog {
  std::mutex mu;
  std::vector<std::tuple<PageKey, int64_t, int64_t>> calls;  // key, stamp, mtime
  FileIndex::OnTouched fn() {
    return [this](const PageKey& k, int64_t stamp, int64_t mtime) {
      std::lock_guard<std::mutex> lock(mu);
      calls.emplace_back(k, stamp, mtime);
    };
  }
};

// Puts 0, 1, 2 (100 bytes each, capacity 300), then 3 on another thread, whose eviction of 0
// holds the index inside `remove`; returns that thread once `remove` has been entered.
std::thread PutWhileRemoveBlocks(FileIndex& index, BlockingRemover& r, int64_t* put3_stamp) {
  for (int i = 0; i < 3; ++i) index.Put(KeyOf(i), 100, index.NextStamp());
  *put3_stamp = index.NextStamp();
  r.block = true;
  std::thread writer([&index, stamp = *put3_stamp] { index.Put(KeyOf(3), 100, stamp); });
  EXPECT_EQ(r.entered.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  return writer;
}

TEST(FileIndexTest, TouchBehindAWriterIsQueuedNotWaitedForAndAppliedBeforeTheNextEviction) {
  BlockingRemover r;
  TouchLog log;
  FileIndex index(300, r.fn(), nullptr, log.fn());
  int64_t put3 = 0;
  std::thread writer = PutWhileRemoveBlocks(index, r, &put3);
  // The writer holds the index until released: these touches return, queued, while it still
  // does (a touch that waited for it would return only after the remover's hang guard).
  EXPECT_EQ(index.Touch(KeyOf(1), 100, std::nullopt, 77), std::nullopt);
  EXPECT_EQ(index.Touch(KeyOf(0), 100), std::nullopt);  // the victim being removed
  EXPECT_EQ(index.Touch(KeyOf(9), 100), std::nullopt);  // unknown here (another process's)
  EXPECT_TRUE(r.inside.load()) << "a touch waited for the writer";
  r.release.set_value();
  writer.join();
  EXPECT_EQ(r.removed, std::vector<PageKey>{KeyOf(0)});
  EXPECT_TRUE(log.calls.empty());  // nothing applied yet
  // A touch that gets the index applies the queued ones first, in order: 1 (with the mtime its
  // read saw), then its own; 0 (evicted meanwhile) and 9 (unknown) are skipped, not brought back.
  const std::optional<int64_t> s3 = index.Touch(KeyOf(3), 100, std::nullopt, 5);
  ASSERT_TRUE(s3.has_value());
  ASSERT_EQ(log.calls.size(), 2u);
  EXPECT_EQ(std::get<0>(log.calls[0]), KeyOf(1));
  EXPECT_GT(std::get<1>(log.calls[0]), put3);
  EXPECT_EQ(std::get<2>(log.calls[0]), 77);
  EXPECT_EQ(std::get<0>(log.calls[1]), KeyOf(3));
  EXPECT_EQ(std::get<1>(log.calls[1]), *s3);
  EXPECT_GT(*s3, std::get<1>(log.calls[0]));
  EXPECT_EQ(std::get<2>(log.calls[1]), 5);
  EXPECT_FALSE(index.Contains(KeyOf(0)));
  EXPECT_FALSE(index.Contains(KeyOf(9)));
  EXPECT_EQ(index.pages(), 3);
  // 1's hit counts: the next eviction takes 2, not 1 (which it would without the queued touch).
  index.Put(KeyOf(4), 100, index.NextStamp());
  EXPECT_EQ(r.removed, (std::vector<PageKey>{KeyOf(0), KeyOf(2)}));
  EXPECT_EQ(index.LruOrder(), (std::vector<PageKey>{KeyOf(4), KeyOf(3), KeyOf(1)}));
  const FileIndex::TouchCounts c = index.touch_counts();
  EXPECT_EQ(c.at_once, 1);
  EXPECT_EQ(c.deferred, 3);
  EXPECT_EQ(c.dropped, 0);
}

// A Put that must evict applies the queued touches before choosing its victim, without any
// touch that gets the index in between.
TEST(FileIndexTest, PutAppliesQueuedTouchesBeforeChoosingItsVictim) {
  BlockingRemover r;
  TouchLog log;
  FileIndex index(300, r.fn(), nullptr, log.fn());
  int64_t put3 = 0;
  std::thread writer = PutWhileRemoveBlocks(index, r, &put3);
  EXPECT_EQ(index.Touch(KeyOf(1), 100), std::nullopt);
  r.release.set_value();
  writer.join();
  index.Put(KeyOf(4), 100, index.NextStamp());  // order 1, 3, 2 before it: 2 goes
  EXPECT_EQ(r.removed, (std::vector<PageKey>{KeyOf(0), KeyOf(2)}));
  ASSERT_EQ(log.calls.size(), 1u);
  EXPECT_EQ(std::get<0>(log.calls[0]), KeyOf(1));
}

TEST(FileIndexTest, FullTouchQueueDropsTheOldest) {
  BlockingRemover r;
  TouchLog log;
  FileIndex index(300, r.fn(), nullptr, log.fn());
  index.set_pending_touch_limit(2);
  int64_t put3 = 0;
  std::thread writer = PutWhileRemoveBlocks(index, r, &put3);
  for (int k : {1, 2, 3}) EXPECT_EQ(index.Touch(KeyOf(k), 100, std::nullopt, k), std::nullopt);
  r.release.set_value();
  writer.join();
  index.ApplyPendingTouches();
  ASSERT_EQ(log.calls.size(), 2u);  // 1's was dropped
  EXPECT_EQ(std::get<0>(log.calls[0]), KeyOf(2));
  EXPECT_EQ(std::get<2>(log.calls[0]), 2);
  EXPECT_EQ(std::get<0>(log.calls[1]), KeyOf(3));
  EXPECT_LT(std::get<1>(log.calls[0]), std::get<1>(log.calls[1]));
  EXPECT_EQ(index.LruOrder(), (std::vector<PageKey>{KeyOf(3), KeyOf(2), KeyOf(1)}));
  const FileIndex::TouchCounts c = index.touch_counts();
  EXPECT_EQ(c.deferred, 3);
  EXPECT_EQ(c.dropped, 1);
  index.ApplyPendingTouches();  // nothing left
  EXPECT_EQ(log.calls.size(), 2u);
}

// Readers touching while a writer puts and evicts (its remove slow): the stamps handed out are
// strictly increasing, every touch is counted once (at once or queued), and a Put evicts the
// index down to its capacity. (Under TSan: the queue and the index share no unguarded state.)
TEST(FileIndexTest, ConcurrentTouchesAndEvictionsKeepStampsIncreasing) {
  constexpr int kPages = 8;
  TouchLog log;
  FileIndex index(
      kPages * 10,
      [](const PageKey&) { std::this_thread::sleep_for(std::chrono::microseconds(50)); }, nullptr,
      log.fn());
  for (int i = 0; i < kPages; ++i) index.Put(KeyOf(i), 10, index.NextStamp());
  constexpr int kReaders = 3, kTouches = 2000;
  std::vector<std::thread> readers;
  for (int t = 0; t < kReaders; ++t) {
    readers.emplace_back([&index, t] {
      for (int i = 0; i < kTouches; ++i) index.Touch(KeyOf((i * 7 + t) % (4 * kPages)), 10);
    });
  }
  for (int i = kPages; i < kPages + 500; ++i)
    index.Put(KeyOf(i % (4 * kPages)), 10, index.NextStamp());
  for (std::thread& r : readers) r.join();
  index.ApplyPendingTouches();
  index.Put(KeyOf(0), 10, index.NextStamp());  // (a touch of an unknown key adds it unevicted)
  EXPECT_LE(index.bytes(), kPages * 10);
  const FileIndex::TouchCounts c = index.touch_counts();
  EXPECT_EQ(c.at_once + c.deferred, kReaders * kTouches);
  EXPECT_EQ(c.dropped, 0);
  std::lock_guard<std::mutex> lock(log.mu);
  EXPECT_GE(static_cast<int64_t>(log.calls.size()), c.at_once);
  for (size_t i = 1; i < log.calls.size(); ++i) {
    ASSERT_GT(std::get<1>(log.calls[i]), std::get<1>(log.calls[i - 1]));
  }
}

}  // namespace
}  // namespace kvtier::storage
