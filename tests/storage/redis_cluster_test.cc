// Tests of the pure parts of Redis Cluster routing: redirect replies and CLUSTER SLOTS replies
// (built by feeding protocol bytes to hiredis's reader, as a server would send them).
#include "storage/redis/redis_cluster.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include "storage/redis/redis_connection.h"

namespace kvtier::storage {
namespace {

RedisReplyPtr ParseResp(std::string_view bytes) {
  redisReader* reader = redisReaderCreate();
  EXPECT_EQ(redisReaderFeed(reader, bytes.data(), bytes.size()), REDIS_OK);
  void* reply = nullptr;
  EXPECT_EQ(redisReaderGetReply(reader, &reply), REDIS_OK);
  redisReaderFree(reader);
  EXPECT_NE(reply, nullptr);
  return RedisReplyPtr(static_cast<redisReply*>(reply));
}

const RedisEndpoint kReplier{"10.1.2.3", 7000};

TEST(RedisRedirectTest, MovedAndAsk) {
  auto moved = ParseRedirect("MOVED 3999 127.0.0.1:6381", kReplier);
  ASSERT_TRUE(moved.has_value());
  EXPECT_FALSE(moved->ask);
  EXPECT_EQ(moved->slot, 3999);
  EXPECT_EQ(moved->target.ToString(), "127.0.0.1:6381");

  auto ask = ParseRedirect("ASK 16383 [::1]:7002", kReplier);
  ASSERT_TRUE(ask.has_value());
  EXPECT_TRUE(ask->ask);
  EXPECT_EQ(ask->slot, 16383);
  EXPECT_EQ(ask->target.host, "::1");

  // A node that does not know its own address: the replier's host.
  auto no_host = ParseRedirect("MOVED 12 :7005", kReplier);
  ASSERT_TRUE(no_host.has_value());
  EXPECT_EQ(no_host->target.ToString(), "10.1.2.3:7005");
}

TEST(RedisRedirectTest, OtherErrorsAreNotRedirects) {
  for (const char* text :
       {"ERR unknown command", "MOVED", "MOVED 16384 127.0.0.1:1", "MOVED -1 127.0.0.1:1", "ASK 12",
        "ASK 12 127.0.0.1:0", "TRYAGAIN Multiple keys request during rehashing of slot",
        "CLUSTERDOWN The cluster is down"}) {
    EXPECT_FALSE(ParseRedirect(text, kReplier).has_value()) << text;
  }
}

TEST(RedisClusterSlotsTest, ParsesRangesAndFillsEmptyHosts) {
  const std::string resp =
      "*3\r\n"
      "*4\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$4\r\nid-a\r\n"
      "*3\r\n$9\r\n127.0.0.1\r\n:7003\r\n$4\r\nid-d\r\n"       // a replica: ignored
      "*3\r\n:5461\r\n:10922\r\n*2\r\n$0\r\n\r\n:7001\r\n"     // empty host: the replier's
      "*3\r\n:10923\r\n:16383\r\n*2\r\n$1\r\n?\r\n:7002\r\n";  // unknown endpoint: left out
  RedisReplyPtr reply = ParseResp(resp);
  Result<std::vector<RedisSlotRange>> ranges = ParseClusterSlots(*reply, kReplier);
  ASSERT_TRUE(ranges.ok()) << ranges.status().ToString();
  ASSERT_EQ(ranges->size(), 2u);
  EXPECT_EQ((*ranges)[0].first, 0);
  EXPECT_EQ((*ranges)[0].last, 5460);
  EXPECT_EQ((*ranges)[0].master.ToString(), "127.0.0.1:7000");
  EXPECT_EQ((*ranges)[1].first, 5461);
  EXPECT_EQ((*ranges)[1].master.ToString(), "10.1.2.3:7001");
}

TEST(RedisClusterSlotsTest, ErrorsAndMalformedReplies) {
  RedisReplyPtr disabled = ParseResp("-ERR This instance has cluster support disabled\r\n");
  Result<std::vector<RedisSlotRange>> error = ParseClusterSlots(*disabled, kReplier);
  ASSERT_FALSE(error.ok());
  EXPECT_TRUE(error.status().IsUnavailable());
  EXPECT_NE(error.status().message().find("cluster support disabled"), std::string::npos);

  for (const char* resp :
       {":5\r\n", "*1\r\n:1\r\n", "*1\r\n*3\r\n:9\r\n:2\r\n*2\r\n$1\r\na\r\n:1\r\n",
        "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\na\r\n:1\r\n",
        "*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\na\r\n:0\r\n",
        "*1\r\n*3\r\n:0\r\n:1\r\n*1\r\n$1\r\na\r\n"}) {
    RedisReplyPtr reply = ParseResp(resp);
    Result<std::vector<RedisSlotRange>> ranges = ParseClusterSlots(*reply, kReplier);
    ASSERT_FALSE(ranges.ok()) << resp;
    EXPECT_EQ(ranges.status().code(), StatusCode::kCorruption) << resp;
  }
}

}  // namespace
}  // namespace kvtier::storage
