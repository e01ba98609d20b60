// The file store's reclaimer (storage/file/file_reclaimer.h): evicted pages' files are unlinked off
// the writers' path, yet the store's files never exceed its capacity, Close leaves no detached file
// behind, and an evicted page is a miss, never another page's bytes. No timing in any assertion:
// how the unlinks split between the writers and the reclaimer's threads is whatever the machine
// makes of it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/storage.h"
#include "storage/file/file_backend.h"
#include "storage/file/file_reclaimer.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kPageBytes = 2 * 2 * 4 * 32;  // the namespace below: 512
constexpr int64_t kValueBytes = kPageBytes + static_cast<int64_t>(storage::kFilePayloadOffset);

StorageNamespace SmallNamespace() {
  StorageNamespace ns;
  ns.model_id = "reclaim-test";
  ns.num_layers = 2;
  ns.slot_bytes = 32;
  ns.page_size = 4;
  return ns;
}

// Page i's key and bytes (a function of i alone, so any page read back can be checked).
PageKey KeyOf(int i) {
  const std::vector<int32_t> tokens = {i, i + 1, i + 2, i * 7 + 3};
  return (*ComputePromptPageKeys(tokens, 4, "reclaim"))[0];
}
std::vector<std::byte> BytesOf(int i) {
  std::vector<std::byte> page(kPageBytes);
  std::mt19937 rng(static_cast<uint32_t>(i) * 2654435761u + 1);
  for (auto& b : page) b = static_cast<std::byte>(rng());
  return page;
}

class FileReclaimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string tmpl = std::string(base) + "/kvtier_reclaim_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  std::unique_ptr<StorageBackend> Open(int64_t capacity_pages, int io_threads) {
    StorageOptions options;
    options.io_threads = io_threads;
    auto r = OpenStorage(
        "file://" + root_ + "/store?capacity=" + std::to_string(capacity_pages * kValueBytes),
        SmallNamespace(), options);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  }
  // Regular files under the store (page files and temporary ones) and their bytes on disk.
  struct Files {
    int64_t count = 0, bytes = 0, temp = 0;
  };
  Files FilesOnDisk() const {
    Files f;
    for (const auto& e : fs::recursive_directory_iterator(root_)) {
      if (!e.is_regular_file()) continue;
      ++f.count;
      f.bytes += static_cast<int64_t>(e.file_size());
      if (e.path().filename().string().starts_with(".tmp.")) ++f.temp;
    }
    return f;
  }

  std::string root_;
};

