// The redis:// and redis+cluster:// storage backends against real redis-server processes on
// loopback ports: round trips of two-segment pages with every byte checked (poisoned outputs),
// Exists prefixes, Remove, the stored name and value format, values whose header disagrees (all
// misses), AUTH with a password or an ACL user and a clear error for a wrong one, a paused,
// killed and restarted server (misses within the timeout, then a reconnect), and a 3-master
// cluster created by the test: keys on every node, a slot migrated while batches run (MOVED and
// ASK followed, no miss), and a node killed while batches run (its pages miss within the
// timeout, the rest are hits) and restarted.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <thread>

#include "kvtier/storage.h"
#include "storage/page_format.h"
#include "storage/redis/crc16.h"
#include "storage/redis_test_server.h"
#include "support/missing_dependency.h"

namespace kvtier {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::RedisCommand;
using testing::RedisTestCluster;
using testing::RedisTestServer;
using testing::ReplyText;

#define SKIP_WITHOUT_REDIS()                                              \
  do {                                                                    \
    if (std::string why = testing::RedisTestSkipReason(); !why.empty()) { \
      KVTIER_SKIP_MISSING_DEPENDENCY(why);                                \
    }                                                                     \
  } while (0)

constexpr std::byte kPoison{0xA5};

StorageNamespace TestNamespace(std::string model = "redis-test-model") {
  StorageNamespace ns;
  ns.model_id = std::move(model);
  ns.num_layers = 2;
  ns.slot_bytes = 64;
  ns.page_size = 16;
  return ns;  // page_bytes = 2 (K, V) * 2 layers * 16 tokens * 64 = 4096; K and V 2048 each
}

std::vector<PageKey> Keys(int n, int64_t start = 0) {
  std::vector<int32_t> tokens(static_cast<size_t>(n) * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(start + i);
  return *ComputePromptPageKeys(tokens, 16);
}

// The byte at `offset` of the payload of the page named `key`: a function of both, so a page read
// into the wrong buffer or shifted by a byte is caught.
std::byte PatternByte(const PageKey& key, size_t offset) {
  uint64_t x = (static_cast<uint64_t>(key.bytes[0]) << 32 | key.bytes[1] << 8 | key.bytes[2]) +
               offset * 0x9E3779B97F4A7C15ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<std::byte>(x >> 56);
}

// Page buffers of one namespace: each page two segments (K, V) of separate allocations.
struct Pages {
  std::vector<std::vector<std::byte> > k, v;
  std::vector<PageBuffer> buffers;
  Pages(const StorageNamespace& ns, size_t n) : k(n), v(n) {
    const size_t half = static_cast<size_t>(ns.page_bytes() / 2);
    for (size_t i = 0; i < n; ++i) {
      k[i].assign(half, kPoison);
      v[i].assign(half, kPoison);
      buffers.push_back(PageBuffer::Of(k[i], v[i]));
    }
  }
  void Fill(std::span<const PageKey> keys) {
    for (size_t i = 0; i < keys.size(); ++i) {
      for (size_t b = 0; b < k[i].size(); ++b) k[i][b] = PatternByte(keys[i], b);
      for (size_t b = 0; b < v[i].size(); ++b) v[i][b] = PatternByte(keys[i], k[i].size() + b);
    }
  }
  void Poison() {
    for (auto& s : k) std::fill(s.begin(), s.end(), kPoison);
    for (auto& s : v) std::fill(s.begin(), s.end(), kPoison);
  }
  // The first wrong byte of page i as text, or "" when it holds key's pattern exactly.
  std::string Mismatch(size_t i, const PageKey& key) const {
    for (size_t b = 0; b < k[i].size(); ++b) {
      if (k[i][b] != PatternByte(key, b))
        return "page " + std::to_string(i) + " K byte " + std::to_string(b);
    }
    for (size_t b = 0; b < v[i].size(); ++b) {
      if (v[i][b] != PatternByte(key, k[i].size() + b)) {
        return "page " + std::to_string(i) + " V byte " + std::to_string(b);
      }
    }
    return "";
  }
};

// A bound on a wait that only a hang reaches: far above what a loaded 2-core machine needs.
constexpr auto kHangGuard = 30s;

// Options for a store whose server is healthy: the per-call timeout is a hang guard (60 s), not
// the library's 2 s, which a loaded machine could miss and turn a hit into a miss. A test that
// provokes time-outs configures its own timeout.
StorageOptions Healthy() {
  StorageOptions options;
  options.timeout = 60s;
  return options;
}

// `url` with connect_timeout_ms=30000 unless it names one: opening (connect, PING) is then never
// a race with a loaded machine. A reconnect is still bounded by its call's deadline.
std::string WithConnectGuard(const std::string& url) {
  if (url.find("connect_timeout_ms=") != std::string::npos) return url;
  return url + (url.find('?') == std::string::npos ? "?" : "&") + "connect_timeout_ms=30000";
}

std::unique_ptr<StorageBackend> Open(const std::string& url, const StorageNamespace& ns,
                                     StorageOptions options = Healthy()) {
  auto backend = OpenStorage(WithConnectGuard(url), ns, options);
  EXPECT_TRUE(backend.ok()) << url << ": " << backend.status().ToString();
  return backend.ok() ? std::move(backend).value() : nullptr;
}

// Sets `keys` from pattern pages; the number of kOk pages.
int64_t SetPattern(StorageBackend& backend, const std::vector<PageKey>& keys) {
  Pages pages(backend.ns(), keys.size());
  pages.Fill(keys);
  BatchResult result = backend.Set(keys, pages.buffers).get();
  EXPECT_TRUE(result.status.ok()) << result.status.ToString();
  return result.count(PageStatus::kOk);
}

// Gets `keys` into poisoned buffers; every kOk page must hold its pattern (a failure otherwise).
BatchResult GetChecked(StorageBackend& backend, const std::vector<PageKey>& keys) {
  Pages pages(backend.ns(), keys.size());
  BatchResult result = backend.Get(keys, pages.buffers).get();
  EXPECT_TRUE(result.status.ok()) << result.status.ToString();
  for (size_t i = 0; i < keys.size() && i < result.pages.size(); ++i) {
    if (result.pages[i] == PageStatus::kOk) {
      EXPECT_EQ(pages.Mismatch(i, keys[i]), "");
    }
  }
  return result;
}

std::string ObjectName(const StorageNamespace& ns, const PageKey& key) {
  return ns.Name() + "/" + key.Hex();
}

// The two ways a Set writes a page (redis_backend.cc): one SET of header ‖ payload, or
// header-last (SET of a blank header ‖ payload, then SETRANGE of the header). The tests of Set
// behaviour run with each, forced by the URL's header_last_bytes whatever the page size.
struct WriteMode {
  const char* name;
  const char* query;
};
constexpr WriteMode kWriteModes[] = {{"OneSet", "?header_last_bytes=0"},
                                     {"HeaderLast", "?header_last_bytes=1"}};

void PrintTo(const WriteMode& mode, std::ostream* os) { *os << mode.name; }

class RedisWriteModeTest : public ::testing::TestWithParam<WriteMode> {
 protected:
  static std::string Query() { return GetParam().query; }
  static bool HeaderLast() { return std::string_view(GetParam().name) == "HeaderLast"; }
};
using RedisBackendWriteTest = RedisWriteModeTest;
using RedisClusterBackendWriteTest = RedisWriteModeTest;
std::string WriteModeName(const ::testing::TestParamInfo<WriteMode>& info) {
  return info.param.name;
}
INSTANTIATE_TEST_SUITE_P(Writes, RedisBackendWriteTest, ::testing::ValuesIn(kWriteModes),
                         WriteModeName);
INSTANTIATE_TEST_SUITE_P(Writes, RedisClusterBackendWriteTest, ::testing::ValuesIn(kWriteModes),
                         WriteModeName);

// Calls of `command` the server has run (INFO commandstats), 0 when it has run none.
int64_t CommandCalls(const storage::RedisEndpoint& server, const std::string& command) {
  auto info = RedisCommand(server, {"INFO", "commandstats"});
  if (info == nullptr || info->type != REDIS_REPLY_STRING) return -1;
  const std::string text(info->str, info->len);
  const std::string field = "cmdstat_" + command + ":calls=";
  const size_t at = text.find(field);
  return at == std::string::npos ? 0 : std::stoll(text.substr(at + field.size()));
}

TEST_P(RedisBackendWriteTest, RoundTripExistsAndRemove) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  const StorageNamespace ns = TestNamespace();
  auto backend = Open("redis://" + server.address() + Query(), ns);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->url(), "redis://" + server.address());

