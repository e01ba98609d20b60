// The memory:// backend: round trips of one- and two-segment pages, misses, Exists prefixes,
// Remove, LRU eviction within the byte capacity, a page larger than the store, named stores
// shared within the process and kept apart by namespace.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "kvtier/storage.h"
#include "storage/page_format.h"

namespace kvtier {
namespace {

StorageNamespace SmallNamespace(std::string model = "test-model") {
  StorageNamespace ns;
  ns.model_id = std::move(model);
  ns.num_layers = 2;
  ns.slot_bytes = 32;
  ns.page_size = 4;
  return ns;  // page_bytes = 512
}

std::vector<PageKey> Keys(int n, std::string_view salt = "") {
  std::vector<int32_t> tokens(static_cast<size_t>(n) * 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
  return *ComputePromptPageKeys(tokens, 4, salt);
}

struct Pages {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<PageBuffer> buffers;
  Pages(int n, uint32_t seed, bool poison = false) : bytes(static_cast<size_t>(n)) {
    std::mt19937 rng(seed);
    for (auto& page : bytes) {
      page.resize(512);
      for (auto& b : page) b = poison ? std::byte{0xCD} : static_cast<std::byte>(rng());
      buffers.push_back(PageBuffer::Of(page));
    }
  }
};

std::unique_ptr<StorageBackend> Open(std::string_view url, const StorageNamespace& ns) {
  auto r = OpenStorage(url, ns);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(*r) : nullptr;
}

TEST(MemoryBackendTest, RoundTripMissAndExists) {
  auto b = Open("memory://?capacity=1MiB", SmallNamespace());
  const auto keys = Keys(6);
  Pages in(4, 1);
  std::vector<PageKey> first4(keys.begin(), keys.begin() + 4);
  ASSERT_EQ(b->Set(first4, in.buffers).get().leading_ok(), 4);
  EXPECT_EQ(b->Exists(keys).get().leading, 4);
  EXPECT_EQ(b->Exists({keys[5], keys[0]}).get().leading, 0);
  EXPECT_EQ(b->Exists({}).get().leading, 0);

  Pages out(6, 0, /*poison=*/true);
  BatchResult r = b->Get(keys, out.buffers).get();
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.pages,
            (std::vector<PageStatus>{PageStatus::kOk, PageStatus::kOk, PageStatus::kOk,
                                     PageStatus::kOk, PageStatus::kAbsent, PageStatus::kAbsent}));
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(out.bytes[static_cast<size_t>(i)], in.bytes[static_cast<size_t>(i)]);

  // Two segments (K and V) read what one segment wrote.
  std::vector<std::byte> k(256), v(256);
  r = b->Get({keys[1]}, {PageBuffer::Of(k, v)}).get();
  ASSERT_EQ(r.leading_ok(), 1);
  EXPECT_TRUE(std::equal(k.begin(), k.end(), in.bytes[1].begin()));
  EXPECT_TRUE(std::equal(v.begin(), v.end(), in.bytes[1].begin() + 256));

  EXPECT_EQ(b->Remove({keys[1], keys[5]}).get().leading_ok(), 2);  // absent keys remove fine
  EXPECT_EQ(b->Exists(keys).get().leading, 1);
  const StorageStats s = b->Stats();
  EXPECT_EQ(s.stored_pages, 3);
  EXPECT_EQ(s.stored_bytes, 3 * (512 + 72));
  EXPECT_EQ(s.capacity_bytes, 1 << 20);
  EXPECT_EQ(s.set_ok_pages, 4);
  EXPECT_EQ(s.get_hit_pages, 5);
  EXPECT_EQ(s.get_absent_pages, 2);
  EXPECT_EQ(s.bytes_written, 4 * 512);
}

TEST(MemoryBackendTest, LruEvictionWithinCapacity) {
  constexpr int64_t kValue = 512 + 72;
  auto b = Open("memory://?capacity=" + std::to_string(3 * kValue), SmallNamespace());
  const auto keys = Keys(5);
  Pages in(5, 2);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(b->Set({keys[static_cast<size_t>(i)]}, {in.buffers[static_cast<size_t>(i)]})
                  .get()
                  .leading_ok(),
              1);
  }
  // Touch page 0 by reading it: page 1 becomes the least recently used.
  Pages out(1, 0, true);
  ASSERT_EQ(b->Get({keys[0]}, out.buffers).get().leading_ok(), 1);
  ASSERT_EQ(b->Set({keys[3]}, {in.buffers[3]}).get().leading_ok(), 1);
  auto present = [&](int i) {
    return b->Exists({keys[static_cast<size_t>(i)]}).get().leading == 1;
  };
  EXPECT_TRUE(present(0));
  EXPECT_FALSE(present(1));
  EXPECT_TRUE(present(2));
  EXPECT_TRUE(present(3));
  const StorageStats s = b->Stats();
  EXPECT_EQ(s.evicted_pages, 1);
  EXPECT_EQ(s.stored_bytes, 3 * kValue);
  EXPECT_LE(s.stored_bytes, s.capacity_bytes);

