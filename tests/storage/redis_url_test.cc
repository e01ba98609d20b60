// Tests of Redis storage URL parsing: hosts, ports, credentials, cluster seed lists, parameters,
// and a clear InvalidArgument for each kind of bad URL.
#include "storage/redis_url.h"

#include <gtest/gtest.h>

namespace kvtier::storage {
namespace {

TEST(RedisUrlTest, SingleServer) {
  Result<RedisUrl> url = ParseRedisUrl("redis://127.0.0.1:6380");
  ASSERT_TRUE(url.ok()) << url.status().ToString();
  EXPECT_FALSE(url->cluster);
  ASSERT_EQ(url->endpoints.size(), 1u);
  EXPECT_EQ(url->endpoints[0].host, "127.0.0.1");
  EXPECT_EQ(url->endpoints[0].port, 6380);
  EXPECT_TRUE(url->user.empty());
  EXPECT_TRUE(url->password.empty());
  EXPECT_EQ(url->timeout.count(), 0);
  EXPECT_EQ(url->connect_timeout.count(), 1000);
  EXPECT_EQ(url->header_last_bytes, int64_t{1} << 20);
  EXPECT_EQ(url->Redacted(), "redis://127.0.0.1:6380");

  Result<RedisUrl> default_port = ParseRedisUrl("redis://localhost/");
  ASSERT_TRUE(default_port.ok()) << default_port.status().ToString();
  EXPECT_EQ(default_port->endpoints[0].port, 6379);
}

TEST(RedisUrlTest, Credentials) {
  Result<RedisUrl> password_only = ParseRedisUrl("redis://:s3cret@127.0.0.1:7000");
  ASSERT_TRUE(password_only.ok()) << password_only.status().ToString();
  EXPECT_TRUE(password_only->user.empty());
  EXPECT_EQ(password_only->password, "s3cret");
  EXPECT_EQ(password_only->Redacted(), "redis://127.0.0.1:7000");  // no credentials

  Result<RedisUrl> acl = ParseRedisUrl("redis://alice:p%40ss%3Aword@127.0.0.1:7000");
  ASSERT_TRUE(acl.ok()) << acl.status().ToString();
  EXPECT_EQ(acl->user, "alice");
  EXPECT_EQ(acl->password, "p@ss:word");
}

TEST(RedisUrlTest, ClusterSeedsAndParameters) {
  Result<RedisUrl> url = ParseRedisUrl(
      "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,[::1]:7002?timeout_ms=250&"
      "connect_timeout_ms=100&header_last_bytes=4MiB");
  ASSERT_TRUE(url.ok()) << url.status().ToString();
  EXPECT_TRUE(url->cluster);
  ASSERT_EQ(url->endpoints.size(), 3u);
  EXPECT_EQ(url->endpoints[1].port, 7001);
  EXPECT_EQ(url->endpoints[2].host, "::1");
  EXPECT_EQ(url->endpoints[2].ToString(), "[::1]:7002");
  EXPECT_EQ(url->timeout.count(), 250);
  EXPECT_EQ(url->connect_timeout.count(), 100);
  EXPECT_EQ(url->header_last_bytes, int64_t{4} << 20);
  EXPECT_EQ(url->Redacted(), "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,[::1]:7002");
}

TEST(RedisUrlTest, BadUrlsNameTheirProblem) {
  struct Case {
    const char* url;
    const char* mentions;
  };
  const Case cases[] = {
      {"http://127.0.0.1:6379", "scheme"},
      {"redis://", "no host"},
      {"redis://127.0.0.1:0", "port"},
      {"redis://127.0.0.1:65536", "port"},
      {"redis://127.0.0.1:12ab", "port"},
      {"redis://127.0.0.1:", "empty port"},
      {"redis://a:1,b:2", "redis+cluster"},
      {"redis+cluster://a:1,,b:2", "no host"},
      {"redis://alice@127.0.0.1:1", "user info"},
      {"redis://alice:@127.0.0.1:1", "empty password"},
      {"redis://:p%4@127.0.0.1:1", "percent"},
      {"redis://127.0.0.1:1/3", "database"},
      {"redis://127.0.0.1:1?timeout_ms=0", "timeout_ms"},
      {"redis://127.0.0.1:1?timeout_ms=abc", "timeout_ms"},
      {"redis://127.0.0.1:1?header_last_bytes=-1", "header_last_bytes"},
      {"redis://127.0.0.1:1?header_last_bytes=lots", "header_last_bytes"},
      {"redis://127.0.0.1:1?connect_timeout_ms=99999999", "connect_timeout_ms"},
      {"redis://127.0.0.1:1?db=2", "unknown parameter 'db'"},
      {"redis://::1:6379", "brackets"},
      {"redis://[::1:6379", "IPv6"},
      {"redis://ho st:1", "bad character"},
  };
  for (const Case& c : cases) {
    Result<RedisUrl> url = ParseRedisUrl(c.url);
    ASSERT_FALSE(url.ok()) << c.url;
    EXPECT_TRUE(url.status().IsInvalidArgument()) << c.url;
    EXPECT_NE(url.status().message().find(c.mentions), std::string::npos)
        << c.url << " -> " << url.status().ToString();
  }
}

TEST(RedisUrlTest, Endpoints) {
  Result<RedisEndpoint> v4 = ParseRedisEndpoint("10.0.0.7:6379");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->ToString(), "10.0.0.7:6379");
  Result<RedisEndpoint> v6 = ParseRedisEndpoint("[fe80::1]:7000");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "fe80::1");
  EXPECT_EQ(v6->port, 7000);
  EXPECT_FALSE(ParseRedisEndpoint(":7000").ok());
  EXPECT_FALSE(ParseRedisEndpoint("[]:7000").ok());
}

}  // namespace
}  // namespace kvtier::storage