  const std::vector<PageKey> keys = Keys(64);
  EXPECT_EQ(backend->Exists(keys).get().leading, 0);
  const BatchResult absent = GetChecked(*backend, keys);
  EXPECT_EQ(absent.count(PageStatus::kAbsent), 64);

  ASSERT_EQ(SetPattern(*backend, keys), 64);
  EXPECT_EQ(CommandCalls(server.endpoint(), "setrange"), HeaderLast() ? 64 : 0);
  EXPECT_EQ(CommandCalls(server.endpoint(), "set"), 64);
  EXPECT_EQ(backend->Exists(keys).get().leading, 64);
  const BatchResult hits = GetChecked(*backend, keys);
  EXPECT_EQ(hits.count(PageStatus::kOk), 64);

  // Remove pages 10 and 40: Exists stops at 10; Get misses exactly those two.
  ASSERT_EQ(backend->Remove({keys[10], keys[40]}).get().count(PageStatus::kOk), 2);
  EXPECT_EQ(backend->Exists(keys).get().leading, 10);
  const BatchResult after = GetChecked(*backend, keys);
  EXPECT_EQ(after.count(PageStatus::kOk), 62);
  EXPECT_EQ(after.pages[10], PageStatus::kAbsent);
  EXPECT_EQ(after.pages[40], PageStatus::kAbsent);
  EXPECT_EQ(after.leading_ok(), 10);

