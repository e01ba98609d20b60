// Tests of the Redis client against real redis-server processes on loopback: pipelined binary
// round trips, AUTH (password, ACL user, wrong or missing credentials), a server that dies, is
// paused or restarts (bounded failures, then a reconnect), and cluster redirects (MOVED / ASK)
// while a slot migrates.
#include "storage/redis/redis_client.h"

#include <gtest/gtest.h>

#include <random>

#include "storage/redis/crc16.h"
#include "storage/redis_test_server.h"
#include "support/missing_dependency.h"

namespace kvtier::storage {
namespace {

using namespace std::chrono_literals;
using testing::RedisCommand;
using testing::RedisTestCluster;
using testing::RedisTestServer;
using testing::ReplyText;
using Clock = std::chrono::steady_clock;

#define SKIP_WITHOUT_REDIS()                                              \
  do {                                                                    \
    if (std::string why = testing::RedisTestSkipReason(); !why.empty()) { \
      KVTIER_SKIP_MISSING_DEPENDENCY(why);                                \
    }                                                                     \
  } while (0)

// A bound on a wait that only a hang reaches: far above what a loaded 2-core machine needs.
constexpr auto kHangGuard = 30s;
// The deadline of a batch a healthy server must answer (and of opening a client): a hang guard,
// not a race with a loaded machine.
Deadline Healthy() { return Clock::now() + 60s; }
// The deadline of a batch that something shorter must end (a command timeout, a refused
// connect): far beyond the hang guard, so a batch that ends within the guard was not ended by it.
Deadline Never() { return Clock::now() + 300s; }

// A client of `url`; its command timeout is the URL's timeout_ms or else 60 s (healthy: not the
// library's 2 s), its connect timeout the URL's or 30 s.
Result<std::unique_ptr<RedisClient>> OpenClient(const std::string& url) {
  KVTIER_ASSIGN_OR_RETURN(RedisUrl parsed, ParseRedisUrl(url));
  RedisClientConfig config;
  config.url = std::move(parsed);
  config.command_timeout = config.url.timeout.count() > 0 ? config.url.timeout : 60s;
  if (url.find("connect_timeout_ms=") == std::string::npos) config.url.connect_timeout = 30s;
  return RedisClient::Open(std::move(config), Healthy());
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  if (n >= 4) bytes.replace(0, 4, std::string("\0\r\n$", 4));  // protocol bytes in the value
  return bytes;
}

std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// SETs `values[i]` under `keys[i]` (each value sent as two pieces) and returns the outcomes.
std::vector<RedisOpOutcome> SetAll(RedisClient& client, const std::vector<std::string>& keys,
                                   const std::vector<std::string>& values, Deadline deadline) {
  std::vector<std::array<std::span<const std::byte>, 2>> pieces(keys.size());
  std::vector<RedisOp> ops(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::span<const std::byte> all = AsBytes(values[i]);
    pieces[i] = {all.first(all.size() / 3), all.subspan(all.size() / 3)};
    ops[i].verb = "SET";
    ops[i].key = keys[i];
    ops[i].value = pieces[i];
  }
  client.Execute(ops, deadline);
  std::vector<RedisOpOutcome> outcomes;
  for (const RedisOp& op : ops) {
    const bool ok = op.outcome == RedisOpOutcome::kReplied && ReplyText(op.reply.get()) == "OK";
    outcomes.push_back(
        ok ? RedisOpOutcome::kReplied
           : (op.outcome == RedisOpOutcome::kReplied ? RedisOpOutcome::kFailed : op.outcome));
  }
  return outcomes;
}

std::vector<RedisOp> GetAll(RedisClient& client, const std::vector<std::string>& keys,
                            Deadline deadline) {
  std::vector<RedisOp> ops(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ops[i].verb = "GET";
    ops[i].key = keys[i];
  }
  client.Execute(ops, deadline);
  return ops;
}

// Keys whose values match `values` byte for byte.
int CountExact(const std::vector<RedisOp>& ops, const std::vector<std::string>& values) {
  int exact = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].outcome == RedisOpOutcome::kReplied && ops[i].reply->type == REDIS_REPLY_STRING &&
        std::string_view(ops[i].reply->str, ops[i].reply->len) == values[i]) {
      ++exact;
    }
  }
  return exact;
}

