// The `redis://` and `redis+cluster://` storage backends (redis_backend.h).
//
// Every page is one Redis string named `<namespace name>/<key hex>` whose value is the shared
// page format (page_format.h: header ‖ payload), so a value that does not check out is a miss.
// A batch becomes one pipelined round trip per server (RedisClient); a Set sends the header and
// the caller's page segments straight from their memory; a Get reads a value of the expected size
// straight into [a header buffer ‖ the caller's segments] and then checks the header and the
// payload's checksum there (any other value is parsed by hiredis, checked and copied). Batches of
// large pages go out in chunks of about kChunkBytes, so a batch never holds more than that many
// reply bytes.
//
// Pages of at least the URL's header_last_bytes are written header-last, because their checksum
// (a pass over cold memory) would otherwise delay the first byte sent: `SET name <blank header ‖
// payload>` goes out at once while a ChecksumPool thread computes the payload's checksum, and
// `SETRANGE name 0 <header>` follows in a second round trip. A reader in between finds the blank
// header and reads a miss (kAbsent); EXISTS already counts the page. Two writers of one key can
// leave one's header over the other's payload: a checksum mismatch, a miss. A SETRANGE that
// fails leaves the blank value (a miss until the next Set of that page) and fails the page.
//
// Thread safety: the hooks run on several I/O threads at once; RedisClient and ChecksumPool are
// thread-safe and the backend has no other mutable state.
#include "storage/redis/redis_backend.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <atomic>

#include "storage/page_format.h"
#include "storage/redis/checksum_pool.h"
#include "storage/redis/redis_client.h"
#include "storage/redis_url.h"
#include "util/log.h"

namespace kvtier::storage {
namespace {

using Clock = std::chrono::steady_clock;

// Value bytes per pipelined round trip of a Get or Set (at least one page).
constexpr int64_t kChunkBytes = int64_t{64} << 20;

PageStatus FromOutcome(const RedisOp& op) {
  return op.outcome == RedisOpOutcome::kTimedOut ? PageStatus::kTimedOut : PageStatus::kFailed;
}

// A write's error reply: "OOM ..." (the server is at its maxmemory and may not evict) is no room,
// anything else a failure.
bool IsOutOfMemoryReply(const redisReply& reply) {
  const std::string_view text(reply.str != nullptr ? reply.str : "", reply.len);
  return reply.type == REDIS_REPLY_ERROR && text.starts_with("OOM");
}

class RedisBackend final : public StorageBackend {
 public:
  RedisBackend(std::string url, const StorageNamespace& ns, const StorageOptions& options,
               std::unique_ptr<RedisClient> client, int64_t header_last_bytes)
      : StorageBackend(std::move(url), ns, options),
        client_(std::move(client)),
        namespace_hash_(ns.Hash()),
        name_prefix_(ns.Name() + "/"),
        pages_per_chunk_(static_cast<size_t>(
            std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, ns.page_bytes())))),
        checksum_pool_(header_last_bytes > 0 && ns.page_bytes() >= header_last_bytes
                           ? std::make_unique<ChecksumPool>(options.io_threads)
                           : nullptr) {}
  ~RedisBackend() override { Close(); }

  Status Open() { return Start(); }