  // Exists of 1,000 keys (a prefix of 64 present) in one call.
  std::vector<PageKey> many = keys;
  const std::vector<PageKey> more = Keys(936, 64 * 16);
  many.insert(many.end(), more.begin(), more.end());
  EXPECT_EQ(backend->Exists(many).get().leading, 10);

  const StorageStats stats = backend->Stats();
  EXPECT_EQ(stats.set_ok_pages, 64);
  EXPECT_EQ(stats.get_hit_pages, 64 + 62);
  EXPECT_EQ(stats.bytes_written, 64 * ns.page_bytes());
}

TEST_P(RedisBackendWriteTest, StoredNameAndValueAreThePageFormat) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  const StorageNamespace ns = TestNamespace();
  auto backend = Open("redis://" + server.address() + Query(), ns);
  ASSERT_NE(backend, nullptr);
  const std::vector<PageKey> keys = Keys(1);
  ASSERT_EQ(SetPattern(*backend, keys), 1);

  auto raw = RedisCommand(server.endpoint(), {"GET", ObjectName(ns, keys[0])});
  ASSERT_NE(raw, nullptr);
  ASSERT_EQ(raw->type, REDIS_REPLY_STRING);
  ASSERT_EQ(raw->len, storage::kPageHeaderBytes + static_cast<size_t>(ns.page_bytes()));
  const auto value = std::as_bytes(std::span<const char>(raw->str, raw->len));
  storage::PageHeader header;
  ASSERT_EQ(storage::ParsePageHeader(value.first(storage::kPageHeaderBytes), ns.Hash(), keys[0],
                                     static_cast<uint64_t>(ns.page_bytes()), &header),
            PageStatus::kOk);
  for (size_t b = 0; b < static_cast<size_t>(ns.page_bytes()); ++b) {
    ASSERT_EQ(value[storage::kPageHeaderBytes + b], PatternByte(keys[0], b)) << b;
  }
}