  // A capacity below one stored page would store nothing: refused at open, naming the page's
  // size (issue 36: capacity=1B was accepted and stored nothing).
  for (const char* url : {"memory://?capacity=1B", "memory://?capacity=100"}) {
    auto tiny = OpenStorage(url, SmallNamespace());
    ASSERT_FALSE(tiny.ok()) << url;
    EXPECT_TRUE(tiny.status().IsInvalidArgument()) << tiny.status().ToString();
    EXPECT_NE(tiny.status().message().find(std::to_string(kValue)), std::string::npos)
        << tiny.status().ToString();
  }
}

// A capacity this process could never allocate is OutOfMemory at open, naming the limit (issue
// 36: `kvtier bench --storage memory://` under an address-space limit crashed in a Set); in a
// child process, whose address-space limit the test lowers.
TEST(MemoryBackendTest, ACapacityBeyondWhatCanBeAllocatedIsOutOfMemory) {
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer reserves terabytes of shadow address space: under an 8 GiB RLIMIT_AS its
  // own mmap fails and it aborts the child before the store is opened. The release build runs it.
  GTEST_SKIP() << "an address-space limit and AddressSanitizer's shadow memory exclude each other";
#endif
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit limit{int64_t{8} << 30, int64_t{8} << 30};  // ulimit -v 8 GiB
    if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(10);
    auto r = OpenStorage("memory://?capacity=10GiB", SmallNamespace());
    if (r.ok() || !r.status().IsOutOfMemory()) ::_exit(11);
    if (r.status().message().find("address-space limit") == std::string::npos) ::_exit(12);
    if (!OpenStorage("memory://?capacity=64MiB", SmallNamespace()).ok()) ::_exit(13);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the exit codes in the test";
}

TEST(MemoryBackendTest, NamedStoresAreSharedAndNamespacesStayApart) {
  const auto keys = Keys(2);
  Pages in(2, 3);
  auto writer = Open("memory://shared-test?capacity=1MiB", SmallNamespace());
  ASSERT_EQ(writer->Set(keys, in.buffers).get().leading_ok(), 2);
  auto reader = Open("memory://shared-test", SmallNamespace());
  EXPECT_EQ(reader->url(), "memory://shared-test");
  Pages out(2, 0, true);
  ASSERT_EQ(reader->Get(keys, out.buffers).get().leading_ok(), 2);
  EXPECT_EQ(out.bytes, in.bytes);
  // Another deployment (a different model, same page size) sees nothing.
  auto other = Open("memory://shared-test", SmallNamespace("other-model"));
  EXPECT_EQ(other->Exists(keys).get().leading, 0);
  EXPECT_EQ(other->Get(keys, out.buffers).get().count(PageStatus::kAbsent), 2);
  // The store outlives one user.
  writer.reset();
  EXPECT_EQ(reader->Exists(keys).get().leading, 2);
  auto mismatch = OpenStorage("memory://shared-test?capacity=2MiB", SmallNamespace());
  ASSERT_FALSE(mismatch.ok());
  EXPECT_TRUE(mismatch.status().IsInvalidArgument());
  EXPECT_FALSE(OpenStorage("memory://bad/name", SmallNamespace()).ok());
  // A private store (no name) is not shared.
  auto a = Open("memory://", SmallNamespace());
  auto c = Open("memory://", SmallNamespace());
  ASSERT_EQ(a->Set(keys, in.buffers).get().leading_ok(), 2);
  EXPECT_EQ(c->Exists(keys).get().leading, 0);
}

TEST(MemoryBackendTest, StoredKeysListsThisNamespaceOnly) {
  const auto keys = Keys(3);
  Pages in(3, 4);
  auto mine = Open("memory://list-test?capacity=1MiB", SmallNamespace());
  auto other = Open("memory://list-test", SmallNamespace("other-model"));
  Result<std::vector<PageKey>> empty = mine->StoredKeys();
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->empty());
  ASSERT_EQ(mine->Set(keys, in.buffers).get().leading_ok(), 3);
  ASSERT_EQ(other->Set({keys[0]}, {in.buffers[0]}).get().leading_ok(), 1);
  Result<std::vector<PageKey>> listed = mine->StoredKeys();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  std::vector<std::string> got, want;
  for (const PageKey& k : *listed) got.push_back(k.Hex());
  for (const PageKey& k : keys) want.push_back(k.Hex());
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  ASSERT_EQ(other->StoredKeys()->size(), 1u);
}

}  // namespace
}  // namespace kvtier
