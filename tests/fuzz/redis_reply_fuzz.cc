// libFuzzer target over the Redis reply reader (src/storage/redis/redis_connection.h): whatever
// bytes a server sends back to a pipeline, over a real loopback TCP connection.
//
// Input: byte 0 picks the pipeline (1-4 commands; each GET with or without a sink of 1-64
// bytes), the rest is what the "server" (this process, on a listening socket) answers before it
// shuts its side down. Properties checked:
//   1. no crash, out-of-bounds access, leak or undefined behaviour (ASan/UBSan/LSan), no hang;
//   2. a pipeline that ends OK has one reply per command, and a sunk reply (null) only for a
//      command with a sink; a failed one leaves the connection broken and never more replies
//      than commands;
//   3. memory stays bounded (libFuzzer's -rss_limit_mb).
// Any violation aborts (a finding). Run: build-fuzz/tests/fuzz/kvtier_fuzz_redis_reply
// -max_total_time=30
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "storage/redis/redis_connection.h"

namespace {

namespace storage = kvtier::storage;

void Check(bool ok) {
  if (!ok) std::abort();
}

// One listening loopback socket for the whole run.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    Check(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    Check(::listen(fd, 16) == 0);
    Check(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port = ntohs(address.sin_port);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Listener listener;
  if (size == 0) return 0;
  const uint8_t plan = data[0];
  const std::span<const uint8_t> answer(data + 1, size - 1);

  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  auto connection = storage::RedisConnection::Connect({"127.0.0.1", listener.port}, {}, deadline);
  Check(connection.ok());
  const int server = ::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC);
  Check(server >= 0);
  // The answer fits the socket buffers of loopback (libFuzzer's default -max_len is 4096).
  size_t sent = 0;
  while (sent < answer.size()) {
    const ssize_t n = ::send(server, answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  ::shutdown(server, SHUT_WR);

  const int commands = 1 + (plan & 3);
  std::array<std::vector<std::byte>, 4> pages;
  std::array<std::span<std::byte>, 4> sinks;
  std::vector<bool> has_sink;
  for (int c = 0; c < commands; ++c) {
    const bool sink = (plan >> (2 + c)) & 1;
    has_sink.push_back(sink);
    if (sink) {
      pages[c].assign(1 + ((plan * 7 + c * 13) % 64), std::byte{0});
      sinks[c] = pages[c];
      (*connection)->Append({"GET", "k"}, std::span<const std::span<std::byte>>(&sinks[c], 1));
    } else {
      (*connection)->Append({"GET", "k"});
    }
  }
  std::vector<storage::RedisReplyPtr> replies;
  storage::RedisConnection* connections[] = {connection->get()};
  std::vector<storage::RedisReplyPtr>* lists[] = {&replies};
  storage::PipelineOutcome outcome[1];
  storage::RunPipelines(connections, lists, deadline, outcome);
  ::close(server);

  Check(static_cast<int>(replies.size()) <= commands);
  if (outcome[0].status.ok()) {
    Check(static_cast<int>(replies.size()) == commands);
    for (int c = 0; c < commands; ++c) {
      if (replies[c] == nullptr) Check(has_sink[c]);
      (void)storage::DescribeReply(replies[c].get());
    }
  } else {
    Check((*connection)->broken());
    Check(!outcome[0].timed_out);  // the server closed its side: an error, never the deadline
  }
  return 0;
}