TEST_P(RedisBackendWriteTest, ValuesThatDoNotCheckOutAreMisses) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  const StorageNamespace ns = TestNamespace();
  const StorageNamespace other_ns = TestNamespace("another-model");
  auto backend = Open("redis://" + server.address() + Query(), ns);
  auto other = Open("redis://" + server.address() + Query(), other_ns);
  ASSERT_NE(backend, nullptr);
  ASSERT_NE(other, nullptr);
  const std::vector<PageKey> keys = Keys(8);
  ASSERT_EQ(SetPattern(*backend, keys), 8);
  ASSERT_EQ(SetPattern(*other, keys), 8);

  auto raw_get = [&](const std::string& name) {
    auto reply = RedisCommand(server.endpoint(), {"GET", name});
    return std::string(reply->str, reply->len);
  };
  auto raw_set = [&](const PageKey& key, const std::string& value) {
    ASSERT_EQ(ReplyText(RedisCommand(server.endpoint(), {"SET", ObjectName(ns, key), value}).get()),
              "OK");
  };
  const std::string good = raw_get(ObjectName(ns, keys[0]));
  // 0: another key's value renamed into place; 1: another namespace's value of the same key;
  // 2: one payload byte flipped; 3: truncated; 4: an unknown format version; 5: not a page at all;
  // 6: a header byte flipped; 7: one byte too long.
  raw_set(keys[0], raw_get(ObjectName(ns, keys[1])));
  raw_set(keys[1], raw_get(ObjectName(other_ns, keys[1])));
  std::string flipped = raw_get(ObjectName(ns, keys[2]));
  flipped[storage::kPageHeaderBytes + 1000] ^= 0x01;
  raw_set(keys[2], flipped);
  raw_set(keys[3], raw_get(ObjectName(ns, keys[3])).substr(0, 3000));
  {
    Pages page(ns, 1);
    page.Fill(std::span<const PageKey>(&keys[4], 1));
    storage::PageHeader header;
    header.version = storage::kPageFormatVersion + 1;  // no kvtier wrote it
    header.checksum_kind = storage::DefaultChecksumKind();
    header.namespace_hash = ns.Hash();
    header.key = keys[4];
    header.payload_bytes = static_cast<uint64_t>(ns.page_bytes());
    ASSERT_TRUE(
        storage::PayloadChecksum(header.checksum_kind, page.buffers[0], &header.payload_checksum));
    std::string old(storage::kPageHeaderBytes, '\0');
    storage::EncodePageHeader(
        header, std::span<std::byte, storage::kPageHeaderBytes>(
                    reinterpret_cast<std::byte*>(old.data()), storage::kPageHeaderBytes));
    old.append(reinterpret_cast<const char*>(page.k[0].data()), page.k[0].size());
    old.append(reinterpret_cast<const char*>(page.v[0].data()), page.v[0].size());
    raw_set(keys[4], old);
  }
  raw_set(keys[5], "hello");
  std::string bad_header = raw_get(ObjectName(ns, keys[6]));
  bad_header[20] ^= 0x40;
  raw_set(keys[6], bad_header);
  raw_set(keys[7], raw_get(ObjectName(ns, keys[7])) + "x");

  const BatchResult result = GetChecked(*backend, keys);
  const PageStatus expected[] = {PageStatus::kCorrupt, PageStatus::kWrongNamespace,
                                 PageStatus::kCorrupt, PageStatus::kCorrupt,
                                 PageStatus::kCorrupt, PageStatus::kCorrupt,
                                 PageStatus::kCorrupt, PageStatus::kCorrupt};
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(result.pages[i], expected[i])
        << "case " << i << ": " << PageStatusName(result.pages[i]);
  }
  // The untouched value still reads back; a key of the wrong Redis type is no page: corrupt, so
  // the cache removes it and stores the page again (issue 36: such keys were never replaced,
  // their reads failed for good). A Set writes over it.
  raw_set(keys[0], good);
  ASSERT_EQ(ReplyText(RedisCommand(server.endpoint(), {"DEL", ObjectName(ns, keys[1])}).get()),
            "1");
  ASSERT_NE(RedisCommand(server.endpoint(), {"LPUSH", ObjectName(ns, keys[1]), "x"}), nullptr);
  const BatchResult again = GetChecked(*backend, {keys[0], keys[1]});
  EXPECT_EQ(again.pages[0], PageStatus::kOk);
  EXPECT_EQ(again.pages[1], PageStatus::kCorrupt);
  EXPECT_EQ(backend->Stats().get_wrong_namespace_pages, 1);
  EXPECT_EQ(backend->Stats().get_failed_pages, 0);
  Pages fresh(ns, 1);
  const std::vector<PageKey> replaced = {keys[1]};
  fresh.Fill(replaced);
  ASSERT_EQ(backend->Set(replaced, fresh.buffers).get().leading_ok(), 1);
  EXPECT_EQ(GetChecked(*backend, {keys[1]}).leading_ok(), 1);
}

// Redis chooses its own victims (maxmemory-policy, no per-key exemption): a pin is refused, and
// says so (docs/architecture.md, "Retention").
TEST(RedisBackendTest, CannotPinPages) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  auto backend = Open("redis://" + server.address(), TestNamespace());
  ASSERT_NE(backend, nullptr);
  const std::vector<PageKey> keys = Keys(2);
  auto pin = backend->PinPages(keys, std::chrono::seconds(10));
  EXPECT_EQ(pin.status().code(), StatusCode::kFailedPrecondition) << pin.status().ToString();
  EXPECT_NE(pin.status().message().find("cannot pin"), std::string::npos);
}

TEST(RedisBackendTest, PasswordAclUserAndWrongCredentials) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server(
      {"--requirepass", "s3cret", "--user", "alice", "on", ">wonder%land", "~*", "&*", "+@all"});
  ASSERT_EQ(server.Start(), "");
  const StorageNamespace ns = TestNamespace();
  const std::vector<PageKey> keys = Keys(4);

  auto with_password = Open("redis://:s3cret@" + server.address(), ns);
  ASSERT_NE(with_password, nullptr);
  EXPECT_EQ(with_password->url(), "redis://" + server.address());  // no credentials shown
  ASSERT_EQ(SetPattern(*with_password, keys), 4);
  auto as_alice = Open("redis://alice:wonder%25land@" + server.address(), ns);
  ASSERT_NE(as_alice, nullptr);
  EXPECT_EQ(GetChecked(*as_alice, keys).count(PageStatus::kOk), 4);

  auto wrong = OpenStorage("redis://:nope@" + server.address(), ns);
  ASSERT_FALSE(wrong.ok());
  EXPECT_TRUE(wrong.status().IsUnavailable());
  EXPECT_NE(wrong.status().message().find("AUTH failed"), std::string::npos)
      << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("WRONGPASS"), std::string::npos);
  EXPECT_EQ(wrong.status().message().find("nope"), std::string::npos);  // never the password

  auto missing = OpenStorage("redis://" + server.address(), ns);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsUnavailable());
  EXPECT_NE(missing.status().message().find("NOAUTH"), std::string::npos)
      << missing.status().ToString();

  auto bad_url = OpenStorage("redis://alice@" + server.address(), ns);
  ASSERT_FALSE(bad_url.ok());
  EXPECT_TRUE(bad_url.status().IsInvalidArgument());
}