TEST(RedisClientTest, PipelinedBinaryRoundTrip) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  auto client = OpenClient("redis://" + server.address());
  ASSERT_TRUE(client.ok()) << client.status().ToString();

  std::mt19937_64 rng(1);
  std::vector<std::string> keys, values;
  for (int i = 0; i < 200; ++i) {
    keys.push_back("t/" + std::to_string(i));
    values.push_back(RandomBytes(rng, i == 0 ? 0 : (i % 7 == 0 ? 300000 : 1 + rng() % 5000)));
  }
  const auto set = SetAll(**client, keys, values, Healthy());
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(set[i], RedisOpOutcome::kReplied) << i;
  EXPECT_EQ(CountExact(GetAll(**client, keys, Healthy()), values), 200);
  EXPECT_EQ((*client)->counters().round_trips, 2);  // one per batch: a single server

  std::vector<RedisOp> del(2);
  del[0].verb = del[1].verb = "DEL";
  del[0].key = keys[3];
  del[1].key = "never-set";
  (*client)->Execute(del, Healthy());
  EXPECT_EQ(del[0].reply->integer, 1);
  EXPECT_EQ(del[1].reply->integer, 0);
  const auto after = GetAll(**client, {keys[3]}, Healthy());
  EXPECT_EQ(after[0].reply->type, REDIS_REPLY_NIL);
}

TEST(RedisClientTest, ValuesReadStraightIntoSinks) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  auto client = OpenClient("redis://" + server.address());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::mt19937_64 rng(5);
  std::vector<std::string> keys, values;
  for (int i = 0; i < 40; ++i) {
    keys.push_back("s/" + std::to_string(i));
    values.push_back(RandomBytes(rng, i % 5 == 0 ? 700000 : 100 + rng() % 3000));
  }
  for (auto outcome : SetAll(**client, keys, values, Healthy())) {
    ASSERT_EQ(outcome, RedisOpOutcome::kReplied);
  }
  // Sinks of two spans: the exact size for even keys (read in place), one byte short for odd
  // ones (parsed by hiredis instead); a missing key and an error reply in between.
  keys.insert(keys.begin() + 7, "s/absent");
  values.insert(values.begin() + 7, "");
  ASSERT_NE(RedisCommand(server.endpoint(), {"LPUSH", "s/list", "x"}), nullptr);
  keys.insert(keys.begin() + 20, "s/list");
  values.insert(values.begin() + 20, "");
  std::vector<std::vector<std::byte>> first(keys.size()), second(keys.size());
  std::vector<std::array<std::span<std::byte>, 2>> sinks(keys.size());
  std::vector<RedisOp> ops(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t size = values[i].size() + (i % 2 == 1 ? 1 : 0);
    first[i].assign(size / 2, std::byte{0xA5});
    second[i].assign(size - size / 2, std::byte{0xA5});
    sinks[i] = {first[i], second[i]};
    ops[i].verb = "GET";
    ops[i].key = keys[i];
    ops[i].sink = sinks[i];
  }
  (*client)->Execute(ops, Healthy());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(ops[i].outcome, RedisOpOutcome::kReplied) << i << " " << ops[i].error;
    if (keys[i] == "s/absent") {
      ASSERT_FALSE(ops[i].sunk);
      EXPECT_EQ(ops[i].reply->type, REDIS_REPLY_NIL);
    } else if (keys[i] == "s/list") {
      ASSERT_FALSE(ops[i].sunk);
      EXPECT_EQ(ops[i].reply->type, REDIS_REPLY_ERROR);
    } else if (ops[i].sunk) {
      std::string got(reinterpret_cast<const char*>(first[i].data()), first[i].size());
      got.append(reinterpret_cast<const char*>(second[i].data()), second[i].size());
      EXPECT_EQ(got, values[i]) << i;
    } else {
      // Only a size mismatch takes hiredis's path; the value is intact there.
      EXPECT_NE(first[i].size() + second[i].size(), values[i].size()) << i;
      ASSERT_EQ(ops[i].reply->type, REDIS_REPLY_STRING);
      EXPECT_EQ(std::string_view(ops[i].reply->str, ops[i].reply->len), values[i]) << i;
    }
  }
  int sunk = 0;
  for (const RedisOp& op : ops) sunk += op.sunk;
  // Every even key but the list: a reply parsed by hiredis never takes the next one with it.
  EXPECT_EQ(sunk, 20);
}

