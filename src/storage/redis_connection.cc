// One non-blocking connection to a Redis server and the poll loop that drives pipelines
// (see redis_connection.h).
#include "storage/redis_connection.h"

#if KVTIER_HAVE_HIREDIS

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

namespace kvtier::storage {
namespace {

constexpr size_t kReadChunkBytes = 1 << 20;  // one read(2) of replies
constexpr int kMaxIovecs = 64;               // pieces per sendmsg(2)

int MillisUntil(Deadline deadline) {
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  // Round up, so a poll never returns just before the deadline and spins.
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
}

std::string ErrnoText(int err) { return std::strerror(err); }

// Connects one socket to `address`, bounded by `deadline`; the fd, or -1 with `error` set.
int ConnectSocket(const addrinfo& address, Deadline deadline, std::string& error) {
  const int fd = ::socket(address.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = "socket: " + ErrnoText(errno);
    return -1;
  }
  if (::connect(fd, address.ai_addr, address.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      error = "connect: " + ErrnoText(errno);
      ::close(fd);
      return -1;
    }
    pollfd waiting{fd, POLLOUT, 0};
    for (;;) {
      const int ms = MillisUntil(deadline);
      if (ms == 0) {
        error = "connect timed out";
        ::close(fd);
        return -1;
      }
      const int ready = ::poll(&waiting, 1, ms);
      if (ready > 0) break;
      if (ready < 0 && errno != EINTR) {
        error = "poll: " + ErrnoText(errno);
        ::close(fd);
        return -1;
      }
    }
    int so_error = 0;
    socklen_t length = sizeof(so_error);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &length) != 0 || so_error != 0) {
      error = "connect: " + ErrnoText(so_error != 0 ? so_error : errno);
      ::close(fd);
      return -1;
    }
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

void RedisReplyDeleter::operator()(redisReply* reply) const { freeReplyObject(reply); }

std::string DescribeReply(const redisReply* reply) {
  if (reply == nullptr) return "no reply";
  switch (reply->type) {
    case REDIS_REPLY_ERROR:
    case REDIS_REPLY_STATUS:
      return std::string(reply->str, reply->len);
    case REDIS_REPLY_STRING:
      return fmt::format("a string of {} bytes", reply->len);
    case REDIS_REPLY_INTEGER:
      return fmt::format("integer {}", reply->integer);
    case REDIS_REPLY_NIL:
      return "nil";
    case REDIS_REPLY_ARRAY:
      return fmt::format("an array of {} elements", reply->elements);
    default:
      return fmt::format("a reply of type {}", reply->type);
  }
}

RedisConnection::RedisConnection(int fd, RedisEndpoint endpoint)
    : fd_(fd), endpoint_(std::move(endpoint)), reader_(redisReaderCreate()) {}

RedisConnection::~RedisConnection() {
  if (reader_ != nullptr) redisReaderFree(reader_);
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<RedisConnection>> RedisConnection::Connect(const RedisEndpoint& endpoint,
                                                                  const RedisAuth& auth,
                                                                  Deadline deadline) {
  const std::string where = endpoint.ToString();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  const std::string port = std::to_string(endpoint.port);
  if (const int rc = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &addresses);
      rc != 0) {
    return Status::Unavailable(
        fmt::format("redis {}: cannot resolve the host: {}", where, gai_strerror(rc)));
  }
  std::string error = "no address";
  int fd = -1;
  for (const addrinfo* a = addresses; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ConnectSocket(*a, deadline, error);
  }
  ::freeaddrinfo(addresses);
  if (fd < 0) return Status::Unavailable(fmt::format("redis {}: {}", where, error));

  std::unique_ptr<RedisConnection> connection(new RedisConnection(fd, endpoint));
  if (connection->reader_ == nullptr) {
    return Status::OutOfMemory(fmt::format("redis {}: no memory for a reply reader", where));
  }
  if (!auth.password.empty()) {
    if (auth.user.empty()) {
      connection->Append({"AUTH", auth.password});
    } else {
      connection->Append({"AUTH", auth.user, auth.password});
    }
    std::vector<RedisReplyPtr> replies;
    RedisConnection* connections[] = {connection.get()};
    std::vector<RedisReplyPtr>* reply_lists[] = {&replies};
    PipelineOutcome outcome[1];
    RunPipelines(connections, reply_lists, deadline, outcome);
    if (!outcome[0].status.ok()) {
      return Status::Unavailable(
          fmt::format("redis {}: AUTH got no answer: {}", where, outcome[0].status.message()));
    }
    const redisReply* reply = replies.front().get();
    if (reply->type != REDIS_REPLY_STATUS || std::string_view(reply->str, reply->len) != "OK") {
      return Status::Unavailable(fmt::format("redis {}: AUTH failed{}: {}", where,
                                             auth.user.empty() ? "" : " for user " + auth.user,
                                             DescribeReply(reply)));
    }
  }
  return connection;
}

void RedisConnection::AppendOwned(std::string_view bytes) {
  if (!pieces_.empty() && pieces_.back().data == nullptr &&
      pieces_.back().offset + pieces_.back().size == owned_.size()) {
    pieces_.back().size += bytes.size();
  } else {
    pieces_.push_back(Piece{nullptr, owned_.size(), bytes.size()});
  }
  owned_.append(bytes);
}

void RedisConnection::AppendHeader(size_t argc) {
  char text[32];
  const auto end = fmt::format_to_n(text, sizeof(text), "*{}\r\n", argc).out;
  AppendOwned(std::string_view(text, static_cast<size_t>(end - text)));
}

void RedisConnection::AppendArg(std::string_view arg) {
  char text[32];
  const auto end = fmt::format_to_n(text, sizeof(text), "${}\r\n", arg.size()).out;
  AppendOwned(std::string_view(text, static_cast<size_t>(end - text)));
  AppendOwned(arg);
  AppendOwned("\r\n");
}

void RedisConnection::Append(std::initializer_list<std::string_view> args) {
  AppendHeader(args.size());
  for (std::string_view arg : args) AppendArg(arg);
  ++pending_replies_;
}

void RedisConnection::AppendWithValue(std::initializer_list<std::string_view> args,
                                      std::span<const std::span<const std::byte>> value) {
  AppendHeader(args.size() + 1);
  for (std::string_view arg : args) AppendArg(arg);
  size_t total = 0;
  for (const auto& piece : value) total += piece.size();
  char text[32];
  const auto end = fmt::format_to_n(text, sizeof(text), "${}\r\n", total).out;
  AppendOwned(std::string_view(text, static_cast<size_t>(end - text)));
  for (const auto& piece : value) {
    if (!piece.empty()) pieces_.push_back(Piece{piece.data(), 0, piece.size()});
  }
  AppendOwned("\r\n");
  ++pending_replies_;
}

bool RedisConnection::IdleAndHealthy() const {
  if (broken_ || pending_replies_ != 0 || wants_write()) return false;
  pollfd probe{fd_, POLLIN, 0};
  return ::poll(&probe, 1, 0) == 0;  // readable means EOF, an error or stray bytes
}

Status RedisConnection::Fail(Status status) {
  broken_ = true;
  return status;
}

Status RedisConnection::WriteSome() {
  while (wants_write()) {
    iovec vectors[kMaxIovecs];
    int count = 0;
    for (size_t i = next_piece_; i < pieces_.size() && count < kMaxIovecs; ++i, ++count) {
      const Piece& piece = pieces_[i];
      const std::byte* base = piece.data != nullptr
                                  ? piece.data
                                  : reinterpret_cast<const std::byte*>(owned_.data()) + piece.offset;
      const size_t skip = i == next_piece_ ? next_piece_done_ : 0;
      vectors[count].iov_base = const_cast<std::byte*>(base + skip);
      vectors[count].iov_len = piece.size - skip;
    }
    msghdr message{};
    message.msg_iov = vectors;
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t sent = ::sendmsg(fd_, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::OK();
      return Fail(Status::IOError("send: " + ErrnoText(errno)));
    }
    size_t left = static_cast<size_t>(sent);
    while (left > 0) {
      const size_t in_piece = pieces_[next_piece_].size - next_piece_done_;
      if (left < in_piece) {
        next_piece_done_ += left;
        left = 0;
      } else {
        left -= in_piece;
        ++next_piece_;
        next_piece_done_ = 0;
      }
    }
  }
  pieces_.clear();
  owned_.clear();
  next_piece_ = 0;
  next_piece_done_ = 0;
  return Status::OK();
}

Status RedisConnection::ReadSome(std::vector<RedisReplyPtr>& replies) {
  thread_local std::vector<char> buffer(kReadChunkBytes);
  while (pending_replies_ > 0) {
    const ssize_t got = ::read(fd_, buffer.data(), buffer.size());
    if (got == 0) return Fail(Status::IOError("the server closed the connection"));
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
      if (errno == EINTR) continue;
      return Fail(Status::IOError("read: " + ErrnoText(errno)));
    }
    if (redisReaderFeed(reader_, buffer.data(), static_cast<size_t>(got)) != REDIS_OK) {
      return Fail(Status::IOError(fmt::format("reply parser: {}", reader_->errstr)));
    }
    while (pending_replies_ > 0) {
      void* parsed = nullptr;
      if (redisReaderGetReply(reader_, &parsed) != REDIS_OK) {
        return Fail(Status::IOError(fmt::format("protocol error: {}", reader_->errstr)));
      }
      if (parsed == nullptr) break;  // needs more bytes
      replies.emplace_back(static_cast<redisReply*>(parsed));
      --pending_replies_;
    }
  }
  return Status::OK();
}

void RunPipelines(std::span<RedisConnection* const> connections,
                  std::span<std::vector<RedisReplyPtr>* const> replies, Deadline deadline,
                  std::span<PipelineOutcome> outcomes) {
  const size_t n = connections.size();
  std::vector<size_t> active;
  active.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    outcomes[i] = PipelineOutcome{};
    RedisConnection& c = *connections[i];
    if (c.pending_replies_ > 0 || c.wants_write()) active.push_back(i);
  }
  auto fail = [&](size_t i, Status status, bool timed_out) {
    connections[i]->broken_ = true;
    outcomes[i] = PipelineOutcome{std::move(status), timed_out};
  };
  // Writes go out first; a connection is done once everything is written and answered.
  for (size_t i : active) {
    if (Status s = connections[i]->WriteSome(); !s.ok()) fail(i, std::move(s), false);
  }
  std::vector<pollfd> waiting;
  while (true) {
    std::erase_if(active, [&](size_t i) {
      const RedisConnection& c = *connections[i];
      return c.broken_ || (c.pending_replies_ == 0 && !c.wants_write());
    });
    if (active.empty()) return;
    const int ms = MillisUntil(deadline);
    if (ms == 0) {
      for (size_t i : active) fail(i, Status::Unavailable("timed out"), true);
      return;
    }
    waiting.clear();
    for (size_t i : active) {
      const RedisConnection& c = *connections[i];
      waiting.push_back(pollfd{c.fd_, static_cast<short>(POLLIN | (c.wants_write() ? POLLOUT : 0)),
                               0});
    }
    const int ready = ::poll(waiting.data(), waiting.size(), ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      const std::string why = "poll: " + ErrnoText(errno);
      for (size_t i : active) fail(i, Status::IOError(why), false);
      return;
    }
    for (size_t k = 0; k < waiting.size(); ++k) {
      const size_t i = active[k];
      RedisConnection& c = *connections[i];
      if (waiting[k].revents & POLLOUT) {
        if (Status s = c.WriteSome(); !s.ok()) {
          fail(i, std::move(s), false);
          continue;
        }
      }
      if (waiting[k].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (Status s = c.ReadSome(*replies[i]); !s.ok()) fail(i, std::move(s), false);
      }
    }
  }
}

}  // namespace kvtier::storage

#endif  // KVTIER_HAVE_HIREDIS