// A server at its maxmemory that may not evict answers writes with OOM: those pages are no room
// (kNoSpace, counted apart from failures), the pages written before still read back. The pages
// written before are a first small batch, stored alone: in one big batch, whether any page lands
// before the limit depends on how much of the pipeline the server has buffered (its client query
// buffer counts against maxmemory), which made the test fail on a loaded machine.
TEST_P(RedisBackendWriteTest, ServerAtMaxmemoryIsNoSpaceNotFailure) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server({"--maxmemory", "4mb", "--maxmemory-policy", "noeviction"});
  ASSERT_EQ(server.Start(), "");
  const StorageNamespace ns = TestNamespace();
  auto backend = Open("redis://" + server.address() + Query(), ns);
  ASSERT_NE(backend, nullptr);
  const auto keys = Keys(2048);  // 8 MiB of pages: past the 4 MiB limit
  Pages pages(ns, keys.size());
  pages.Fill(keys);
  constexpr size_t kFirst = 32;  // 128 KiB: well within the limit
  const std::vector<PageKey> first(keys.begin(), keys.begin() + kFirst);
  const std::vector<PageKey> rest(keys.begin() + kFirst, keys.end());
  const std::vector<PageBuffer> first_buffers(pages.buffers.begin(),
                                              pages.buffers.begin() + kFirst);
  const std::vector<PageBuffer> rest_buffers(pages.buffers.begin() + kFirst, pages.buffers.end());
  const BatchResult before = backend->Set(first, first_buffers).get();
  ASSERT_TRUE(before.status.ok()) << before.status.ToString();
  ASSERT_EQ(before.count(PageStatus::kOk), static_cast<int64_t>(kFirst));
  const BatchResult r = backend->Set(rest, rest_buffers).get();
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  const int64_t ok = r.count(PageStatus::kOk);
  const int64_t no_space = r.count(PageStatus::kNoSpace);
  EXPECT_GT(no_space, 0);
  EXPECT_EQ(ok + no_space, static_cast<int64_t>(rest.size()));  // no page failed otherwise
  const StorageStats st = backend->Stats();
  EXPECT_EQ(st.set_no_space_pages, no_space);
  EXPECT_EQ(st.set_refused_pages, no_space);  // counted apart and warned (issue 36)
  EXPECT_EQ(st.set_failed_pages, 0);
  std::vector<PageKey> stored = first;
  for (size_t i = 0; i < rest.size(); ++i) {
    if (r.pages[i] == PageStatus::kOk) stored.push_back(rest[i]);
  }
  stored.resize(std::min<size_t>(stored.size(), 64));
  EXPECT_EQ(GetChecked(*backend, stored).leading_ok(), static_cast<int64_t>(stored.size()));
}

TEST_P(RedisBackendWriteTest, PausedKilledAndRestartedServer) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  const StorageNamespace ns = TestNamespace();
  StorageOptions options;
  options.timeout = 300ms;  // provokes the time-outs under test
  auto backend = Open("redis://" + server.address() + Query(), ns, options);
  ASSERT_NE(backend, nullptr);
  // The same server through a store whose timeout (60 s) is beyond the hang guard: a call of it
  // that ends within the guard did not wait for its timeout, however slow the machine.
  auto patient = Open("redis://" + server.address() + Query(), ns);
  ASSERT_NE(patient, nullptr);
  const std::vector<PageKey> keys = Keys(16);
  ASSERT_EQ(SetPattern(*patient, keys), 16);

  // Paused (accepts, never answers): every call completes at its timeout, as misses (kTimedOut:
  // the timeout ended it; the wall-clock bound only catches a hang).
  server.Pause();
  auto start = Clock::now();
  const BatchResult paused = GetChecked(*backend, keys);
  EXPECT_EQ(paused.count(PageStatus::kTimedOut), 16);
  EXPECT_EQ(SetPattern(*backend, keys), 0);
  const ExistsResult exists = backend->Exists(keys).get();
  EXPECT_EQ(exists.leading, 0);
  EXPECT_LT(Clock::now() - start, kHangGuard);
  server.Resume();

  // Killed: misses and failed sets at once, not at the timeout (the patient store's 60 s, which
  // no loaded box reaches; the 300 ms store's calls fail the same way, but one kept off its core
  // for 300 ms before the connect is kTimedOut, rightly: it only has to miss).
  server.Kill();
  for (int attempt = 0; attempt < 4; ++attempt) {
    start = Clock::now();
    const BatchResult dead = GetChecked(*patient, keys);
    EXPECT_EQ(dead.count(PageStatus::kFailed), 16);
    EXPECT_EQ(SetPattern(*patient, keys), 0);
    EXPECT_EQ(GetChecked(*backend, keys).count(PageStatus::kOk), 0);
    EXPECT_EQ(SetPattern(*backend, keys), 0);
    EXPECT_LT(Clock::now() - start, kHangGuard);
    std::this_thread::sleep_for(30ms);  // past the first backoffs: real connects, refused
  }

  // Restarted (empty: the tests run without persistence): both stores reconnect by themselves.
  ASSERT_EQ(server.Start(), "");
  const auto give_up = Clock::now() + 2 * kHangGuard;
  for (StorageBackend* b : {backend.get(), patient.get()}) {
    int64_t stored = 0;
    while (stored != 16 && Clock::now() < give_up) {
      stored = SetPattern(*b, keys);
      if (stored != 16) std::this_thread::sleep_for(20ms);
    }
    ASSERT_EQ(stored, 16);
  }
  EXPECT_EQ(GetChecked(*patient, keys).count(PageStatus::kOk), 16);
  EXPECT_EQ(patient->Exists(keys).get().leading, 16);
}