TEST(RedisClientTest, PasswordAndAclUser) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server(
      {"--requirepass", "s3cret", "--user", "alice", "on", ">wonderland", "~*", "&*", "+@all"});
  ASSERT_EQ(server.Start(), "");
  const std::string host = server.address();

  auto with_password = OpenClient("redis://:s3cret@" + host);
  ASSERT_TRUE(with_password.ok()) << with_password.status().ToString();
  auto as_alice = OpenClient("redis://alice:wonderland@" + host);
  ASSERT_TRUE(as_alice.ok()) << as_alice.status().ToString();
  std::mt19937_64 rng(2);
  const std::vector<std::string> keys = {"a", "b"};
  const std::vector<std::string> values = {RandomBytes(rng, 100), RandomBytes(rng, 7)};
  ASSERT_EQ(SetAll(**as_alice, keys, values, Healthy())[1], RedisOpOutcome::kReplied);
  EXPECT_EQ(CountExact(GetAll(**with_password, keys, Healthy()), values), 2);

  auto wrong = OpenClient("redis://:wrong@" + host);
  ASSERT_FALSE(wrong.ok());
  EXPECT_TRUE(wrong.status().IsUnavailable());
  EXPECT_NE(wrong.status().message().find("AUTH failed"), std::string::npos)
      << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("WRONGPASS"), std::string::npos);

  auto wrong_user = OpenClient("redis://bob:wonderland@" + host);
  ASSERT_FALSE(wrong_user.ok());
  EXPECT_NE(wrong_user.status().message().find("for user bob"), std::string::npos);

  auto none = OpenClient("redis://" + host);
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(none.status().IsUnavailable());
  EXPECT_NE(none.status().message().find("NOAUTH"), std::string::npos) << none.status().ToString();
  EXPECT_NE(none.status().message().find("no password given"), std::string::npos);
}

TEST(RedisClientTest, UnreachableServerIsUnavailable) {
  SKIP_WITHOUT_REDIS();
  const int port = testing::FreeLoopbackPort();  // nothing listens there
  const auto start = Clock::now();
  auto client = OpenClient("redis://127.0.0.1:" + std::to_string(port));
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(client.status().IsUnavailable());
  EXPECT_NE(client.status().message().find("refused"), std::string::npos)
      << client.status().ToString();
  EXPECT_LT(Clock::now() - start, kHangGuard);  // refused at once, not at the 60 s deadline
}

