// Internal: one TCP connection to one Redis server, driven without blocking.
//
// Commands are encoded here (RESP arrays of bulk strings) into an output queue of pieces; a value
// argument may be a list of caller spans that are written straight from caller memory (sendmsg
// with an iovec), so a page is never copied on its way out. Replies are parsed by hiredis's
// reader (the protocol), fed from large non-blocking reads. `RunPipelines` drives several
// connections at once with poll(2) until each has every reply it waits for or a deadline passes,
// so one batch costs one round trip per server and never waits past its deadline.
//
// A connection that saw an I/O error, a protocol error or a deadline is `broken()`: its stream
// position is unknown and it must be dropped, never reused.
//
// Thread safety: a connection is used by one thread at a time (the pools hand it out).
#pragma once

#if KVTIER_HAVE_HIREDIS

#include <chrono>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "storage/redis_url.h"

struct redisReader;
struct redisReply;

namespace kvtier::storage {

struct PipelineOutcome;
using Deadline = std::chrono::steady_clock::time_point;

struct RedisReplyDeleter {
  void operator()(redisReply* reply) const;
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyDeleter>;

// Credentials for AUTH after connecting (none when password is empty).
struct RedisAuth {
  std::string user;
  std::string password;
};

class RedisConnection {
 public:
  // Connects to `endpoint` (a non-blocking connect bounded by `deadline`), turns on TCP_NODELAY,
  // and sends AUTH when `auth` has a password. Unavailable naming the endpoint and the cause
  // (refused, timed out, AUTH rejected with the server's message).
  static Result<std::unique_ptr<RedisConnection>> Connect(const RedisEndpoint& endpoint,
                                                          const RedisAuth& auth,
                                                          Deadline deadline);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Queues a command of `args` (copied). Its reply is counted in pending_replies().
  void Append(std::initializer_list<std::string_view> args);
  // Queues `args` followed by one more argument, the concatenation of `value` pieces, which are
  // borrowed: REQUIRES they stay alive and unchanged until the pipeline has run.
  void AppendWithValue(std::initializer_list<std::string_view> args,
                       std::span<const std::span<const std::byte>> value);

  int pending_replies() const { return pending_replies_; }
  bool broken() const { return broken_; }
  const RedisEndpoint& endpoint() const { return endpoint_; }
  // True when the idle connection looks usable: not broken and nothing (EOF, stray bytes) is
  // waiting to be read.
  bool IdleAndHealthy() const;

 private:
  friend void RunPipelines(std::span<RedisConnection* const>,
                           std::span<std::vector<RedisReplyPtr>* const>, Deadline,
                           std::span<struct PipelineOutcome>);
  struct Piece {
    const std::byte* data = nullptr;  // borrowed, or nullptr for bytes in owned_
    size_t offset = 0;                // into owned_ when data == nullptr
    size_t size = 0;
  };

  RedisConnection(int fd, RedisEndpoint endpoint);
  void AppendOwned(std::string_view bytes);
  void AppendHeader(size_t argc);
  void AppendArg(std::string_view arg);
  bool wants_write() const { return next_piece_ < pieces_.size(); }
  // One non-blocking sendmsg of what is queued; IOError when the socket fails.
  Status WriteSome();
  // Non-blocking reads until the socket has no more; replies parsed so far go to `replies`.
  Status ReadSome(std::vector<RedisReplyPtr>& replies);
  Status Fail(Status status);

  int fd_ = -1;
  RedisEndpoint endpoint_;
  redisReader* reader_ = nullptr;
  std::string owned_;           // encoded protocol bytes of the queue
  std::vector<Piece> pieces_;   // the output queue, in order
  size_t next_piece_ = 0;       // first piece not fully written
  size_t next_piece_done_ = 0;  // bytes of pieces_[next_piece_] already written
  int pending_replies_ = 0;
  bool broken_ = false;
};

// How one connection's pipeline ended: OK (every reply read), or why it stopped early, leaving
// the connection broken (`timed_out` when the deadline passed, else an I/O or protocol error).
struct PipelineOutcome {
  Status status;
  bool timed_out = false;
};

// Sends every queued command of each connection and reads its replies into `*replies[i]`, all
// connections at once, until each has no pending reply or `deadline` passes.
// REQUIRES: the three spans have the same size; no connection is broken.
void RunPipelines(std::span<RedisConnection* const> connections,
                  std::span<std::vector<RedisReplyPtr>* const> replies, Deadline deadline,
                  std::span<PipelineOutcome> outcomes);

// The text of an error or status reply, or a short description of any other reply.
std::string DescribeReply(const redisReply* reply);

}  // namespace kvtier::storage

#endif  // KVTIER_HAVE_HIREDIS