TEST_P(RedisBackendWriteTest, ConcurrentCallersOnOneBackend) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  const StorageNamespace ns = TestNamespace();
  auto backend = Open("redis://" + server.address() + Query(), ns);
  ASSERT_NE(backend, nullptr);
  std::vector<std::thread> callers;
  std::atomic<int64_t> hits{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      const std::vector<PageKey> keys = Keys(32, t * 100000);
      for (int round = 0; round < 5; ++round) {
        EXPECT_EQ(SetPattern(*backend, keys), 32);
        hits += GetChecked(*backend, keys).count(PageStatus::kOk);
        EXPECT_EQ(backend->Exists(keys).get().leading, 32);
      }
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(hits.load(), 4 * 5 * 32);
}

// The default: pages of 1 MiB or more are written header-last, smaller ones in one SET; both read
// back byte for byte.
TEST(RedisBackendTest, DefaultWritesLargePagesHeaderLast) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  StorageNamespace large = TestNamespace("large-pages");
  large.slot_bytes = 16384;  // 2 (K, V) * 2 layers * 16 tokens * 16 KiB = 1 MiB
  ASSERT_EQ(large.page_bytes(), int64_t{1} << 20);
  auto small_backend = Open("redis://" + server.address(), TestNamespace());
  auto large_backend = Open("redis://" + server.address(), large);
  ASSERT_NE(small_backend, nullptr);
  ASSERT_NE(large_backend, nullptr);
  const std::vector<PageKey> keys = Keys(3);
  ASSERT_EQ(SetPattern(*small_backend, keys), 3);
  EXPECT_EQ(CommandCalls(server.endpoint(), "setrange"), 0);
  ASSERT_EQ(SetPattern(*large_backend, keys), 3);
  EXPECT_EQ(CommandCalls(server.endpoint(), "setrange"), 3);
  EXPECT_EQ(GetChecked(*small_backend, keys).count(PageStatus::kOk), 3);
  EXPECT_EQ(GetChecked(*large_backend, keys).count(PageStatus::kOk), 3);
}

// A value whose header is still blank (a header-last Set between its SET and its SETRANGE, or
// one whose SETRANGE never came) reads as absent; once the header is written it is a hit.
TEST(RedisBackendTest, BlankHeaderReadsAsAbsentUntilTheHeaderIsWritten) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  const StorageNamespace ns = TestNamespace();
  auto backend = Open("redis://" + server.address(), ns);
  ASSERT_NE(backend, nullptr);
  const std::vector<PageKey> keys = Keys(2);
  ASSERT_EQ(SetPattern(*backend, keys), 2);
  const std::string name = ObjectName(ns, keys[0]);
  auto good = RedisCommand(server.endpoint(), {"GET", name});
  ASSERT_NE(good, nullptr);
  const std::string value(good->str, good->len);
  std::string blank = value;
  std::fill(blank.begin(), blank.begin() + storage::kPageHeaderBytes, '\0');
  ASSERT_EQ(ReplyText(RedisCommand(server.endpoint(), {"SET", name, blank}).get()), "OK");
  const BatchResult pending = GetChecked(*backend, keys);
  EXPECT_EQ(pending.pages[0], PageStatus::kAbsent);
  EXPECT_EQ(pending.pages[1], PageStatus::kOk);
  EXPECT_EQ(backend->Stats().get_corrupt_pages, 0);
  ASSERT_NE(RedisCommand(server.endpoint(),
                         {"SETRANGE", name, "0", value.substr(0, storage::kPageHeaderBytes)}),
            nullptr);
  EXPECT_EQ(GetChecked(*backend, keys).count(PageStatus::kOk), 2);
}

// ---- cluster ------------------------------------------------------------------------------------

