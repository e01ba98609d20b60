// KvEventPublisher: vLLM's ZmqEventPublisher protocol (kvtier/kv_events.h) over cppzmq.
//
// Callers append batches to a bounded queue under `mu_`; the publisher thread owns both sockets,
// encodes and sends the batches in seq order, keeps the last replay_buffer_batches payloads for
// the replay socket, and answers replay requests. It sleeps in zmq::poll on the replay socket and
// an eventfd that Publish signals when the queue goes from empty to non-empty (and Stop signals),
// so it neither spins nor delays a batch.
//
// Invariants (under mu_): seqs are handed out in Publish in call order; queue_ holds increasing
// seqs; sent_end_ is one past the seq of the last batch the thread finished (sent or not), and
// every queued seq below it is finished; queued_end_ is one past the last queued seq.
#include <fmt/format.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "kvtier/kv_events.h"

namespace kvtier {
namespace {

constexpr int64_t kMaxLingerMs = 60000;

std::array<uint8_t, 8> BigEndian64(uint64_t value) {
  std::array<uint8_t, 8> out{};
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<uint8_t>(value);
    value >>= 8;
  }
  return out;
}

uint64_t ReadBigEndian64(const uint8_t* p) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | p[i];
  return value;
}

// vLLM's rule: bind when the endpoint names a wildcard or a local transport, else connect.
bool BindsPub(std::string_view endpoint) {
  return endpoint.find('*') != std::string_view::npos ||
         endpoint.find("::") != std::string_view::npos || endpoint.starts_with("ipc://") ||
         endpoint.starts_with("inproc://");
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

size_t EventCount(const KvEventBatch& batch) { return batch.events.size(); }

}  // namespace

#if defined(__SANITIZE_THREAD__)
#define KVTIER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVTIER_TSAN 1
#endif
#endif
#ifdef KVTIER_TSAN
// ThreadSanitizer builds: libzmq is not instrumented, so the synchronisation inside it (the
// lock-free pipes between a socket's thread and ZeroMQ's I/O thread) is invisible and the buffers
// it hands between them look racy. Reports from inside libzmq are suppressed; kvtier's own code
// is still checked. Linked into every program that uses the publisher.
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libzmq.so\nrace:libzmq.so\n";
}
#endif

Status KvEventPublisherConfig::Validate() const {
  if (endpoint.empty()) return Status::InvalidArgument("kv events: endpoint is empty");
  if (max_queue_batches < 1) {
    return Status::InvalidArgument(
        fmt::format("kv events: max_queue_batches = {} (must be >= 1)", max_queue_batches));
  }
  if (replay_buffer_batches < 0) {
    return Status::InvalidArgument(
        fmt::format("kv events: replay_buffer_batches = {} (must be >= 0)", replay_buffer_batches));
  }
  if (send_hwm < 0 || send_hwm > INT32_MAX) {
    return Status::InvalidArgument(
        fmt::format("kv events: send_hwm = {} (must be in [0, 2^31))", send_hwm));
  }
  if (linger_ms < 0 || linger_ms > kMaxLingerMs) {
    return Status::InvalidArgument(
        fmt::format("kv events: linger_ms = {} (must be in [0, {}])", linger_ms, kMaxLingerMs));
  }
  return Status::OK();
}

class KvEventPublisher::Impl {
 public:
  explicit Impl(const KvEventPublisherConfig& config) : config_(config) {}

  ~Impl() { Stop(); }

