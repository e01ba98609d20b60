// Byte sizes and storage URLs: the spellings accepted, and a clear InvalidArgument naming the text
// for everything else; OpenStorage's dispatch on the scheme.
#include "storage/storage_url.h"

#include <gtest/gtest.h>

#include "kvtier/storage.h"
#include "storage/redis_url.h"

namespace kvtier {
namespace {

TEST(ParseByteSizeTest, AcceptedSpellings) {
  const std::pair<const char*, int64_t> cases[] = {
      {"0", 0},
      {"123", 123},
      {"4096B", 4096},
      {"10KiB", 10240},
      {"64MiB", int64_t{64} << 20},
      {"200GiB", int64_t{200} << 30},
      {"2TiB", int64_t{2} << 40},
      {"1.5GB", 1'500'000'000},
      {"1.5GiB", int64_t{3} << 29},
      {"0.5KB", 500},
      {"3kb", 3000},
      {"1gib", int64_t{1} << 30},
      {"1024TiB", int64_t{1} << 50},
      {"1152921504606846976", int64_t{1} << 60},
  };
  for (const auto& [text, bytes] : cases) {
    auto r = ParseByteSize(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().ToString();
    EXPECT_EQ(*r, bytes) << text;
  }
}

TEST(ParseByteSizeTest, RejectedSpellingsNameTheText) {
  for (const char* text :
       {"", "-1", "-5GiB", "GiB", "1.5B", "12 GiB", "1e9", "1.2.3", "5XB", "1152921504606846977",
        "2048PiB", "99999999999999999999999TiB", "0.0001KiB", ".", "1..5"}) {
    auto r = ParseByteSize(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << text;
    EXPECT_NE(r.status().message().find(std::string("'") + text + "'"), std::string::npos)
        << r.status().ToString();
  }
}

TEST(StorageUrlTest, SplitsSchemeRestAndParameters) {
  auto u = storage::ParseStorageUrl("file:///var/kv?capacity=2GiB&fsync=1");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->scheme, "file");
  EXPECT_EQ(u->rest, "/var/kv");
  auto cap = u->TakeByteSize("capacity");
  ASSERT_TRUE(cap.ok() && cap->has_value());
  EXPECT_EQ(**cap, int64_t{2} << 30);
  auto fsync = u->TakeBool("fsync");
  ASSERT_TRUE(fsync.ok() && fsync->has_value());
  EXPECT_TRUE(**fsync);
  EXPECT_TRUE(u->CheckAllTaken("x").ok());

  auto extra = storage::ParseStorageUrl("memory://?capacity=1GiB&colour=blue");
  ASSERT_TRUE(extra.ok());
  ASSERT_TRUE(extra->TakeByteSize("capacity").ok());
  const Status s = extra->CheckAllTaken("memory://?capacity=1GiB&colour=blue");
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("colour"), std::string::npos);

  EXPECT_TRUE(storage::ParseStorageUrl("/no/scheme").status().IsInvalidArgument());
  EXPECT_TRUE(storage::ParseStorageUrl("file:///a?x=1&x=2").status().IsInvalidArgument());
  EXPECT_TRUE(storage::ParseStorageUrl("file:///a?novalue").status().IsInvalidArgument());
  auto bad_bool = storage::ParseStorageUrl("file:///a?fsync=maybe");
  ASSERT_TRUE(bad_bool.ok());
  EXPECT_TRUE(bad_bool->TakeBool("fsync").status().IsInvalidArgument());
  auto bad_int = storage::ParseStorageUrl("redis://h:1?timeout_ms=12x");
  ASSERT_TRUE(bad_int.ok());
  const auto r = bad_int->TakeInt("timeout_ms", 1, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("timeout_ms"), std::string::npos);
}

StorageNamespace SmallNamespace() {
  StorageNamespace ns;
  ns.model_id = "test-model";
  ns.num_layers = 2;
  ns.slot_bytes = 64;
  ns.page_size = 4;
  return ns;
}

TEST(OpenStorageTest, DispatchOnScheme) {
  const StorageNamespace ns = SmallNamespace();
  for (const char* url : {"", "memory:/", "ftp://host/x", "s3://bucket", "FILE:///tmp/x"}) {
    auto r = OpenStorage(url, ns);
    ASSERT_FALSE(r.ok()) << url;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << url << ": " << r.status().ToString();
  }
  auto bad_capacity = OpenStorage("memory://?capacity=lots", ns);
  ASSERT_FALSE(bad_capacity.ok());
  EXPECT_NE(bad_capacity.status().message().find("capacity"), std::string::npos);
  auto unknown_param = OpenStorage("memory://?capacity=1MiB&speed=fast", ns);
  ASSERT_FALSE(unknown_param.ok());
  EXPECT_NE(unknown_param.status().message().find("speed"), std::string::npos);
  StorageNamespace bad_ns = ns;
  bad_ns.page_size = 3;
  EXPECT_TRUE(OpenStorage("memory://", bad_ns).status().IsInvalidArgument());
  StorageOptions bad_options;
  bad_options.io_threads = -1;  // 0 is the machine's default
  auto r = OpenStorage("memory://", ns, bad_options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("io_threads"), std::string::npos);
  auto ok = OpenStorage("memory://?capacity=1MiB", ns);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->url(), "memory://");
#if !KVTIER_HAVE_HIREDIS
  auto redis = OpenStorage("redis://127.0.0.1:6379", ns);
  ASSERT_FALSE(redis.ok());
  EXPECT_NE(redis.status().message().find("hiredis"), std::string::npos);
  EXPECT_NE(redis.status().message().find("KVTIER_STORAGE_REDIS"), std::string::npos);
#endif
}

TEST(RedactUrlTest, HidesUserInfoOnly) {
  const std::pair<const char*, const char*> cases[] = {
      {"redis://:s3cret@127.0.0.1:6379", "redis://***@127.0.0.1:6379"},
      {"redis://alice:s3cret@host:1?timeout_ms=5", "redis://***@host:1?timeout_ms=5"},
      {"redis://:s3/cr@t@host:1/", "redis://***@host:1/"},  // raw '/' and '@' in the password
      {"redis+cluster://u:s3cret@a:1,b:2", "redis+cluster://***@a:1,b:2"},
      {"rediss://:s3cret@host:1", "rediss://***@host:1"},  // unknown scheme: still hidden
      {"memory://:s3cret@name?capacity=1MiB", "memory://***@name?capacity=1MiB"},
      {"file://u:s3cret@/data", "file://***@/data"},
      {"redis:/:s3cret@host", "***@host"},  // no "://": a mistyped URL
      {"redis://127.0.0.1:6379", "redis://127.0.0.1:6379"},
      {"file:///data/kv@2?capacity=1GiB", "file:///data/kv@2?capacity=1GiB"},
      {"memory://", "memory://"},
      {"none", "none"},
      {"", ""},
  };
  for (const auto& [url, want] : cases) EXPECT_EQ(RedactUrl(url), want) << url;
}

// Every error OpenStorage and the URL parsers return for a URL with a password: no password.
TEST(RedactUrlTest, ErrorsNeverShowThePassword) {
  StorageNamespace ns;
  ns.model_id = "m";
  ns.num_layers = 2;
  ns.slot_bytes = 64;
  ns.page_size = 16;
  for (const char* url :
       {"rediss://:s3cret@127.0.0.1:1", "redis:/:s3cret@127.0.0.1:1", "ftp://u:s3cret@h/x",
        "memory://:s3cret@x", "memory://:s3cret@x?capacity=0", "memory://:s3cret@x?bogus=1",
        "memory://:s3cret@x?capacity=1MiB&capacity=2MiB", "memory://:s3cret@x?novalue",
        "redis://:s3cret@127.0.0.1:1?bogus=1", "redis://:s3cret@127.0.0.1:99999",
        "redis+cluster://:s3cret@a:1,:2", "redis://:s3cret@127.0.0.1:1/3"}) {
    auto r = OpenStorage(url, ns);
    ASSERT_FALSE(r.ok()) << url;
    EXPECT_EQ(r.status().ToString().find("s3cret"), std::string::npos)
        << url << ": " << r.status().ToString();
    auto p = storage::ParseStorageUrl(url);
    if (p.ok()) {
      EXPECT_EQ(p->CheckAllTaken(url).ToString().find("s3cret"), std::string::npos) << url;
    } else {
      EXPECT_EQ(p.status().ToString().find("s3cret"), std::string::npos) << url;
    }
  }
}

TEST(StorageUrlTest, NulByteIsRefused) {
  using namespace std::string_literals;
  for (const std::string& url : {"file:///tmp/a\0/b"s, "memory://x\0y"s, "redis://h:1\0"s}) {
    auto parsed = storage::ParseStorageUrl(url);
    ASSERT_FALSE(parsed.ok());
    EXPECT_NE(parsed.status().message().find("NUL"), std::string::npos)
        << parsed.status().ToString();
  }
  EXPECT_FALSE(storage::ParseRedisUrl("redis://:pw\0x@h:1"s).ok());
}

TEST(StorageOptionsTest, ValidateNamesTheField) {
  EXPECT_TRUE(StorageOptions{}.Validate().ok());
  StorageOptions o;
  o.io_threads = 65;
  EXPECT_NE(o.Validate().message().find("io_threads"), std::string::npos);
  o = {};
  o.max_queued_batches = 0;
  EXPECT_NE(o.Validate().message().find("max_queued_batches"), std::string::npos);
  o = {};
  o.timeout = std::chrono::milliseconds(0);
  EXPECT_NE(o.Validate().message().find("timeout"), std::string::npos);
  for (int64_t ms : {int64_t{600'001}, int64_t{10'000'000'000'000}, INT64_MAX}) {
    o.timeout = std::chrono::milliseconds(ms);
    EXPECT_NE(o.Validate().message().find("timeout"), std::string::npos) << ms;
  }
  o.timeout = std::chrono::milliseconds(600'000);
  EXPECT_TRUE(o.Validate().ok());
  o = {};
  o.max_batch_pages = 0;
  EXPECT_NE(o.Validate().message().find("max_batch_pages"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
