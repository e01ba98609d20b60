// One non-blocking connection to a Redis server and the poll loop that drives pipelines
// (see redis_connection.h).
#include "storage/redis/redis_connection.h"

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
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>

namespace kvtier::storage {
namespace {

constexpr size_t kReadChunkBytes = 256 << 10;  // one read(2) of replies not read into a sink
constexpr int kSinkIovecs = 8;                 // sink spans per readv(2)
constexpr size_t kMaxLineBytes = 4096;         // the first line of a reply
constexpr int kMaxIovecs = 64;                 // pieces per sendmsg(2)
// Bounds of what a reply may make this side hold (redis_connection.h, "Bounded replies").
constexpr size_t kMaxUnsunkReplyBytes = size_t{4} << 20;  // EXISTS, SET, CLUSTER SLOTS replies
constexpr long long kMaxArrayElements = 1 << 20;
constexpr size_t kSinkReplySlackBytes = 64;  // a sink reply's "$<n>\r\n" and "\r\n"

int MillisUntil(Deadline deadline) {
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  // Round up, so a poll never returns just before the deadline and spins.
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
}

std::string ErrnoText(int err) { return std::strerror(err); }

constexpr size_t kUnknownBytes = std::numeric_limits<size_t>::max();

// The bytes of the reply that starts at `p` (n bytes there): a simple string, error, integer or
// bulk string has a length its first line tells; an array (or anything else) is kUnknownBytes.
// Sets *need_more (returning 0) when that first line has not arrived yet.
size_t ReplyBytes(const char* p, size_t n, bool* need_more) {
  *need_more = false;
  if (n == 0) {
    *need_more = true;
    return 0;
  }
  if (p[0] != '+' && p[0] != '-' && p[0] != ':' && p[0] != '$') return kUnknownBytes;
  const char* cr = static_cast<const char*>(std::memchr(p, '\r', n));
  if (cr == nullptr || cr + 1 >= p + n) {
    *need_more = n < kMaxLineBytes;  // a longer line is malformed: let hiredis say so
    return *need_more ? 0 : kUnknownBytes;
  }
  const size_t line = static_cast<size_t>(cr - p) + 2;
  if (p[0] != '$') return line;
  long long length = 0;
  const auto [end, ec] = std::from_chars(p + 1, cr, length);
  if (ec != std::errc() || end != cr || length < -1) return kUnknownBytes;
  return length < 0 ? line : line + static_cast<size_t>(length) + 2;
}

// An error reply made here (freed by freeReplyObject, as hiredis's own).
RedisReplyPtr ErrorReply(std::string_view text) {
  auto* reply = static_cast<redisReply*>(std::calloc(1, sizeof(redisReply)));
  char* str = static_cast<char*>(std::malloc(text.size() + 1));
  if (reply == nullptr || str == nullptr) {
    std::free(reply);
    std::free(str);
    return nullptr;
  }
  std::memcpy(str, text.data(), text.size());
  str[text.size()] = '\0';
  reply->type = REDIS_REPLY_ERROR;
  reply->str = str;
  reply->len = text.size();
  return RedisReplyPtr(reply);
}

// The element count of an array reply whose first line ("*<n>\r\n") is in [p, p + n), or -1
// when it is not an array or that line has not arrived.
long long ArrayElements(const char* p, size_t n) {
  if (n == 0 || p[0] != '*') return -1;
  const char* cr = static_cast<const char*>(std::memchr(p, '\r', std::min(n, kMaxLineBytes)));
  if (cr == nullptr) return -1;
  long long count = -1;
  const auto [end, ec] = std::from_chars(p + 1, cr, count);
  return ec == std::errc() && end == cr ? count : -1;
}

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

void RedisConnection::Append(std::initializer_list<std::string_view> args,
                             std::span<const std::span<std::byte>> sink) {
  AppendHeader(args.size());
  for (std::string_view arg : args) AppendArg(arg);
  sinks_.push_back(sink);
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
  sinks_.emplace_back();
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
      const std::byte* base =
          piece.data != nullptr ? piece.data
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

bool RedisConnection::ReaderIdle() const {
  // A GetReply call that found no bytes leaves the reader at task 0 with no type read yet: that
  // is between replies too.
  const bool no_task = reader_->ridx == -1 || (reader_->ridx == 0 && reader_->rstack[0].type < 0);
  return no_task && reader_->pos == reader_->len;
}

bool RedisConnection::StartSinkRead(bool* need_more) {
  *need_more = false;
  const std::span<const std::span<std::byte>> sink = sinks_[next_sink_];
  size_t sink_bytes = 0;
  for (const auto& span : sink) sink_bytes += span.size();
  const char* begin = in_.data() + in_begin_;
  const size_t available = in_end_ - in_begin_;
  if (available == 0 || begin[0] != '$') return false;
  constexpr size_t kMaxHeader = 24;  // "$" + 20 digits + "\r\n"
  const char* cr =
      static_cast<const char*>(std::memchr(begin, '\r', std::min(available, kMaxHeader)));
  if (cr == nullptr || cr + 1 >= begin + available) {
    *need_more = available < kMaxHeader;
    return false;
  }
  size_t length = 0;
  const auto [end, ec] = std::from_chars(begin + 1, cr, length);
  if (ec != std::errc() || end != cr || cr[1] != '\n' || length != sink_bytes) return false;
  in_begin_ += static_cast<size_t>(cr + 2 - begin);
  sink_left_ = length;
  sink_crlf_left_ = 2;
  sink_span_ = 0;
  sink_offset_ = 0;
  return true;
}

size_t RedisConnection::SinkWrite(const char* data, size_t n) {
  const std::span<const std::span<std::byte>> sink = sinks_[next_sink_];
  size_t done = 0;
  while (done < n && sink_span_ < sink.size()) {
    const std::span<std::byte> span = sink[sink_span_];
    const size_t take = std::min(n - done, span.size() - sink_offset_);
    std::memcpy(span.data() + sink_offset_, data + done, take);
    done += take;
    sink_offset_ += take;
    if (sink_offset_ == span.size()) {
      ++sink_span_;
      sink_offset_ = 0;
    }
  }
  return done;
}

void RedisConnection::FinishReply(std::vector<RedisReplyPtr>& replies, RedisReplyPtr reply) {
  replies.push_back(std::move(reply));
  --pending_replies_;
  if (++next_sink_ == sinks_.size() || pending_replies_ == 0) {
    sinks_.clear();
    next_sink_ = 0;
  }
}

size_t RedisConnection::ReplyLimit() const {
  const std::span<const std::span<std::byte>> sink = sinks_[next_sink_];
  if (sink.empty()) return kMaxUnsunkReplyBytes;
  size_t bytes = kSinkReplySlackBytes;
  for (const auto& span : sink) bytes += span.size();
  return bytes;
}

Status RedisConnection::ReadSome(std::vector<RedisReplyPtr>& replies) {
  if (in_.empty()) in_.resize(kReadChunkBytes);
  while (pending_replies_ > 0) {
    // A reply too large for what its command expects, skipped as it streams in; its command
    // gets an error reply.
    if (discard_left_ > 0 && in_begin_ < in_end_) {
      const size_t n = std::min(discard_left_, in_end_ - in_begin_);
      in_begin_ += n;
      discard_left_ -= n;
      if (discard_left_ == 0) {
        RedisReplyPtr error = ErrorReply(
            fmt::format("kvtier: a reply of {} bytes where at most {} were expected (discarded)",
                        discard_total_, discard_limit_));
        if (error == nullptr) return Fail(Status::OutOfMemory("no memory for an error reply"));
        FinishReply(replies, std::move(error));
      }
      continue;
    }
    // A bulk reply on its way into a sink: first the bytes already read, then straight from the
    // socket into the caller's memory, then its "\r\n".
    if (sink_left_ > 0 && in_begin_ < in_end_) {
      const size_t n = SinkWrite(in_.data() + in_begin_, std::min(sink_left_, in_end_ - in_begin_));
      in_begin_ += n;
      sink_left_ -= n;
      continue;
    }
    if (sink_left_ > 0) {
      iovec vectors[kSinkIovecs];
      int count = 0;
      size_t limit = sink_left_;
      const auto sink = sinks_[next_sink_];
      for (size_t i = sink_span_; i < sink.size() && count < kSinkIovecs && limit > 0; ++i) {
        const size_t skip = i == sink_span_ ? sink_offset_ : 0;
        const size_t take = std::min(limit, sink[i].size() - skip);
        vectors[count].iov_base = sink[i].data() + skip;
        vectors[count].iov_len = take;
        limit -= take;
        ++count;
      }
      const ssize_t got = ::readv(fd_, vectors, count);
      if (got == 0) return Fail(Status::IOError("the server closed the connection"));
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
        if (errno == EINTR) continue;
        return Fail(Status::IOError("read: " + ErrnoText(errno)));
      }
      // Advance the cursor over what readv wrote in place.
      size_t left = static_cast<size_t>(got);
      sink_left_ -= left;
      while (left > 0) {
        const size_t in_span = sink[sink_span_].size() - sink_offset_;
        const size_t step = std::min(left, in_span);
        sink_offset_ += step;
        left -= step;
        if (sink_offset_ == sink[sink_span_].size()) {
          ++sink_span_;
          sink_offset_ = 0;
        }
      }
      continue;
    }
    if (sink_crlf_left_ > 0 && in_begin_ < in_end_) {
      const char expected = sink_crlf_left_ == 2 ? '\r' : '\n';
      if (in_[in_begin_++] != expected) {
        return Fail(Status::IOError("protocol error: a bulk reply does not end in CRLF"));
      }
      if (--sink_crlf_left_ == 0) FinishReply(replies, nullptr);
      continue;
    }
    if (sink_crlf_left_ == 0 && in_begin_ < in_end_) {
      bool need_more = false;
      if (ReaderIdle()) {
        if (!sinks_[next_sink_].empty() && StartSinkRead(&need_more)) continue;
        // hiredis parses this reply; give it this reply's bytes only (when its length can be
        // told), so the replies after it can still be read into their sinks.
        if (!need_more) {
          const char* start = in_.data() + in_begin_;
          const size_t available = in_end_ - in_begin_;
          hiredis_left_ = ReplyBytes(start, available, &need_more);
          hiredis_fed_ = 0;
          const size_t limit = ReplyLimit();
          if (!need_more && hiredis_left_ != kUnknownBytes && hiredis_left_ > limit) {
            discard_left_ = discard_total_ = hiredis_left_;
            discard_limit_ = limit;
            hiredis_left_ = 0;
            continue;
          }
          if (const long long elements = ArrayElements(start, available);
              elements > kMaxArrayElements) {
            return Fail(Status::IOError(
                fmt::format("protocol error: an array reply of {} elements (at most {} accepted)",
                            elements, kMaxArrayElements)));
          }
        }
      }
      if (!need_more) {
        if (hiredis_left_ == 0) hiredis_left_ = kUnknownBytes;  // never feed nothing
        const size_t take = std::min(in_end_ - in_begin_, hiredis_left_);
        if (redisReaderFeed(reader_, in_.data() + in_begin_, take) != REDIS_OK) {
          return Fail(Status::IOError(fmt::format("reply parser: {}", reader_->errstr)));
        }
        in_begin_ += take;
        if (hiredis_left_ != kUnknownBytes) hiredis_left_ -= take;
        // A reply whose length its first line does not tell (an array, an unterminated line)
        // is bounded by the bytes given to hiredis for it.
        hiredis_fed_ += take;
        if (hiredis_left_ == kUnknownBytes && hiredis_fed_ > kMaxUnsunkReplyBytes) {
          return Fail(Status::IOError(
              fmt::format("protocol error: a reply of more than {} bytes", kMaxUnsunkReplyBytes)));
        }
        while (pending_replies_ > 0) {
          void* parsed = nullptr;
          if (redisReaderGetReply(reader_, &parsed) != REDIS_OK) {
            return Fail(Status::IOError(fmt::format("protocol error: {}", reader_->errstr)));
          }
          if (parsed == nullptr) break;  // needs more bytes
          FinishReply(replies, RedisReplyPtr(static_cast<redisReply*>(parsed)));
        }
        if (ReaderIdle()) hiredis_fed_ = 0;
        continue;
      }
    }
    // Read more: keep unhandled bytes at the front of the buffer.
    if (in_begin_ == in_end_) {
      in_begin_ = in_end_ = 0;
    } else if (in_begin_ > 0) {
      std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
      in_end_ -= in_begin_;
      in_begin_ = 0;
    }
    const ssize_t got = ::read(fd_, in_.data() + in_end_, in_.size() - in_end_);
    if (got == 0) return Fail(Status::IOError("the server closed the connection"));
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
      if (errno == EINTR) continue;
      return Fail(Status::IOError("read: " + ErrnoText(errno)));
    }
    in_end_ += static_cast<size_t>(got);
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
      waiting.push_back(
          pollfd{c.fd_, static_cast<short>(POLLIN | (c.wants_write() ? POLLOUT : 0)), 0});
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
