// RedisConnection against a hostile server (a socket of this test that answers with whatever it
// is told): replies larger than their command can use are refused without being buffered — a
// 64 MiB value for an 8 KiB page is skipped as it streams and the connection stays usable; an
// endless line or a huge array fails the connection — with the process's peak RSS checked.
// Also: opening a Redis store against a paused redis-server is bounded by connect_timeout_ms.
#include "storage/redis/redis_connection.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/storage.h"
#include "storage/redis_test_server.h"
#include "support/missing_dependency.h"

namespace kvtier::storage {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int64_t PeakRssBytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// A one-connection server on a free loopback port: once the first command bytes arrive, it runs
// `answer(fd)` (which writes whatever it likes), then waits for the client to close.
class HostileServer {
 public:
  explicit HostileServer(std::function<void(int fd)> answer) : answer_(std::move(answer)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    ::listen(listen_fd_, 1);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      char buf[4096];
      if (::read(fd, buf, sizeof(buf)) > 0) answer_(fd);
      while (::read(fd, buf, sizeof(buf)) > 0) {
      }
      ::close(fd);
    });
  }
  ~HostileServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
  }
  RedisEndpoint endpoint() const { return {"127.0.0.1", port_}; }

 private:
  std::function<void(int)> answer_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

// Writes all of `text` (a closed peer ends it early).
void WriteAll(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::send(fd, text.data(), text.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

// Writes `bytes` bytes of 'x' in 1 MiB pieces (never one buffer of that size).
void WriteFiller(int fd, size_t bytes) {
  const std::string chunk(size_t{1} << 20, 'x');
  while (bytes > 0) {
    const size_t n = std::min(bytes, chunk.size());
    WriteAll(fd, std::string_view(chunk).substr(0, n));
    bytes -= n;
  }
}

struct PipelineRun {
  std::vector<RedisReplyPtr> replies;
  PipelineOutcome outcome;
};

PipelineRun RunOne(RedisConnection& connection) {
  PipelineRun run;
  RedisConnection* connections[] = {&connection};
  std::vector<RedisReplyPtr>* lists[] = {&run.replies};
  RunPipelines(connections, lists, Clock::now() + 20s, std::span(&run.outcome, 1));
  return run;
}

constexpr size_t kHugeValue = size_t{64} << 20;
constexpr int64_t kRssSlack = int64_t{24} << 20;  // far below the 64 MiB a buffered reply takes

TEST(RedisConnectionTest, ValueLargerThanThePageIsDiscardedAsItStreams) {
  HostileServer server([](int fd) {
    WriteAll(fd, "$" + std::to_string(kHugeValue) + "\r\n");
    WriteFiller(fd, kHugeValue);
    WriteAll(fd, "\r\n+PONG\r\n");
  });
  auto connection = RedisConnection::Connect(server.endpoint(), {}, Clock::now() + 30s);
  ASSERT_TRUE(connection.ok()) << connection.status().ToString();
  std::vector<std::byte> page(8192, std::byte{0x5a});
  const std::span<std::byte> sink[] = {page};
  (*connection)->Append({"GET", "page"}, sink);
  (*connection)->Append({"PING"});
  const int64_t rss_before = PeakRssBytes();
  PipelineRun run = RunOne(**connection);
  EXPECT_LT(PeakRssBytes() - rss_before, kRssSlack);
  ASSERT_TRUE(run.outcome.status.ok()) << run.outcome.status.ToString();
  ASSERT_EQ(run.replies.size(), 2u);
  ASSERT_NE(run.replies[0], nullptr);
  EXPECT_EQ(run.replies[0]->type, REDIS_REPLY_ERROR);
  EXPECT_NE(std::string(run.replies[0]->str).find("discarded"), std::string::npos)
      << run.replies[0]->str;
  ASSERT_NE(run.replies[1], nullptr);
  EXPECT_EQ(std::string(run.replies[1]->str, run.replies[1]->len), "PONG");
  EXPECT_FALSE((*connection)->broken());
  for (std::byte b : page) ASSERT_EQ(b, std::byte{0x5a});  // the sink was not written
}

TEST(RedisConnectionTest, ShorterValueThanTheSinkIsAnOrdinaryReply) {
  HostileServer server([](int fd) { WriteAll(fd, "$5\r\nhello\r\n"); });
  auto connection = RedisConnection::Connect(server.endpoint(), {}, Clock::now() + 30s);
  ASSERT_TRUE(connection.ok());
  std::vector<std::byte> page(8192);
  const std::span<std::byte> sink[] = {page};
  (*connection)->Append({"GET", "page"}, sink);
  PipelineRun run = RunOne(**connection);
  ASSERT_TRUE(run.outcome.status.ok()) << run.outcome.status.ToString();
  ASSERT_EQ(run.replies.size(), 1u);
  EXPECT_EQ(run.replies[0]->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(run.replies[0]->str, run.replies[0]->len), "hello");
}

TEST(RedisConnectionTest, EndlessLineFailsTheConnectionWithBoundedMemory) {
  HostileServer server([](int fd) {
    WriteAll(fd, "+");
    WriteFiller(fd, kHugeValue);  // no "\r\n", ever
  });
  auto connection = RedisConnection::Connect(server.endpoint(), {}, Clock::now() + 30s);
  ASSERT_TRUE(connection.ok());
  (*connection)->Append({"PING"});
  const int64_t rss_before = PeakRssBytes();
  PipelineRun run = RunOne(**connection);
  EXPECT_LT(PeakRssBytes() - rss_before, kRssSlack);
  EXPECT_FALSE(run.outcome.status.ok());
  EXPECT_FALSE(run.outcome.timed_out);
  EXPECT_NE(run.outcome.status.message().find("more than"), std::string::npos)
      << run.outcome.status.ToString();
  EXPECT_TRUE((*connection)->broken());
}

TEST(RedisConnectionTest, HugeArrayAndHugeUnsunkValueFailOrAreRefused) {
  {
    HostileServer server([](int fd) { WriteAll(fd, "*2000000000\r\n$1\r\nx\r\n"); });
    auto connection = RedisConnection::Connect(server.endpoint(), {}, Clock::now() + 30s);
    ASSERT_TRUE(connection.ok());
    (*connection)->Append({"CLUSTER", "SLOTS"});
    PipelineRun run = RunOne(**connection);
    EXPECT_FALSE(run.outcome.status.ok());
    EXPECT_NE(run.outcome.status.message().find("elements"), std::string::npos)
        << run.outcome.status.ToString();
  }
  {
    HostileServer server([](int fd) {
      WriteAll(fd, "$" + std::to_string(kHugeValue) + "\r\n");
      WriteFiller(fd, kHugeValue);
      WriteAll(fd, "\r\n");
    });
    auto connection = RedisConnection::Connect(server.endpoint(), {}, Clock::now() + 30s);
    ASSERT_TRUE(connection.ok());
    (*connection)->Append({"GET", "no-sink"});
    const int64_t rss_before = PeakRssBytes();
    PipelineRun run = RunOne(**connection);
    EXPECT_LT(PeakRssBytes() - rss_before, kRssSlack);
    ASSERT_TRUE(run.outcome.status.ok()) << run.outcome.status.ToString();
    ASSERT_EQ(run.replies.size(), 1u);
    EXPECT_EQ(run.replies[0]->type, REDIS_REPLY_ERROR);
  }
}

// Opening a store against a server that accepts connections but never answers (SIGSTOP) takes
// connect_timeout_ms, not that plus a command timeout: the command timeout (60 s) is beyond the
// hang guard (30 s), so an open that fails within the guard was ended by the connect timeout,
// however slow the machine.
TEST(RedisConnectionTest, OpeningAgainstAPausedServerHonoursConnectTimeout) {
  if (std::string why = testing::RedisTestSkipReason(); !why.empty())
    KVTIER_SKIP_MISSING_DEPENDENCY(why);
  testing::RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  server.Pause();
  StorageNamespace ns;
  ns.model_id = "m";
  ns.num_layers = 2;
  ns.slot_bytes = 64;
  ns.page_size = 16;
  StorageOptions options;
  options.timeout = 60s;
  const auto start = Clock::now();
  auto opened = OpenStorage("redis://" + server.address() + "?connect_timeout_ms=300", ns, options);
  const auto took = Clock::now() - start;
  server.Resume();
  EXPECT_FALSE(opened.ok());
  EXPECT_LT(took, 30s) << std::chrono::duration<double>(took).count() << " s";
}

}  // namespace
}  // namespace kvtier::storage
