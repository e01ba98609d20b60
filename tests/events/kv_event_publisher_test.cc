// KvEventPublisher over real ZeroMQ sockets on 127.0.0.1 (ports chosen by the kernel): the
// three-frame PUB messages and their payloads, the replay socket's answers, drops counted when the
// queue is full (with the seq gaps they leave), bad replay requests, config errors. Every receive
// has a timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <random>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "events/kv_event_decode.h"
#include "kvtier/kv_events.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;

// How long a wait for the sockets' threads may take before the test calls it a hang: a loaded
// box (a sanitizer build beside busy loops) may keep ZeroMQ's I/O thread off a core for seconds.
constexpr int kHangGuardMs = 60000;

uint64_t Seq(const zmq::message_t& frame) {
  EXPECT_EQ(frame.size(), 8u);
  uint64_t value = 0;
  for (size_t i = 0; i < 8 && i < frame.size(); ++i) {
    value = (value << 8) | frame.data<uint8_t>()[i];
  }
  return value;
}

struct Received {
  uint64_t seq;
  KvEventBatch batch;
};

class Subscriber {
 public:
  Subscriber(zmq::context_t& ctx, const std::string& endpoint, const std::string& topic)
      : sub_(ctx, zmq::socket_type::sub) {
    sub_.set(zmq::sockopt::rcvtimeo, kHangGuardMs);
    sub_.set(zmq::sockopt::rcvhwm, 0);
    sub_.set(zmq::sockopt::subscribe, topic);
    sub_.connect(endpoint);
  }
  // The next message, or nullopt after the hang guard.
  std::optional<Received> Next(const std::string& topic) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(sub_, std::back_inserter(frames))) return std::nullopt;
    EXPECT_EQ(frames.size(), 3u);
    if (frames.size() != 3) return std::nullopt;
    EXPECT_EQ(frames[0].to_string(), topic);
    auto batch = testing::DecodeVllmBatch(frames[2].to_string_view());
    if (!batch) return std::nullopt;
    return Received{Seq(frames[1]), std::move(*batch)};
  }
  zmq::socket_t sub_;
};

// Publishes one-event batches until the subscriber receives one (the PUB socket drops what it
// sends before the subscription arrives), then receives the probes behind it up to the last one
// published; returns that probe's seq, so that the caller's first message is the next one. (The
// drain used to end at the first 50 ms without a message: a probe still in ZeroMQ's queues then
// came first to the caller, on a loaded box.)
uint64_t Handshake(KvEventPublisher& pub, Subscriber& sub, const std::string& topic) {
  const auto give_up = std::chrono::steady_clock::now() + milliseconds(kHangGuardMs);
  sub.sub_.set(zmq::sockopt::rcvtimeo, 50);
  std::vector<zmq::message_t> frames;
  for (;;) {
    pub.Publish({AllBlocksCleared{}});
    if (zmq::recv_multipart(sub.sub_, std::back_inserter(frames))) break;
    if (std::chrono::steady_clock::now() > give_up) {
      ADD_FAILURE() << "no subscription on " << topic << " within the hang guard";
      return 0;
    }
  }
  // Every probe is sent: the last one's seq follows from the counts (seqs start at 0, and a
  // dropped batch takes one too). The subscription is there, so each probe after the first one
  // received arrives, in order.
  EXPECT_TRUE(pub.Flush(milliseconds(kHangGuardMs))) << "probes not sent (a hang)";
  const KvEventPublisherStats stats = pub.stats();
  const uint64_t last_probe = stats.published_batches + stats.dropped_batches - 1;
  sub.sub_.set(zmq::sockopt::rcvtimeo, kHangGuardMs);
  uint64_t last = Seq(frames[1]);
  while (last < last_probe) {
    frames.clear();
    if (!zmq::recv_multipart(sub.sub_, std::back_inserter(frames)) || frames.size() != 3) {
      ADD_FAILURE() << "probe " << last + 1 << " of " << last_probe << " did not arrive (a hang)";
      return last;
    }
    last = Seq(frames[1]);
  }
  EXPECT_EQ(last, last_probe);
  return last;
}

KvEventPublisherConfig LoopbackConfig() {
  KvEventPublisherConfig config;
  config.endpoint = "tcp://127.0.0.1:*";
  config.replay_endpoint = "tcp://127.0.0.1:*";
  config.topic = "kv-events";
  config.linger_ms = 0;
  return config;
}