 protected:
  ExistsResult DoExists(std::span<const PageKey> keys, Deadline deadline) override {
    std::vector<RedisOp> ops = OpsFor("EXISTS", keys);
    client_->Execute(ops, deadline);
    ExistsResult result;
    for (const RedisOp& op : ops) {
      if (op.outcome != RedisOpOutcome::kReplied) {
        // Nothing is known past a page that could not be asked about; when it is the first,
        // say why.
        if (result.leading == 0) result.status = Status::Unavailable(op.error);
        break;
      }
      if (op.reply->type != REDIS_REPLY_INTEGER || op.reply->integer != 1) break;
      ++result.leading;
    }
    return result;
  }

  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Deadline deadline) override {
    using Header = std::array<std::byte, kPageHeaderBytes>;
    using Sink = std::array<std::span<std::byte>, 1 + PageBuffer::kMaxSegments>;
    for (size_t first = 0; first < keys.size(); first += pages_per_chunk_) {
      const size_t count = std::min(pages_per_chunk_, keys.size() - first);
      std::vector<RedisOp> ops = OpsFor("GET", keys.subspan(first, count));
      // A value of the expected size is read straight into [header ‖ the caller's segments].
      std::vector<Header> headers(count);
      std::vector<Sink> sinks(count);
      for (size_t i = 0; i < count; ++i) {
        const PageBuffer& buffer = buffers[first + i];
        sinks[i][0] = headers[i];
        for (int s = 0; s < buffer.num_segments; ++s) sinks[i][1 + s] = buffer.segments[s];
        ops[i].sink = std::span<const std::span<std::byte>>(
            sinks[i].data(), static_cast<size_t>(1 + buffer.num_segments));
      }
      client_->Execute(ops, deadline);
      for (size_t i = 0; i < count; ++i) {
        const RedisOp& op = ops[i];
        const size_t page = first + i;
        if (op.outcome != RedisOpOutcome::kReplied) {
          out[page] = FromOutcome(op);
        } else if (op.sunk && IsBlankPageHeader(headers[i])) {
          out[page] = PageStatus::kAbsent;  // a header-last Set not finished (or abandoned)
        } else if (op.sunk) {
          PageHeader header;
          out[page] = ParsePageHeader(headers[i], namespace_hash_, keys[page],
                                      static_cast<uint64_t>(buffers[page].bytes()), &header);
          if (out[page] == PageStatus::kOk) out[page] = CheckPayload(header, buffers[page]);
        } else if (op.reply->type == REDIS_REPLY_NIL) {
          out[page] = PageStatus::kAbsent;
        } else if (op.reply->type == REDIS_REPLY_STRING) {
          const auto value = std::as_bytes(std::span<const char>(op.reply->str, op.reply->len));
          out[page] = ReadPageValue(value, namespace_hash_, keys[page], buffers[page]);
        } else if (op.reply->type == REDIS_REPLY_ERROR &&
                   std::string_view(op.reply->str, op.reply->len).starts_with("WRONGTYPE")) {
          // A key of another type (a list, a hash) where a page should be: no page, corrupt, so
          // the cache removes it and the page is stored again.
          out[page] = PageStatus::kCorrupt;
        } else {
          out[page] = PageStatus::kFailed;  // another error reply (LOADING, ...)
        }
      }
    }
  }

  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Deadline deadline) override {
    for (size_t first = 0; first < keys.size(); first += pages_per_chunk_) {
      const size_t count = std::min(pages_per_chunk_, keys.size() - first);
      if (checksum_pool_ != nullptr) {
        SetHeaderLast(keys.subspan(first, count), buffers.subspan(first, count),
                      out.subspan(first, count), deadline);
      } else {
        SetInOne(keys.subspan(first, count), buffers.subspan(first, count),
                 out.subspan(first, count), deadline);
      }
    }
  }

  void DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                Deadline deadline) override {
    std::vector<RedisOp> ops = OpsFor("DEL", keys);
    client_->Execute(ops, deadline);
    for (size_t i = 0; i < keys.size(); ++i) {
      const RedisOp& op = ops[i];
      if (op.outcome != RedisOpOutcome::kReplied) {
        out[i] = FromOutcome(op);
      } else {
        out[i] = op.reply->type == REDIS_REPLY_INTEGER ? PageStatus::kOk : PageStatus::kFailed;
      }
    }
  }

 private:
  using Header = std::array<std::byte, kPageHeaderBytes>;
  using Pieces = std::array<std::span<const std::byte>, 1 + PageBuffer::kMaxSegments>;

  // `SET name <header ‖ payload>` per page, one round trip.
  void SetInOne(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                std::span<PageStatus> out, Deadline deadline) {
    const size_t count = keys.size();
    std::vector<RedisOp> ops = OpsFor("SET", keys);
    std::vector<Header> headers(count);
    std::vector<Pieces> pieces(count);
    for (size_t i = 0; i < count; ++i) {
      EncodePageHeader(namespace_hash_, keys[i], buffers[i], headers[i]);
      ops[i].value = ValueOf(headers[i], buffers[i], pieces[i]);
    }
    client_->Execute(ops, deadline);
    for (size_t i = 0; i < count; ++i) out[i] = SetOutcome(ops[i]);
  }

  // `SET name <blank header ‖ payload>` per page while the checksums are computed, then
  // `SETRANGE name 0 <header>` for the pages that were stored: two round trips.
  void SetHeaderLast(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                     std::span<PageStatus> out, Deadline deadline) {
    static constexpr Header kBlank{};
    const size_t count = keys.size();
    std::vector<uint64_t> checksums(count);
    ChecksumPool::Batch batch(*checksum_pool_);  // waits for its jobs even on an early return
    for (size_t i = 0; i < count; ++i) batch.Add(buffers[i], &checksums[i]);

    std::vector<RedisOp> sets = OpsFor("SET", keys);
    std::vector<Pieces> pieces(count);
    for (size_t i = 0; i < count; ++i) sets[i].value = ValueOf(kBlank, buffers[i], pieces[i]);
    client_->Execute(sets, deadline);
    batch.Wait();

    std::vector<Header> headers(count);
    std::vector<std::span<const std::byte>> header_pieces(count);
    std::vector<RedisOp> ranges;
    std::vector<size_t> range_page;  // the page of each SETRANGE
    for (size_t i = 0; i < count; ++i) {
      out[i] = SetOutcome(sets[i]);
      if (out[i] != PageStatus::kOk) continue;
      PageHeader header =
          NewPageHeader(namespace_hash_, keys[i], static_cast<uint64_t>(buffers[i].bytes()));
      header.payload_checksum = checksums[i];
      EncodePageHeader(header, headers[i]);
      header_pieces[i] = headers[i];
      RedisOp op;
      op.verb = "SETRANGE";
      op.key = std::move(sets[i].key);
      op.offset = "0";
      op.value = std::span<const std::span<const std::byte>>(&header_pieces[i], 1);
      ranges.push_back(std::move(op));
      range_page.push_back(i);
    }
    if (ranges.empty()) return;
    client_->Execute(ranges, deadline);
    for (size_t r = 0; r < ranges.size(); ++r) {
      const RedisOp& op = ranges[r];
      const size_t i = range_page[r];
      if (op.outcome != RedisOpOutcome::kReplied) {
        out[i] = FromOutcome(op);
      } else {
        // The reply is the value's length: anything else means the key changed in between
        // (removed, or replaced by another size) and the value is not this page.
        const auto expected = static_cast<long long>(kPageHeaderBytes) + buffers[i].bytes();
        const bool ok = op.reply->type == REDIS_REPLY_INTEGER && op.reply->integer == expected;
        out[i] = ok ? PageStatus::kOk : FromWriteError(*op.reply);
      }
    }
  }

  // The value pieces [header ‖ the buffer's segments], in `pieces`.
  static std::span<const std::span<const std::byte>> ValueOf(const Header& header,
                                                             const PageBuffer& buffer,
                                                             Pieces& pieces) {
    pieces[0] = header;
    for (int s = 0; s < buffer.num_segments; ++s) pieces[1 + s] = buffer.segments[s];
    return std::span<const std::span<const std::byte>>(
        pieces.data(), static_cast<size_t>(1 + buffer.num_segments));
  }

  // A write's error reply (FromWriteError's kinds): OOM is no room, counted and said at the 1st,
  // 2nd, 4th ... time (a server with maxmemory-policy noeviction refuses every write once full:
  // 19,209 refused writes went unsaid in issue 36's probe); anything else a failure.
  PageStatus FromWriteError(const redisReply& reply) {
    if (!IsOutOfMemoryReply(reply)) return PageStatus::kFailed;
    const int64_t n = refused_.fetch_add(1, std::memory_order_relaxed) + 1;
    if ((n & (n - 1)) == 0) {
      util::Log(util::LogLevel::kWarning,
                "storage {}: the server refused {} write(s) so far: '{}' (it is at its maxmemory "
                "and its maxmemory-policy does not evict; for a cache use allkeys-lru)",
                url(), n, std::string_view(reply.str != nullptr ? reply.str : "", reply.len));
    }
    return PageStatus::kNoSpace;
  }

  PageStatus SetOutcome(const RedisOp& op) {
    if (op.outcome != RedisOpOutcome::kReplied) return FromOutcome(op);
    const bool ok = op.reply->type == REDIS_REPLY_STATUS &&
                    std::string_view(op.reply->str, op.reply->len) == "OK";
    return ok ? PageStatus::kOk : FromWriteError(*op.reply);
  }

  std::vector<RedisOp> OpsFor(std::string_view verb, std::span<const PageKey> keys) const {
    std::vector<RedisOp> ops(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      ops[i].verb = verb;
      ops[i].key = name_prefix_ + keys[i].Hex();
    }
    return ops;
  }

  void FillStats(StorageStats& stats) const override {
    stats.set_refused_pages = refused_.load(std::memory_order_relaxed);
  }

  const std::unique_ptr<RedisClient> client_;
  const uint64_t namespace_hash_;
  const std::string name_prefix_;  // "<namespace name>/"
  const size_t pages_per_chunk_;
  // Set: header-last writes (pages of at least header_last_bytes); null: every page in one SET.
  const std::unique_ptr<ChecksumPool> checksum_pool_;
  std::atomic<int64_t> refused_{0};  // writes refused with OOM (FromWriteError)
};

}  // namespace