// The index of the cluster node that serves `key`'s object, asking the cluster (-1: none).
int NodeOfKey(RedisTestCluster& cluster, const StorageNamespace& ns, const PageKey& key) {
  const int slot = storage::HashSlot(ObjectName(ns, key));
  // The owner is the node whose CLUSTER SLOTS ranges hold the slot (as node 0 sees them).
  auto slots = RedisCommand(cluster.node(0).endpoint(), {"CLUSTER", "SLOTS"});
  for (size_t i = 0; slots != nullptr && i < slots->elements; ++i) {
    const redisReply* range = slots->element[i];
    if (range->element[0]->integer <= slot && slot <= range->element[1]->integer) {
      return cluster.IndexOf("127.0.0.1:" + std::to_string(range->element[2]->element[1]->integer));
    }
  }
  return -1;
}

TEST_P(RedisClusterBackendWriteTest, KeysOnEveryNodeAndASlotMigratedDuringBatches) {
  SKIP_WITHOUT_REDIS();
  RedisTestCluster cluster;
  ASSERT_EQ(cluster.Start(), "");
  const StorageNamespace ns = TestNamespace();
  auto backend = Open(cluster.Url(2) + Query(), ns);
  ASSERT_NE(backend, nullptr);

  const std::vector<PageKey> keys = Keys(300);
  ASSERT_EQ(SetPattern(*backend, keys), 300);
  int per_node[RedisTestCluster::kNodes] = {};
  for (int n = 0; n < RedisTestCluster::kNodes; ++n) {
    per_node[n] = static_cast<int>(RedisCommand(cluster.node(n).endpoint(), {"DBSIZE"})->integer);
  }
  EXPECT_EQ(per_node[0] + per_node[1] + per_node[2], 300);
  for (int n : per_node) EXPECT_GT(n, 50) << "keys are not spread over the nodes";
  EXPECT_EQ(GetChecked(*backend, keys).count(PageStatus::kOk), 300);
  EXPECT_EQ(backend->Exists(keys).get().leading, 300);

  // Migrate the slot of keys[0] to another node while other threads keep reading and writing
  // batches that include it: each read must be a hit with the right bytes (ASK while the slot
  // is migrating, MOVED after).
  const int slot = storage::HashSlot(ObjectName(ns, keys[0]));
  const int from = NodeOfKey(cluster, ns, keys[0]);
  ASSERT_GE(from, 0);
  const int to = (from + 1) % RedisTestCluster::kNodes;
  const std::string from_id = cluster.NodeId(from), to_id = cluster.NodeId(to);
  const std::string slot_text = std::to_string(slot);
  // More keys in the same slot (searched by their names' CRC16), so the batch has several.
  std::vector<PageKey> batch = {keys[0]};
  for (int64_t start = 1000000; batch.size() < 6; start += 16) {
    const PageKey key = Keys(1, start)[0];
    if (storage::HashSlot(ObjectName(ns, key)) == slot) batch.push_back(key);
  }
  ASSERT_EQ(SetPattern(*backend, batch), 6);
  batch.insert(batch.end(), keys.begin() + 1, keys.begin() + 40);

  std::atomic<bool> done{false};
  std::atomic<int64_t> batches{0}, misses{0};
  std::thread reader([&] {
    while (!done.load()) {
      const BatchResult result = GetChecked(*backend, batch);
      misses += static_cast<int64_t>(batch.size()) - result.count(PageStatus::kOk);
      ++batches;
    }
  });
  auto admin = [&](int node, std::initializer_list<std::string_view> args) {
    return ReplyText(RedisCommand(cluster.node(node).endpoint(), args).get());
  };
  ASSERT_EQ(admin(to, {"CLUSTER", "SETSLOT", slot_text, "IMPORTING", from_id}), "OK");
  ASSERT_EQ(admin(from, {"CLUSTER", "SETSLOT", slot_text, "MIGRATING", to_id}), "OK");
  for (int round = 0; round < 20; ++round) {
    auto left =
        RedisCommand(cluster.node(from).endpoint(), {"CLUSTER", "GETKEYSINSLOT", slot_text, "1"});
    ASSERT_NE(left, nullptr);
    if (left->elements == 0) break;
    const std::string name(left->element[0]->str, left->element[0]->len);
    ASSERT_EQ(admin(from, {"MIGRATE", "127.0.0.1", std::to_string(cluster.node(to).port()), name,
                           "0", "30000"}),
              "OK");
    std::this_thread::sleep_for(5ms);  // pacing (no bound): batches run on a half-migrated slot
  }
  // The new owner first, then the old one, then the rest (the order that never loses a key).
  ASSERT_EQ(admin(to, {"CLUSTER", "SETSLOT", slot_text, "NODE", to_id}), "OK");
  ASSERT_EQ(admin(from, {"CLUSTER", "SETSLOT", slot_text, "NODE", to_id}), "OK");
  ASSERT_EQ(admin(3 - from - to, {"CLUSTER", "SETSLOT", slot_text, "NODE", to_id}), "OK");
  const int64_t before_end = batches.load();
  while (batches.load() < before_end + 2) std::this_thread::sleep_for(1ms);
  done = true;
  reader.join();
  EXPECT_GT(batches.load(), 2);
  EXPECT_EQ(misses.load(), 0);
  EXPECT_EQ(NodeOfKey(cluster, ns, keys[0]), to);
  // Writes and reads of the migrated slot go to its new owner.
  ASSERT_EQ(SetPattern(*backend, batch), static_cast<int64_t>(batch.size()));
  EXPECT_EQ(GetChecked(*backend, keys).count(PageStatus::kOk), 300);
  EXPECT_EQ(RedisCommand(cluster.node(from).endpoint(), {"CLUSTER", "COUNTKEYSINSLOT", slot_text})
                ->integer,
            0);
}