// (seq, batch) answers to a replay request from `start`, up to the end marker.
std::vector<Received> Replay(zmq::context_t& ctx, const std::string& endpoint, uint64_t start) {
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, kHangGuardMs);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(endpoint);
  uint8_t start_bytes[8];
  for (int i = 0; i < 8; ++i) start_bytes[i] = static_cast<uint8_t>(start >> (56 - 8 * i));
  dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(start_bytes, 8));
  std::vector<Received> out;
  for (;;) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(dealer, std::back_inserter(frames))) {
      ADD_FAILURE() << "replay answer timed out after " << out.size() << " batches";
      return out;
    }
    EXPECT_EQ(frames.size(), 3u);  // "", seq, payload
    if (frames.size() != 3) return out;
    EXPECT_EQ(frames[0].size(), 0u);
    if (Seq(frames[1]) == UINT64_MAX) {  // -1: the end marker, with an empty payload
      EXPECT_EQ(frames[2].size(), 0u);
      return out;
    }
    auto batch = testing::DecodeVllmBatch(frames[2].to_string_view());
    if (!batch) return out;
    out.push_back(Received{Seq(frames[1]), std::move(*batch)});
  }
}

TEST(KvEventPublisherTest, PublishesThreeFrameMessagesInSeqOrder) {
  KvEventPublisherConfig config = LoopbackConfig();
  config.data_parallel_rank = 2;
  auto pub = KvEventPublisher::Open(config);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  ASSERT_NE((*pub)->endpoint().find("tcp://127.0.0.1:"), std::string::npos);
  zmq::context_t ctx;
  Subscriber sub(ctx, (*pub)->endpoint(), config.topic);
  const uint64_t first = Handshake(**pub, sub, config.topic) + 1;

  std::mt19937_64 rng(7);
  std::vector<std::vector<KvEvent>> sent;
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (int i = 0; i < 300; ++i) {
    KvEventBatch batch = testing::RandomBatch(rng);
    if (batch.events.empty()) batch.events.push_back(AllBlocksCleared{});
    sent.push_back(batch.events);
    (*pub)->Publish(batch.events);
  }
  for (size_t i = 0; i < sent.size(); ++i) {
    auto got = sub.Next(config.topic);
    ASSERT_TRUE(got.has_value()) << "message " << i;
    EXPECT_EQ(got->seq, first + i);
    EXPECT_EQ(got->batch.events, sent[i]) << "message " << i;
    EXPECT_EQ(got->batch.data_parallel_rank, 2);
    EXPECT_GE(got->batch.ts, before - 1);
    EXPECT_LE(got->batch.ts, before + 60);
  }
  (*pub)->Publish({});  // nothing
  ASSERT_TRUE((*pub)->Flush(milliseconds(kHangGuardMs)));
  const KvEventPublisherStats stats = (*pub)->stats();
  EXPECT_EQ(stats.published_batches, first + sent.size());
  EXPECT_EQ(stats.dropped_batches, 0u);
  EXPECT_EQ(stats.send_errors, 0u);
}

TEST(KvEventPublisherTest, ReplaySendsBufferedBatchesFromTheRequestedSeq) {
  KvEventPublisherConfig config = LoopbackConfig();
  config.replay_buffer_batches = 50;
  auto pub = KvEventPublisher::Open(config);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  ASSERT_FALSE((*pub)->replay_endpoint().empty());
  std::mt19937_64 rng(11);
  std::vector<std::vector<KvEvent>> sent;
  for (int i = 0; i < 120; ++i) {  // no subscriber: every batch only reaches the replay buffer
    std::vector<KvEvent> events = {testing::RandomEvent(rng), testing::RandomEvent(rng)};
    sent.push_back(events);
    (*pub)->Publish(std::move(events));
  }
  ASSERT_TRUE((*pub)->Flush(milliseconds(kHangGuardMs)));
  zmq::context_t ctx;
  for (uint64_t start : {0ull, 69ull, 70ull, 100ull, 119ull, 120ull, 5000ull}) {
    const std::vector<Received> got = Replay(ctx, (*pub)->replay_endpoint(), start);
    const uint64_t first = std::max<uint64_t>(start, 70);  // the last 50 of 120 are kept
    ASSERT_EQ(got.size(), first >= 120 ? 0 : 120 - first) << "start " << start;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].seq, first + i);
      EXPECT_EQ(got[i].batch.events, sent[first + i]);
    }
  }
  // Malformed requests are ignored and counted; the socket keeps answering.
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect((*pub)->replay_endpoint());
  dealer.send(zmq::str_buffer("x"), zmq::send_flags::sndmore);
  dealer.send(zmq::str_buffer("12345678"));
  dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  dealer.send(zmq::str_buffer("1234"));
  EXPECT_EQ(Replay(ctx, (*pub)->replay_endpoint(), 110).size(), 10u);
  const KvEventPublisherStats stats = (*pub)->stats();
  EXPECT_EQ(stats.bad_replay_requests, 2u);
  EXPECT_EQ(stats.replay_requests, 8u);
}