Result<std::unique_ptr<StorageBackend>> OpenRedisStorage(std::string_view url,
                                                         const StorageNamespace& ns,
                                                         const StorageOptions& options) {
  KVTIER_RETURN_IF_ERROR(ns.Validate());
  KVTIER_RETURN_IF_ERROR(options.Validate());
  KVTIER_ASSIGN_OR_RETURN(RedisUrl parsed, ParseRedisUrl(url));
  RedisClientConfig config;
  config.url = std::move(parsed);
  config.command_timeout = config.url.timeout.count() > 0 ? config.url.timeout : options.timeout;
  config.max_idle_connections_per_node = std::max(4, options.io_threads);
  const std::string redacted = config.url.Redacted();
  const int64_t header_last_bytes = config.url.header_last_bytes;
  // Opening (connect, AUTH, PING or CLUSTER SLOTS) is bounded by connect_timeout_ms alone: a
  // paused server must not hold it for a command timeout more.
  const Deadline deadline = Clock::now() + config.url.connect_timeout;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> client,
                          RedisClient::Open(std::move(config), deadline));
  auto backend =
      std::make_unique<RedisBackend>(redacted, ns, options, std::move(client), header_last_bytes);
  KVTIER_RETURN_IF_ERROR(backend->Open());
  return std::unique_ptr<StorageBackend>(std::move(backend));
}

}  // namespace kvtier::storage