TEST_P(RedisClusterBackendWriteTest, NodeKilledDuringBatchesThenRestarted) {
  SKIP_WITHOUT_REDIS();
  RedisTestCluster cluster;
  ASSERT_EQ(cluster.Start(), "");
  const StorageNamespace ns = TestNamespace();
  // The healthy nodes' timeout (60 s) is beyond the hang guard: a batch that ends within the
  // guard did not wait for it on the dead node, and a slow healthy node never misses.
  auto backend = Open(cluster.Url(3) + Query(), ns);
  ASSERT_NE(backend, nullptr);
  const std::vector<PageKey> keys = Keys(150);
  ASSERT_EQ(SetPattern(*backend, keys), 150);
  std::vector<int> node_of(keys.size());
  int on_victim = 0;
  const int victim = 1;
  for (size_t i = 0; i < keys.size(); ++i) {
    node_of[i] = NodeOfKey(cluster, ns, keys[i]);
    on_victim += node_of[i] == victim;
  }
  ASSERT_GT(on_victim, 10);

  // Batches run while the node dies; after that, every batch completes within the timeout
  // with exactly the victim's pages missing and every other page a hit with the right bytes.
  std::atomic<bool> killed{false}, done{false};
  std::atomic<int64_t> before_kill{0}, after_kill{0};
  std::thread reader([&] {
    while (!done.load()) {
      const bool was_killed = killed.load();
      const auto start = Clock::now();
      const BatchResult result = GetChecked(*backend, keys);
      EXPECT_LT(Clock::now() - start, kHangGuard);
      for (size_t i = 0; i < keys.size(); ++i) {
        if (node_of[i] != victim) {
          EXPECT_EQ(result.pages[i], PageStatus::kOk)
              << i << " " << PageStatusName(result.pages[i]);
        } else if (was_killed) {
          EXPECT_TRUE(result.pages[i] == PageStatus::kFailed ||
                      result.pages[i] == PageStatus::kTimedOut)
              << PageStatusName(result.pages[i]);
        }
      }
      ++(was_killed ? after_kill : before_kill);
    }
  });
  while (before_kill.load() < 1) std::this_thread::sleep_for(1ms);  // batches are running
  cluster.node(victim).Kill();
  killed = true;
  while (after_kill.load() < 5) std::this_thread::sleep_for(1ms);
  done = true;
  reader.join();

  // Sets of the victim's pages fail, the others succeed.
  EXPECT_EQ(SetPattern(*backend, keys), 150 - on_victim);

  // Restarted with its cluster config (same id and slots, no data): the backend reconnects.
  ASSERT_EQ(cluster.node(victim).Start(), "");
  const auto give_up = Clock::now() + 2 * kHangGuard;
  int64_t stored = 0;
  while (stored != 150 && Clock::now() < give_up) {
    stored = SetPattern(*backend, keys);
    if (stored != 150) std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(stored, 150);
  EXPECT_EQ(GetChecked(*backend, keys).count(PageStatus::kOk), 150);
}

TEST(RedisClusterBackendTest, OpenErrors) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer plain;  // no cluster support
  ASSERT_EQ(plain.Start(), "");
  auto not_cluster = OpenStorage("redis+cluster://" + plain.address(), TestNamespace());
  ASSERT_FALSE(not_cluster.ok());
  EXPECT_TRUE(not_cluster.status().IsUnavailable());
  EXPECT_NE(not_cluster.status().message().find("cluster support disabled"), std::string::npos)
      << not_cluster.status().ToString();

  const int nobody = testing::FreeLoopbackPort();
  auto unreachable =
      OpenStorage("redis+cluster://127.0.0.1:" + std::to_string(nobody) + "," + plain.address(),
                  TestNamespace());
  ASSERT_FALSE(unreachable.ok());
  EXPECT_NE(unreachable.status().message().find("refused"), std::string::npos)
      << unreachable.status().ToString();
}

}  // namespace
}  // namespace kvtier