TEST(KvEventPublisherTest, FullQueueDropsAndCountsAndLeavesSeqGaps) {
  KvEventPublisherConfig config = LoopbackConfig();
  config.max_queue_batches = 1;
  config.replay_buffer_batches = 100000;
  auto pub = KvEventPublisher::Open(config);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  constexpr int kBatches = 5000;
  BlockStored big;
  big.block_size = 64;
  big.block_hashes.resize(16, 1);
  big.token_ids.resize(16 * 64, 3);
  auto max_publish = std::chrono::nanoseconds(0);
  for (int i = 0; i < kBatches; ++i) {
    const auto start = std::chrono::steady_clock::now();
    (*pub)->Publish({big});
    max_publish = std::max(max_publish, std::chrono::steady_clock::now() - start);
  }
  ASSERT_TRUE((*pub)->Flush(milliseconds(kHangGuardMs)));
  const KvEventPublisherStats stats = (*pub)->stats();
  EXPECT_EQ(stats.published_batches + stats.dropped_batches, static_cast<uint64_t>(kBatches));
  EXPECT_EQ(stats.dropped_events, stats.dropped_batches);
  EXPECT_GT(stats.dropped_batches, 0u) << "a queue of 1 kept up with " << kBatches << " batches";
  // Publish only appends to a queue: it never waits for the stalled socket (which would be for
  // good). The bound is a hang guard a loaded machine with a sanitizer build stays far under.
  EXPECT_LT(max_publish, milliseconds(kHangGuardMs));
  // The seqs that reached the wire (all of them in the replay buffer) skip the dropped ones.
  zmq::context_t ctx;
  const std::vector<Received> got = Replay(ctx, (*pub)->replay_endpoint(), 0);
  EXPECT_EQ(got.size(), stats.published_batches);
  uint64_t gaps = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const uint64_t expected_min = i == 0 ? 0 : got[i - 1].seq + 1;
    ASSERT_GE(got[i].seq, expected_min);
    gaps += got[i].seq - expected_min;
  }
  if (!got.empty()) gaps += kBatches - 1 - got.back().seq;
  EXPECT_EQ(gaps, stats.dropped_batches);
}

TEST(KvEventPublisherTest, BadConfigAndBusyEndpointsAreErrors) {
  KvEventPublisherConfig config = LoopbackConfig();
  config.max_queue_batches = 0;
  auto bad = KvEventPublisher::Open(config);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("max_queue_batches"), std::string::npos);
  config = LoopbackConfig();
  config.linger_ms = -1;
  EXPECT_FALSE(KvEventPublisher::Open(config).ok());
  config = LoopbackConfig();
  config.endpoint = "";
  EXPECT_FALSE(KvEventPublisher::Open(config).ok());

  auto first = KvEventPublisher::Open(LoopbackConfig());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  config = LoopbackConfig();
  config.endpoint = (*first)->endpoint();  // "tcp://127.0.0.1:PORT" connects (vLLM's rule) ...
  config.replay_endpoint = (*first)->replay_endpoint();  // ... but the replay socket binds
  auto busy = KvEventPublisher::Open(config);
  ASSERT_FALSE(busy.ok());
  EXPECT_NE(busy.status().ToString().find((*first)->replay_endpoint()), std::string::npos);
  config.replay_endpoint = "nonsense://x";
  EXPECT_FALSE(KvEventPublisher::Open(config).ok());
}

}  // namespace
}  // namespace kvtier