TEST(RedisClientTest, DeadPausedAndRestartedServer) {
  SKIP_WITHOUT_REDIS();
  RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  auto client = OpenClient("redis://" + server.address() + "?timeout_ms=200");
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // The same server with a 60 s command timeout: a batch of it that ends within the hang guard
  // was not ended by its timeout, however slow the machine.
  auto patient = OpenClient("redis://" + server.address());
  ASSERT_TRUE(patient.ok()) << patient.status().ToString();
  const std::vector<std::string> keys = {"x", "y", "z"};
  const std::vector<std::string> values = {"1", "22", "333"};
  ASSERT_EQ(SetAll(**patient, keys, values, Healthy())[2], RedisOpOutcome::kReplied);

  // Paused: the connection stays open but nothing answers; the 200 ms command timeout ends the
  // batch (its deadline is far beyond the guard).
  server.Pause();
  auto start = Clock::now();
  auto paused = GetAll(**client, keys, Never());
  EXPECT_LT(Clock::now() - start, kHangGuard);
  for (const RedisOp& op : paused) EXPECT_EQ(op.outcome, RedisOpOutcome::kTimedOut) << op.error;
  server.Resume();

  // Dead: every command fails fast (refused, then the backoff), none waits for the timeout.
  // Shown on the patient client, whose timeout no loaded box reaches: the 200 ms client's
  // commands fail the same way, but one kept off its core for 200 ms before the connect is
  // kTimedOut, rightly.
  server.Kill();
  for (int attempt = 0; attempt < 5; ++attempt) {
    start = Clock::now();
    auto dead = GetAll(**patient, keys, Never());
    for (const RedisOp& op : dead) EXPECT_EQ(op.outcome, RedisOpOutcome::kFailed);
    for (const RedisOp& op : GetAll(**client, keys, Never())) {
      EXPECT_NE(op.outcome, RedisOpOutcome::kReplied);  // kFailed, or kTimedOut under load
    }
    EXPECT_LT(Clock::now() - start, kHangGuard);
    std::this_thread::sleep_for(30ms);  // past the first backoffs: real connects, refused
  }

  // Restarted (empty: no persistence): the clients reconnect within their backoff.
  ASSERT_EQ(server.Start(), "");
  const auto give_up = Clock::now() + 2 * kHangGuard;
  for (auto* c : {client->get(), patient->get()}) {
    bool reconnected = false;
    while (!reconnected && Clock::now() < give_up) {
      reconnected = SetAll(*c, keys, values, Healthy())[0] == RedisOpOutcome::kReplied;
      if (!reconnected) std::this_thread::sleep_for(20ms);
    }
    ASSERT_TRUE(reconnected);
  }
  EXPECT_EQ(CountExact(GetAll(**patient, keys, Healthy()), values), 3);
  EXPECT_GE((*client)->counters().connect_failures, 1);
}

// Object names spread over slots, and `count` more names in `slot`.
std::vector<std::string> NamesInSlot(int slot, int count, const std::string& prefix) {
  std::vector<std::string> names;
  for (int i = 0; static_cast<int>(names.size()) < count; ++i) {
    std::string name = prefix + std::to_string(i);
    if (HashSlot(name) == slot) names.push_back(std::move(name));
  }
  return names;
}

