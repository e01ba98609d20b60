// The transfer engine that times every rank's copies and measures its loads
// (replay_tp_timed_engine.h).
#include "replay_tp_timed_engine.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <utility>

namespace kvtier::tools {

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

Result<std::unique_ptr<TpTimedEngine>> TpTimedEngine::Create(std::unique_ptr<TransferEngine> inner,
                                                             const KvRegion& device,
                                                             int cuda_device,
                                                             CudaStream load_stream, bool cpu) {
  auto e = std::unique_ptr<TpTimedEngine>(new TpTimedEngine(std::move(inner), device, load_stream));
  e->cpu_ = cpu;
  if (cuda_device >= 0) {
    KVTIER_ASSIGN_OR_RETURN(e->start_, CudaEventHandle::Create(cuda_device, /*timing=*/true));
    KVTIER_ASSIGN_OR_RETURN(e->stop_, CudaEventHandle::Create(cuda_device, /*timing=*/true));
    e->events_ = true;
  }
  return e;
}

double TpTimedEngine::median_load_bytes_per_s() const {
  if (per_load_.empty()) return 0;
  std::vector<double> v = per_load_;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(mid), v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (upper + *std::max_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(mid))) / 2;
}

void TpTimedEngine::ResetLoads() {
  load_seconds_ = 0;
  load_bytes_ = 0;
  loads_ = 0;
  per_load_.clear();
}

Status TpTimedEngine::DoTransfer(const TransferRequest& request, const TransferOptions& given) {
  using Clock = std::chrono::steady_clock;
  const bool to_device = request.dst->has_layer_table()
                             ? request.dst->k_layers.data() == device_.k_layers.data()
                             : request.dst->k == device_.k;
  TransferOptions options = given;
  if (to_device && options.stream == nullptr) options.stream = load_stream_;
  const bool gpu = inner_->backend() != TransferBackend::kCpu;
  const bool events = to_device && gpu && events_;
  const auto t0 = Clock::now();
  const double cpu0 = cpu_ ? ThreadCpuSeconds() : 0;
  Status st = events ? start_.Record(options.stream) : Status::OK();
  if (st.ok()) st = inner_->Transfer(request, options);
  if (st.ok() && events) st = stop_.Record(options.stream);
  if (st.ok() && gpu) st = inner_->Synchronize(options.stream);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  seconds_ += s;
  if (cpu_) cpu_seconds_ += ThreadCpuSeconds() - cpu0;
  if (to_device && st.ok()) {
    double load_s = s;
    if (events) {
      Result<float> ms = stop_.ElapsedMsSince(start_);
      if (!ms.ok()) return ms.status().WithContext("timing a load with CUDA events");
      load_s = static_cast<double>(*ms) * 1e-3;
    }
    load_seconds_ += load_s;
    load_bytes_ += request.bytes();
    ++loads_;
    if (load_s > 0) per_load_.push_back(static_cast<double>(request.bytes()) / load_s);
  }
  return st;
}

}  // namespace kvtier::tools