// Four writers fill a 1024-page store three times over, a page a Set and four a Set, while a
// watcher reads the store's bytes and the reclaimer's pending bytes as often as it can: stored +
// pending never exceed the capacity, nor pending its bound. Afterwards: the files on disk fit the
// capacity; every page is either a miss or its own bytes; Close leaves no temporary file.
TEST_F(FileReclaimTest, CapacityHoldsWhileWritersEvictFromSeveralThreads) {
  constexpr int64_t kCapacityPages = 1024;  // the smallest store whose unlinks wait
  constexpr int kWriters = 4;
  constexpr int kPagesPerWriter = static_cast<int>(kCapacityPages) * 3 / kWriters;
  std::unique_ptr<StorageBackend> b = Open(kCapacityPages, kWriters);
  ASSERT_NE(b, nullptr);
  const int64_t capacity = kCapacityPages * kValueBytes;
  ASSERT_EQ(b->Stats().capacity_bytes, capacity);
  const std::optional<storage::testing::FileReclaimCounts> first =
      storage::testing::FileReclaimCountsForTest(*b);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->bound, 64 * kValueBytes);  // unlinks wait
  const int64_t bound = first->bound;

  std::atomic<int64_t> violations{0}, observations{0};
  std::atomic<bool> done{false};
  auto observe = [&] {
    // The pending bytes first: a Put in between moves bytes from the index to the reclaimer, so
    // the index's are read after the pending ones can only have moved out of it.
    const storage::testing::FileReclaimCounts c = *storage::testing::FileReclaimCountsForTest(*b);
    const StorageStats s = b->Stats();
    observations.fetch_add(1);
    if (c.pending > bound || s.stored_bytes > capacity - bound ||
        s.stored_bytes + c.pending > capacity) {
      violations.fetch_add(1);
      ADD_FAILURE() << "stored " << s.stored_bytes << " + pending " << c.pending
                    << " against capacity " << capacity << " (bound " << bound << ")";
    }
  };
  std::thread watcher([&] {
    while (!done.load()) observe();
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      int i = 0;
      while (i < kPagesPerWriter) {
        const int n = (i / 8) % 2 == 0 ? 1 : 4;  // single pages and batches of four
        std::vector<PageKey> keys;
        std::vector<std::vector<std::byte>> bytes;
        std::vector<PageBuffer> buffers;
        for (int k = 0; k < n && i < kPagesPerWriter; ++k, ++i) {
          const int id = w * kPagesPerWriter + i;
          keys.push_back(KeyOf(id));
          bytes.push_back(BytesOf(id));
        }
        for (auto& page : bytes) buffers.push_back(PageBuffer::Of(page));
        const BatchResult st = b->Set(keys, buffers).get();
        for (PageStatus x : st.pages) EXPECT_EQ(x, PageStatus::kOk);
        observe();
      }
    });
  }
  for (std::thread& t : writers) t.join();
  done.store(true);
  watcher.join();
  EXPECT_EQ(violations.load(), 0) << "of " << observations.load() << " observations";

  const StorageStats s = b->Stats();
  const storage::testing::FileReclaimCounts end = *storage::testing::FileReclaimCountsForTest(*b);
  EXPECT_LE(end.max_pending, bound);
  EXPECT_EQ(end.unlinked_inline + end.unlinked_background + end.pending / kValueBytes,
            kWriters * kPagesPerWriter - s.stored_pages)
      << "every evicted page's file unlinked or waiting, once";
  const Files files = FilesOnDisk();
  EXPECT_LE(files.bytes, capacity);
  // The reclaimer's threads may still be unlinking: between the stored pages and those plus the
  // files that were waiting.
  EXPECT_GE(files.count, s.stored_pages);
  EXPECT_LE(files.count, s.stored_pages + end.pending / kValueBytes);

  // Every page: a miss, or its own bytes (the buffers poisoned first).
  int64_t hits = 0;
  for (int id = 0; id < kWriters * kPagesPerWriter; ++id) {
    std::vector<std::byte> out(kPageBytes, std::byte{0xCD});
    const PageKey key = KeyOf(id);
    const PageBuffer buf = PageBuffer::Of(out);
    const PageStatus st = b->Get({key}, {buf}).get().pages.at(0);
    ASSERT_TRUE(st == PageStatus::kOk || st == PageStatus::kAbsent)
        << "page " << id << ": " << PageStatusName(st);
    if (st == PageStatus::kOk) {
      ++hits;
      EXPECT_EQ(out, BytesOf(id)) << "page " << id << " read back another page's bytes";
    }
  }
  EXPECT_EQ(hits, s.stored_pages);
  EXPECT_GT(hits, 0);
  EXPECT_LT(hits, kWriters * kPagesPerWriter);  // eviction ran

  b->Close();
  const Files closed = FilesOnDisk();
  EXPECT_EQ(closed.temp, 0) << "a detached file left after Close";
  EXPECT_EQ(closed.count, s.stored_pages);
  EXPECT_EQ(storage::testing::FileReclaimCountsForTest(*b)->pending, 0);
  b.reset();
  EXPECT_EQ(FilesOnDisk().temp, 0);
}

