// tools/replay/replay_timeline.h — the replay scheduler's timeline: when each request arrives and
// when the device serves it (the rule TTFT = queueing + service is computed on). RunOne drives it
// with measured service times; the ideal (replay_ideal.h) replays it with its own.
//
// Thread safety: a plain value, driven by one thread.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "replay.h"
#include "workload.h"

namespace kvtier::tools {

// When each request arrives and when the device serves it: open loop (timestamps / speed), closed
// loop (request i arrives when request i - N is done) or sequential (N = 1). The device serves one
// prefill at a time, in arrival order.
//
// A closed loop's request is done at its first token, or, with `decode_ms_per_token` > 0, once
// the rest of its output (the workload's output_length - 1 tokens) is decoded at that many ms a
// token, as an engine that puts prefills first does it: a prefill pauses every decode while it
// runs, and a prefill that arrives while decodes run waits for the step in progress (steps run
// back to back from the end of the last prefill).
class Timeline {
 public:
  Timeline(const Workload& w, const ReplayOptions& o, double decode_ms_per_token = 0);
  // An open loop with these arrivals (another run's, replayed).
  explicit Timeline(std::vector<double> arrivals_ms)
      : closed_(0),
        decode_ms_(0),
        open_(std::move(arrivals_ms)),
        start_(open_.size(), 0),
        end_(open_.size(), 0) {}
  // True once request i's arrival time is known (closed loop: request i - N has finished; with
  // decode, every request before i has been served, as their prefills pause its decode).
  bool Known(int64_t i, int64_t served) const;
  double Arrival(int64_t i) const;
  // When the device can start request i. REQUIRES: requests before i served.
  double StartOf(int64_t i) const;
  // Serves request i for `service_ms`; returns its end.
  double Serve(int64_t i, double service_ms);

 private:
  // When request k's output is decoded (its first token with no decode). REQUIRES: every request
  // whose prefill may pause it, up to the last one served, served.
  double DoneAt(int64_t k) const;

  int64_t closed_;  // 0: open loop
  double decode_ms_;
  std::vector<double> open_;
  std::vector<int64_t> decode_steps_;  // per request: output tokens after the first
  std::vector<double> start_;
  std::vector<double> end_;
  int64_t served_ = 0;  // requests [0, served_) served
  double device_free_ = 0;
};

}  // namespace kvtier::tools