TEST(RedisClientClusterTest, RoutesBySlotAndFollowsAskAndMoved) {
  SKIP_WITHOUT_REDIS();
  RedisTestCluster cluster;
  ASSERT_EQ(cluster.Start(), "");
  auto client = OpenClient(cluster.Url(1) + "?timeout_ms=60000");
  ASSERT_TRUE(client.ok()) << client.status().ToString();

  // Keys over every node; our slot agrees with the server's CLUSTER KEYSLOT.
  std::mt19937_64 rng(3);
  std::vector<std::string> keys, values;
  int per_node[RedisTestCluster::kNodes] = {};
  for (int i = 0; i < 300; ++i) {
    keys.push_back("kv0123/" + std::to_string(rng()));
    values.push_back(RandomBytes(rng, 64 + rng() % 2000));
    const int owner = cluster.IndexOf((*client)->SlotOwner(HashSlot(keys.back())));
    ASSERT_GE(owner, 0);
    ++per_node[owner];
  }
  for (int n : per_node) EXPECT_GT(n, 50);
  for (int i = 0; i < 5; ++i) {
    auto slot = RedisCommand(cluster.node(0).endpoint(), {"CLUSTER", "KEYSLOT", keys[i]});
    EXPECT_EQ(slot->integer, HashSlot(keys[i])) << keys[i];
  }
  auto set = SetAll(**client, keys, values, Healthy());
  for (auto outcome : set) ASSERT_EQ(outcome, RedisOpOutcome::kReplied);
  EXPECT_EQ(CountExact(GetAll(**client, keys, Healthy()), values), 300);
  EXPECT_EQ((*client)->counters().moved, 0);

  // EXISTS of 1,000 keys: one pipelined round trip per node.
  std::vector<RedisOp> exists(1000);
  for (size_t i = 0; i < exists.size(); ++i) {
    exists[i].verb = "EXISTS";
    exists[i].key = i < keys.size() ? keys[i] : "kv0123/none-" + std::to_string(i);
  }
  const int64_t trips_before = (*client)->counters().round_trips;
  (*client)->Execute(exists, Healthy());
  EXPECT_EQ((*client)->counters().round_trips - trips_before, RedisTestCluster::kNodes);
  for (size_t i = 0; i < exists.size(); ++i) {
    ASSERT_EQ(exists[i].outcome, RedisOpOutcome::kReplied);
    EXPECT_EQ(exists[i].reply->integer, i < keys.size() ? 1 : 0) << i;
  }

  // Migrate one slot from its owner to another node, half its keys first: the moved half
  // answers ASK from the old owner.
  const int slot = HashSlot(keys[0]);
  const int from = cluster.IndexOf((*client)->SlotOwner(slot));
  const int to = (from + 1) % RedisTestCluster::kNodes;
  const std::string from_id = cluster.NodeId(from), to_id = cluster.NodeId(to);
  std::vector<std::string> slot_keys = NamesInSlot(slot, 6, "kv0123/slot-");
  std::vector<std::string> slot_values;
  for (size_t i = 0; i < slot_keys.size(); ++i) slot_values.push_back(RandomBytes(rng, 1000 + i));
  for (auto outcome : SetAll(**client, slot_keys, slot_values, Healthy())) {
    ASSERT_EQ(outcome, RedisOpOutcome::kReplied);
  }
  const std::string slot_text = std::to_string(slot);
  ASSERT_EQ(ReplyText(RedisCommand(cluster.node(to).endpoint(),
                                   {"CLUSTER", "SETSLOT", slot_text, "IMPORTING", from_id})
                          .get()),
            "OK");
  ASSERT_EQ(ReplyText(RedisCommand(cluster.node(from).endpoint(),
                                   {"CLUSTER", "SETSLOT", slot_text, "MIGRATING", to_id})
                          .get()),
            "OK");
  auto migrate = [&](const std::string& key) {
    return ReplyText(RedisCommand(cluster.node(from).endpoint(),
                                  {"MIGRATE", "127.0.0.1", std::to_string(cluster.node(to).port()),
                                   key, "0", "30000"})
                         .get());
  };
  for (size_t i = 0; i < 3; ++i) ASSERT_EQ(migrate(slot_keys[i]), "OK");
  auto during = GetAll(**client, slot_keys, Healthy());
  EXPECT_EQ(CountExact(during, slot_values), 6);
  EXPECT_GE((*client)->counters().ask, 3);
  // A SET of a key that is not on the old owner any more goes to the new one (ASK too).
  slot_values[0] = RandomBytes(rng, 77);
  ASSERT_EQ(SetAll(**client, {slot_keys[0]}, {slot_values[0]}, Healthy())[0],
            RedisOpOutcome::kReplied);

  // Finish: the rest moves, the slot is assigned to `to` everywhere; our map is stale, so the
  // old owner answers MOVED and the client follows and updates its map.
  // Every key left in the slot (ours and any of the 300 above), in bounded rounds.
  for (int round = 0; round < 10; ++round) {
    auto left =
        RedisCommand(cluster.node(from).endpoint(), {"CLUSTER", "GETKEYSINSLOT", slot_text, "100"});
    ASSERT_NE(left, nullptr);
    if (left->elements == 0) break;
    for (size_t i = 0; i < left->elements; ++i) {
      ASSERT_EQ(migrate(std::string(left->element[i]->str, left->element[i]->len)), "OK");
    }
  }
  for (int n = 0; n < RedisTestCluster::kNodes; ++n) {
    ASSERT_EQ(ReplyText(RedisCommand(cluster.node(n).endpoint(),
                                     {"CLUSTER", "SETSLOT", slot_text, "NODE", to_id})
                            .get()),
              "OK");
  }
  auto after = GetAll(**client, slot_keys, Healthy());
  EXPECT_EQ(CountExact(after, slot_values), 6);
  EXPECT_GE((*client)->counters().moved, 1);
  EXPECT_EQ((*client)->SlotOwner(slot), cluster.node(to).address());
  EXPECT_EQ(CountExact(GetAll(**client, keys, Healthy()), values), 300);
}

}  // namespace
}  // namespace kvtier::storage