// A store of fewer than 1024 pages keeps no unlink waiting (bound 0): every evicted page's file
// is gone when the Set that evicted it returns, as before the reclaimer, and it holds as many
// pages as its capacity.
TEST_F(FileReclaimTest, SmallStoreUnlinksOnTheWriter) {
  std::unique_ptr<StorageBackend> b = Open(4, 2);
  ASSERT_NE(b, nullptr);
  for (int id = 0; id < 20; ++id) {
    const PageKey key = KeyOf(id);
    std::vector<std::byte> page = BytesOf(id);
    const PageBuffer buf = PageBuffer::Of(page);
    ASSERT_EQ(b->Set({key}, {buf}).get().pages.at(0), PageStatus::kOk);
    const storage::testing::FileReclaimCounts c = *storage::testing::FileReclaimCountsForTest(*b);
    EXPECT_EQ(c.bound, 0);
    EXPECT_EQ(c.pending, 0);
    const Files f = FilesOnDisk();
    EXPECT_EQ(f.temp, 0);
    EXPECT_LE(f.bytes, 4 * kValueBytes);
  }
  EXPECT_EQ(storage::testing::FileReclaimCountsForTest(*b)->unlinked_background, 0);
  EXPECT_EQ(b->Stats().stored_pages, 4);
}

// The reclaimer alone: Reserve makes room by unlinking waiting files on its caller when the bound
// is reached, Stop unlinks whatever waits, and files that came without a reservation are brought
// back under the bound by Relieve.
TEST_F(FileReclaimTest, ReclaimerKeepsItsBound) {
  auto add = [&](storage::FileReclaimer& r, int i) {
    const std::string name = "f" + std::to_string(i);
    const std::string path = root_ + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr) << path;
    std::fclose(f);
    r.Add(storage::Fd(::open(root_.c_str(), O_RDONLY | O_DIRECTORY)), name, 10);
  };
  {
    storage::FileReclaimer r(30, 1);
    for (int i = 0; i < 50; ++i) {
      r.Reserve(10);
      add(r, i);
      r.Release(10);
      EXPECT_LE(r.counts().pending, 30);
    }
    for (int i = 50; i < 60; ++i) add(r, i);  // no reservation: beyond the bound for now
    r.Relieve();
    EXPECT_LE(r.counts().pending, 30);
    r.Stop();
    const storage::FileReclaimer::Counts c = r.counts();
    EXPECT_EQ(c.pending, 0);
    EXPECT_EQ(c.unlinked_inline + c.unlinked_background, 60);
  }
  EXPECT_EQ(FilesOnDisk().count, 0) << "a file left after Stop";
}

// Drain returns only once the files added before it are gone, also the one a thread is unlinking
// at that moment (the full disk's retry and the floor write into the space Drain freed: the CI
// box, loaded, once returned from Drain before a thread's unlink and the retry met ENOSPC again).
// The thread's unlink is held until Drain has had every chance to return early: a Drain that
// does not wait is caught whenever it returns within the hold; one that waits cannot fail.
TEST_F(FileReclaimTest, DrainWaitsForAnUnlinkUnderWay) {
  const std::string name = "held";
  std::FILE* f = std::fopen((root_ + "/" + name).c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, released = false, drained = false;
  storage::FileReclaimer r(100, 1, [&](int dir, const std::string& n) {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
    ::unlinkat(dir, n.c_str(), 0);
  });
  r.Add(storage::Fd(::open(root_.c_str(), O_RDONLY | O_DIRECTORY)), name, 10);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return entered; });  // the thread has the file
  }
  bool existed_at_return = false;
  std::thread drainer([&] {
    r.Drain();
    existed_at_return = fs::exists(root_ + "/" + name);
    std::lock_guard<std::mutex> lock(mu);
    drained = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_FALSE(cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return drained; }))
        << "Drain returned while the thread's unlink was held";
    released = true;
    cv.notify_all();
  }
  drainer.join();
  EXPECT_FALSE(existed_at_return) << "Drain returned before the file was unlinked";
  EXPECT_EQ(r.counts().pending, 0);
}

}  // namespace
}  // namespace kvtier
