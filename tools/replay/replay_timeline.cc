// The replay scheduler's timeline (see replay_timeline.h).
#include "replay_timeline.h"

#include <algorithm>
#include <cmath>

namespace kvtier::tools {

Timeline::Timeline(const Workload& w, const ReplayOptions& o, double decode_ms_per_token)
    : closed_(o.sequential ? 1 : o.concurrency),
      decode_ms_(closed_ > 0 ? decode_ms_per_token : 0),
      start_(w.requests.size(), 0),
      end_(w.requests.size(), 0) {
  if (closed_ == 0) {
    open_.reserve(w.requests.size());
    const double t0 = w.requests.empty() ? 0 : w.requests[0].arrival_ms;
    for (const WorkloadRequest& r : w.requests) open_.push_back((r.arrival_ms - t0) / o.speed);
  }
  if (decode_ms_ > 0) {
    decode_steps_.reserve(w.requests.size());
    for (const WorkloadRequest& r : w.requests) {
      decode_steps_.push_back(std::max<int64_t>(0, r.output_length - 1));
    }
  }
}

bool Timeline::Known(int64_t i, int64_t served) const {
  if (closed_ == 0 || i < closed_) return true;
  return decode_ms_ > 0 ? i <= served : i - closed_ < served;
}

double Timeline::DoneAt(int64_t k) const {
  double t = end_[static_cast<size_t>(k)];
  if (decode_ms_ <= 0) return t;
  double left = decode_ms_ * static_cast<double>(decode_steps_[static_cast<size_t>(k)]);
  // The prefills served after k pause its decode.
  for (int64_t j = k + 1; j < served_ && left > 0; ++j) {
    const double s = start_[static_cast<size_t>(j)];
    if (s >= t + left) break;
    if (s > t) left -= s - t;
    t = std::max(t, end_[static_cast<size_t>(j)]);
  }
  return t + left;
}

double Timeline::Arrival(int64_t i) const {
  if (closed_ == 0) return open_[static_cast<size_t>(i)];
  return i < closed_ ? 0 : DoneAt(i - closed_);
}

double Timeline::StartOf(int64_t i) const {
  const double arrival = Arrival(i);
  if (decode_ms_ <= 0 || arrival < device_free_) return std::max(device_free_, arrival);
  // The device is decoding or idle at the arrival: a decode step in progress (steps back to back
  // from the last prefill's end) finishes first.
  for (int64_t k = std::max<int64_t>(0, i - closed_ + 1); k < i; ++k) {
    if (DoneAt(k) > arrival) {
      const double steps = std::ceil((arrival - device_free_) / decode_ms_);
      return device_free_ + steps * decode_ms_;
    }
  }
  return arrival;
}

double Timeline::Serve(int64_t i, double service_ms) {
  const double start = StartOf(i);
  const double end = start + service_ms;
  start_[static_cast<size_t>(i)] = start;
  end_[static_cast<size_t>(i)] = end;
  served_ = std::max(served_, i + 1);
  device_free_ = end;
  return end;
}

}  // namespace kvtier::tools
