// Internal: one TCP connection to one Redis server, driven without blocking.
//
// Commands are encoded here (RESP arrays of bulk strings) into an output queue of pieces; a value
// argument may be a list of caller spans that are written straight from caller memory (sendmsg
// with an iovec), so a page is never copied on its way out. A command may name a sink, caller
// spans for its reply: a bulk-string reply of exactly the sink's size is read straight into them
// (readv), so a page is not copied on its way in either. Every other reply is parsed by hiredis's
// reader (the protocol), fed from non-blocking reads. `RunPipelines` drives several
// connections at once with poll(2) until each has every reply it waits for or a deadline passes,
// so one batch costs one round trip per server and never waits past its deadline.
//
// Bounded replies: a reply never makes this side hold more than it can use. A bulk-string reply
// to a command with a sink that is larger than the sink is skipped as it streams in (never
// buffered) and its command gets an error reply ("kvtier: a reply of N bytes where at most M were
// expected"); the connection stays usable. Any other reply is limited to 4 MiB, and an array
// reply to 2^20 elements: past that the connection fails with a protocol error. (hiredis 0.14,
// Debian 12's, has no maxelements or bulk length limit of its own.)
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
                                                          const RedisAuth& auth, Deadline deadline);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Queues a command of `args` (copied). Its reply is counted in pending_replies(). With a
  // `sink`, a bulk-string reply of exactly its total size lands in it and its reply is a null
  // RedisReplyPtr; REQUIRES the sink stays alive until the pipeline has run.
  void Append(std::initializer_list<std::string_view> args,
              std::span<const std::span<std::byte>> sink = {});
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
  // True when hiredis's reader holds no bytes of an unfinished reply.
  bool ReaderIdle() const;
  // Starts reading a bulk reply into the front sink when `in_` begins with its header "$<n>\r\n"
  // and n is the sink's size. False (nothing consumed) otherwise, or when more bytes are needed
  // to tell (then *need_more).
  bool StartSinkRead(bool* need_more);
  // Copies up to `n` bytes to the sink at the cursor; returns the number copied.
  size_t SinkWrite(const char* data, size_t n);
  void FinishReply(std::vector<RedisReplyPtr>& replies, RedisReplyPtr reply);
  // The most bytes (framing included) the next reply may have: its sink's size plus framing, or
  // the limit of replies without a sink.
  size_t ReplyLimit() const;

  int fd_ = -1;
  RedisEndpoint endpoint_;
  redisReader* reader_ = nullptr;
  std::string owned_;           // encoded protocol bytes of the queue
  std::vector<Piece> pieces_;   // the output queue, in order
  size_t next_piece_ = 0;       // first piece not fully written
  size_t next_piece_done_ = 0;  // bytes of pieces_[next_piece_] already written
  int pending_replies_ = 0;
  bool broken_ = false;

  // Replies: one sink per pending reply (empty: none), in order.
  std::vector<std::span<const std::span<std::byte>>> sinks_;
  size_t next_sink_ = 0;
  // Bytes read and not yet handled: in_[in_begin_, in_end_).
  std::vector<char> in_;
  size_t in_begin_ = 0, in_end_ = 0;
  // A bulk reply being read into sinks_[next_sink_]: body bytes left, then its "\r\n".
  size_t sink_left_ = 0;
  int sink_crlf_left_ = 0;
  size_t sink_span_ = 0, sink_offset_ = 0;  // the cursor in the sink
  // Bytes of the reply hiredis is parsing that it has not been given yet (SIZE_MAX: unknown).
  size_t hiredis_left_ = 0;
  // Bytes given to hiredis since it was last between replies.
  size_t hiredis_fed_ = 0;
  // A reply being skipped: bytes left, its size and the limit it broke.
  size_t discard_left_ = 0, discard_total_ = 0, discard_limit_ = 0;
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