  Status Start() {
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) return Status::Unavailable("kv events: eventfd failed");
    try {
      pub_ = zmq::socket_t(context_, zmq::socket_type::pub);
      pub_.set(zmq::sockopt::sndhwm, static_cast<int>(config_.send_hwm));
      pub_.set(zmq::sockopt::linger, static_cast<int>(config_.linger_ms));
      if (BindsPub(config_.endpoint)) {
        pub_.bind(config_.endpoint);
        endpoint_ = pub_.get(zmq::sockopt::last_endpoint);
      } else {
        pub_.connect(config_.endpoint);
        endpoint_ = config_.endpoint;
      }
    } catch (const zmq::error_t& e) {
      return Status::Unavailable(
          fmt::format("kv events: PUB socket on '{}': {}", config_.endpoint, e.what()));
    }
    if (!config_.replay_endpoint.empty()) {
      try {
        replay_ = zmq::socket_t(context_, zmq::socket_type::router);
        // One whole answer per client fits; beyond it ZeroMQ drops the rest of that answer
        // (the client sees the gap and asks again) instead of blocking the publisher thread.
        replay_.set(zmq::sockopt::sndhwm, static_cast<int>(std::min<int64_t>(
                                              config_.replay_buffer_batches + 2, INT32_MAX)));
        replay_.set(zmq::sockopt::linger, 0);
        replay_.bind(config_.replay_endpoint);
        replay_endpoint_ = replay_.get(zmq::sockopt::last_endpoint);
      } catch (const zmq::error_t& e) {
        return Status::Unavailable(
            fmt::format("kv events: replay socket on '{}': {}", config_.replay_endpoint, e.what()));
      }
    }
    thread_ = std::thread([this] { Run(); });
    return Status::OK();
  }

  void Publish(std::vector<KvEvent> events) {
    if (events.empty()) return;
    bool was_empty = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const uint64_t seq = next_seq_++;
      if (stopping_ || static_cast<int64_t>(queue_.size()) >= config_.max_queue_batches) {
        ++stats_.dropped_batches;
        stats_.dropped_events += events.size();
        return;
      }
      was_empty = queue_.empty();
      queue_.push_back(
          Queued{seq, KvEventBatch{NowSeconds(), std::move(events), config_.data_parallel_rank}});
      queued_end_ = seq + 1;
    }
    if (was_empty) Wake();
  }

  bool Flush(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = queued_end_;
    return finished_cv_.wait_for(lock, timeout, [&] { return sent_end_ >= target; });
  }

  KvEventPublisherStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    if (thread_.joinable()) {
      Wake();
      thread_.join();
    }
    pub_.close();  // waits for unsent messages up to linger_ms when the context closes
    replay_.close();
    context_.close();
    if (wake_fd_ >= 0) ::close(wake_fd_);
    wake_fd_ = -1;
  }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

 private:
  struct Queued {
    uint64_t seq;
    KvEventBatch batch;
  };

  void Wake() {
    const uint64_t one = 1;
    // EAGAIN (the counter is saturated) still leaves the thread woken.
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  }

  void Run() {
    std::vector<zmq::pollitem_t> items;
    items.push_back(zmq::pollitem_t{nullptr, wake_fd_, ZMQ_POLLIN, 0});
    if (replay_) items.push_back(zmq::pollitem_t{replay_.handle(), 0, ZMQ_POLLIN, 0});
    std::deque<Queued> batch;
    for (;;) {
      try {
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(-1));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) return;
      }
      if (items[0].revents & ZMQ_POLLIN) {
        uint64_t count = 0;
        [[maybe_unused]] ssize_t n = ::read(wake_fd_, &count, sizeof(count));
      }
      if (items.size() > 1 && (items[1].revents & ZMQ_POLLIN)) ServiceReplay();
      bool stop = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        batch.swap(queue_);
        stop = stopping_;
      }
      for (Queued& q : batch) Send(q);
      batch.clear();
      if (stop) {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.empty()) return;  // Publish refuses new batches once stopping_ is set
      }
    }
  }

  void Send(Queued& q) {
    std::string payload = EncodeKvEventBatch(q.batch);
    const auto seq_bytes = BigEndian64(q.seq);
    bool sent = false;
    try {
      sent = pub_.send(zmq::buffer(config_.topic), zmq::send_flags::sndmore) &&
             pub_.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore) &&
             pub_.send(zmq::buffer(payload), zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
      sent = false;
    }
    if (config_.replay_buffer_batches > 0) {
      if (static_cast<int64_t>(replay_buffer_.size()) >= config_.replay_buffer_batches) {
        replay_buffer_.pop_front();
      }
      replay_buffer_.emplace_back(q.seq, std::move(payload));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (sent) {
      ++stats_.published_batches;
      stats_.published_events += EventCount(q.batch);
    } else {
      ++stats_.send_errors;
    }
    sent_end_ = q.seq + 1;
    finished_cv_.notify_all();
  }

  // Answers every request waiting on the replay socket (see kvtier/kv_events.h).
  void ServiceReplay() {
    static constexpr std::array<uint8_t, 8> kEndSeq = {0xff, 0xff, 0xff, 0xff,
                                                       0xff, 0xff, 0xff, 0xff};
    for (;;) {
      std::vector<zmq::message_t> frames;
      try {
        if (!zmq::recv_multipart(replay_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
          return;
        }
      } catch (const zmq::error_t&) {
        return;
      }
      if (frames.size() != 3 || frames[1].size() != 0 || frames[2].size() != 8) {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.bad_replay_requests;
        continue;
      }
      const uint64_t start = ReadBigEndian64(frames[2].data<uint8_t>());
      const std::string identity = frames[0].to_string();
      try {
        for (const auto& [seq, payload] : replay_buffer_) {
          if (seq < start) continue;
          const auto seq_bytes = BigEndian64(seq);
          replay_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
          replay_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
          replay_.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
          replay_.send(zmq::buffer(payload), zmq::send_flags::dontwait);
        }
        replay_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
        replay_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
        replay_.send(zmq::buffer(kEndSeq), zmq::send_flags::sndmore);
        replay_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::dontwait);
      } catch (const zmq::error_t&) {
        // The client went away mid-answer; ROUTER drops what cannot be routed.
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.replay_requests;
    }
  }

  const KvEventPublisherConfig config_;
  zmq::context_t context_;
  zmq::socket_t pub_;     // publisher thread only (after Start)
  zmq::socket_t replay_;  // publisher thread only (after Start)
  std::string endpoint_;
  std::string replay_endpoint_;
  int wake_fd_ = -1;
  std::thread thread_;
  std::deque<std::pair<uint64_t, std::string>> replay_buffer_;  // publisher thread only

  mutable std::mutex mu_;
  std::condition_variable finished_cv_;
  std::deque<Queued> queue_;     // guarded by mu_
  uint64_t next_seq_ = 0;        // guarded by mu_
  uint64_t queued_end_ = 0;      // guarded by mu_
  uint64_t sent_end_ = 0;        // guarded by mu_
  bool stopping_ = false;        // guarded by mu_
  KvEventPublisherStats stats_;  // guarded by mu_
};

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Open(
    const KvEventPublisherConfig& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>(config);
  KVTIER_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<KvEventPublisher>(new KvEventPublisher(std::move(impl)));
}

KvEventPublisher::KvEventPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvEventPublisher::~KvEventPublisher() = default;

void KvEventPublisher::Publish(std::vector<KvEvent> events) { impl_->Publish(std::move(events)); }
bool KvEventPublisher::Flush(std::chrono::milliseconds timeout) { return impl_->Flush(timeout); }
KvEventPublisherStats KvEventPublisher::stats() const { return impl_->stats(); }
const std::string& KvEventPublisher::endpoint() const { return impl_->endpoint(); }
const std::string& KvEventPublisher::replay_endpoint() const { return impl_->replay_endpoint(); }

}  // namespace kvtier
