// `kvtier replay` (see replay.h): the runs of one invocation side by side, their ideal, and the
// report. The options are in replay_options.cc, one run in replay_run.cc.
#include "replay.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvtier/device.h"
#include "kvtier/kv_events.h"
#include "kvtier/storage.h"
#include "replay_engine.h"
#include "replay_ideal.h"
#include "replay_model.h"
#include "replay_options.h"
#include "replay_pin.h"
#include "replay_report.h"
#include "replay_run.h"
#include "workload.h"

namespace kvtier::tools {
namespace {

// The ideal of a hierarchy run (replay_ideal.h) on the run's timeline: the workload's, or with
// decode the run's arrivals.
std::vector<double> IdealTtftOf(const ReplaySetup& s, const RunSummary& run, double pcie,
                                double storage) {
  std::vector<double> arrivals;
  for (const RequestRecord& r : run.records) arrivals.push_back(r.arrival_ms);
  Timeline timeline =
      s.decode_ms_per_token > 0 ? Timeline(std::move(arrivals)) : Timeline(s.workload, s.options);
  return IdealTtft(std::move(timeline), run.records, s.model.kv_bytes_per_token(), pcie, storage);
}

// The storage rate the ideal charges: the ceiling measured at start, else (a store without a
// baseline) the run's own storage -> host rate, which report.storage_ceiling_how then says.
double StorageRateFor(const ReplaySetup& s, const RunSummary& run, ReplayReport* report) {
  if (!s.storage_ceiling_measured) return 0;  // no storage tier
  report->storage_cold_bytes_per_s = s.storage_ceiling.cold_bytes_per_s;
  report->storage_cold_how = s.storage_ceiling.cold_how;
  if (s.storage_ceiling.bytes_per_s > 0) {
    report->storage_ceiling_bytes_per_s = s.storage_ceiling.bytes_per_s;
    report->storage_ceiling_how = s.storage_ceiling.how;
    return s.storage_ceiling.bytes_per_s;
  }
  const double rate =
      run.cache.prefetch_seconds > 0
          ? static_cast<double>(run.cache.prefetch_bytes) / run.cache.prefetch_seconds
          : 0;
  report->storage_ceiling_bytes_per_s = rate;
  report->storage_ceiling_how =
      rate > 0 ? fmt::format("the run's own storage -> host rate ({})", s.storage_ceiling.how)
               : fmt::format(
                     "no baseline ({}) and no storage reads in the run: storage hits "
                     "charged at the host -> device ceiling",
                     s.storage_ceiling.how);
  return rate;
}

Result<TransferBackend> ChooseIoBackend(const ReplayOptions& o, bool gpu) {
  if (!gpu) {
    if (o.io_backend != "auto" && o.io_backend != "cpu") {
      return Status::InvalidArgument(fmt::format(
          "--hicache-io-backend {} needs a GPU; this run uses the cpu device pool", o.io_backend));
    }
    return TransferBackend::kCpu;
  }
  if (o.io_backend == "cpu") {
    return Status::InvalidArgument(
        "--hicache-io-backend cpu cannot move GPU memory; use auto, "
        "kernel or dma");
  }
  if (o.io_backend == "auto") return TransferBackend::kKernel;
  return ParseTransferBackend(o.io_backend);
}
std::string Settings(const ReplaySetup& s, bool exact) {
  const ReplayOptions& o = s.options;
  const HierarchicalCacheConfig& c = o.cache;
  std::string sched = o.sequential ? "sequential"
                      : o.concurrency > 0
                          ? fmt::format("closed loop, {} in flight", o.concurrency)
                          : fmt::format("open loop at {:g}x the timestamps", o.speed);
  if (s.decode_ms_per_token > 0) {
    sched += fmt::format(", each until its output is decoded at {:.2f} ms a token ({})",
                         s.decode_ms_per_token, s.decode_how);
  }
  return fmt::format(
      "page {}, device {} tokens, host {} tokens ({}), storage {}, write {}, admission {} "
      "(threshold {}, backlog {} MiB), prefetch {}{}, eviction {}, io {}, verify {}, {}{}",
      c.page_size, o.device_tokens, o.host_tokens, LayoutName(c.host_layout), RedactUrl(o.storage),
      WritePolicyName(c.write_policy), StorageAdmissionName(c.storage.admission.policy),
      c.storage.admission.threshold, c.storage.admission.backlog_bytes >> 20,
      PrefetchPolicyName(c.storage.prefetch_policy),
      c.storage.prefetch_policy == PrefetchPolicy::kBestEffort || !c.storage.stream_load_back
          ? " (load after the read)"
          : " (streamed to the device)",
      EvictionPolicyName(c.device_eviction), TransferBackendName(s.io_backend), o.verify, sched,
      exact ? " [exact mode: the device tier is a plain leaf-LRU prefix cache]" : "");
}

// A failed step prints its status and gives the exit code: 2 for bad options (the message alone),
// 1 for a run that failed (the status with its code).
int BadOptions(const Status& st) {
  std::fprintf(stderr, "kvtier replay: %s\n", st.message().c_str());
  return 2;
}
int Failed(const Status& st) {
  std::fprintf(stderr, "kvtier replay: %s\n", st.ToString().c_str());
  return 1;
}

// The options with their defaults resolved, --fault, --kv-events' publisher, the workload (its
// warm-up requests apart) and --pin-system-prompt's prefix into `s`. 0, else the exit code (the
// error printed).
int PrepareRuns(const ReplayOptions& input, ReplaySetup* s) {
  ReplayOptions o = input;
  if (Status st = o.Validate(); !st.ok()) return BadOptions(st);
  if (o.host_tokens == -1) o.host_tokens = std::min(4 * o.device_tokens, kMaxTokens);
  StorageOptions& store = o.cache.storage.options;
  if (store.io_threads == 0) store.io_threads = DefaultIoThreads();  // as the cache's 0
  if (!o.shared_host.empty()) o.storage = "none";  // the default file store is not made
  s->options = o;
  s->model = *FindReplayModel(o.model);
  if (!o.fault.empty()) {
    const Fault f = *ParseFault(o.fault);
    s->fault_at_s = f.down_at_s;
    s->fault_delay_ms = f.delay_ms;
  }
  if (!o.kv_events.empty()) {
    KvEventPublisherConfig events;
    events.endpoint = o.kv_events;
    events.replay_endpoint = o.kv_events_replay;
    events.topic = o.kv_events_topic;
    Result<std::unique_ptr<KvEventPublisher>> pub = KvEventPublisher::Open(events);
    if (!pub.ok()) return Failed(pub.status().WithContext("--kv-events"));
    s->kv_events = std::move(*pub);
    // Subscribers may want the bound ports ('*') before the run ends.
    std::fprintf(stderr, "kvtier replay: kv events on %s%s%s\n", s->kv_events->endpoint().c_str(),
                 s->kv_events->replay_endpoint().empty() ? "" : ", replay socket on ",
                 s->kv_events->replay_endpoint().c_str());
  }
  if (Status st = LoadWorkload(o, &s->workload); !st.ok()) {
    std::fprintf(stderr, "kvtier replay: %s\n", st.message().c_str());
    return st.IsInvalidArgument() || st.IsNotFound() ? 2 : 1;
  }
  if (o.warmup > 0) {
    if (o.warmup >= static_cast<int64_t>(s->workload.requests.size())) {
      std::fprintf(stderr, "kvtier replay: --warmup %lld leaves no request of the %zu to measure\n",
                   static_cast<long long>(o.warmup), s->workload.requests.size());
      return 2;
    }
    const auto cut = s->workload.requests.begin() + o.warmup;
    s->warmup.name = s->workload.name;
    s->warmup.requests.assign(s->workload.requests.begin(), cut);
    s->workload.requests.erase(s->workload.requests.begin(), cut);
  }
  if (!o.pin_system_prompt.empty()) {
    Result<std::vector<Token>> prompt = SharedPrompt({&s->warmup, &s->workload}, o.cache.page_size);
    if (!prompt.ok()) return BadOptions(prompt.status());
    s->pin_prompt = std::move(*prompt);
  }
  return 0;
}

// The device pool: a GPU when asked for or present, else host memory standing in; the engine
// that computes on it and the I/O backend that loads into it. 0, else the exit code.
int MakeDevice(ReplaySetup* s) {
  const ReplayOptions& o = s->options;
  const bool have_gpu = CudaDeviceCount() > 0;
  if (o.device == "gpu" && !have_gpu) {
    return Failed(Status::Unavailable(BuiltWithCuda() ? "--device gpu: no GPU is present"
                                                      : "--device gpu: kvtier was built without "
                                                        "CUDA"));
  }
  s->gpu = o.device == "gpu" || (o.device == "auto" && have_gpu);
  if (o.compute == "gemm" && !s->gpu) {
    return Failed(Status::InvalidArgument(
        "--compute gemm runs cuBLAS GEMMs on a GPU; this run has none (use --compute model)"));
  }
  Result<TransferBackend> io = ChooseIoBackend(o, s->gpu);
  if (!io.ok()) return BadOptions(io.status());
  s->io_backend = *io;
  const int64_t P = o.cache.page_size;
  const int64_t device_slots = (o.device_tokens + P - 1) / P * P;
  s->options.device_tokens = device_slots;
  PrefillEngineConfig ec;
  ec.model = s->model;
  ec.compute_model = o.compute_model.empty() ? s->model : *FindReplayModel(o.compute_model);
  ec.device_slots = device_slots;
  ec.page_size = P;
  ec.compute = (o.compute == "gemm" || (o.compute == "auto" && s->gpu)) ? ComputeMode::kGemm
                                                                        : ComputeMode::kModel;
  ec.tflops = o.tflops;
  ec.chunk_tokens = o.chunk_tokens;
  ec.max_context = 1;
  for (const WorkloadRequest& r : s->workload.requests) {
    ec.max_context = std::max(ec.max_context, r.input_length);
  }
  Result<std::unique_ptr<PrefillEngine>> engine =
      s->gpu ? MakeGpuPrefillEngine(ec) : MakeCpuPrefillEngine(ec);
  if (!engine.ok()) return Failed(engine.status().WithContext("device pool"));
  s->engine = std::move(*engine);
  return 0;
}

// --decode-ms-per-token into s->decode_ms_per_token ("measure": the engine times a decode step
// of as many tokens as there are requests in flight). 0, else the exit code.
int ResolveDecode(ReplaySetup* s) {
  const ReplayOptions& o = s->options;
  const double given = *ParseDecodeMsPerToken(o.decode_ms_per_token);  // Validate checked it
  if (given == kDecodeMeasure) {
    const int64_t batch = o.sequential ? 1 : o.concurrency;
    Result<double> ms = s->engine->DecodeStepMs(batch);
    if (!ms.ok()) return BadOptions(ms.status());
    s->decode_ms_per_token = *ms;
    s->decode_how = fmt::format(
        "measured: the weight GEMMs of a {}-token decode step, median of 5; attention left out",
        batch);
  } else if (given > 0) {
    s->decode_ms_per_token = given;
    s->decode_how = "--decode-ms-per-token";
  }
  return 0;
}

// The report's header (what is replayed, on what, with which settings), printed.
ReplayReport ReportHeader(const ReplaySetup& s) {
  const ReplayOptions& o = s.options;
  const bool exact = o.sequential && o.host_tokens == 0 && o.storage == "none";
  ReplayReport report;
  report.label = o.label;
  report.command = o.command_line;
  report.workload =
      fmt::format("{} ({} requests, {} input tokens{})", s.workload.name,
                  s.workload.requests.size(), s.workload.input_tokens(),
                  o.warmup > 0 ? fmt::format(", after {} warm-up requests", o.warmup) : "");
  report.model =
      fmt::format("{} ({} layers, {}, {} KV bytes per token){}", s.model.name, s.model.num_layers,
                  s.model.mla ? "MLA" : "MHA", s.model.kv_bytes_per_token(),
                  o.compute_model.empty() || o.compute_model == o.model
                      ? ""
                      : fmt::format("; compute of {}", o.compute_model));
  report.engine = s.engine->Describe();
  report.settings = Settings(s, exact);
  report.decode_ms_per_token = s.decode_ms_per_token;
  report.decode_how = s.decode_how;
  report.page_size = o.cache.page_size;
  report.kv_bytes_per_token = s.model.kv_bytes_per_token();
  report.ceiling_bytes_per_s = s.engine->ceiling_bytes_per_s();
  report.ceiling_how = s.gpu ? "one 256 MiB pinned host -> device copy, median of 5"
                             : "cpu device: one 64 MiB memcpy, median of 3";
  report.gpu = s.gpu;
  report.slow_class_margin = o.slow_class_margin;
  report.slow_class_warn = o.slow_class_warn;
  report.exact_mode = exact;
  std::printf("%s: %s\n  model %s\n  %s\n  %s\n", o.label.c_str(), report.workload.c_str(),
              report.model.c_str(), report.engine.c_str(), report.settings.c_str());
  std::fflush(stdout);
  return report;
}

// The runs --runs and --sweep ask for, into report->runs and report->sweep. 0, else the exit code.
int MakeRuns(ReplaySetup& s, ReplayReport* report) {
  const ReplayOptions& o = s.options;
  // The hierarchy with the same knobs as the device-only run is that run (exact mode).
  const bool hierarchy_is_device_only = o.host_tokens == 0 && o.storage == "none";
  const bool with_device_only = o.runs == "all";
  if (o.runs != "hierarchy") {
    Result<RunSummary> none = RunOne(s, RunKind::kNoCache, 0, RunName(RunKind::kNoCache));
    if (!none.ok()) return Failed(none.status().WithContext("no-cache run"));
    report->runs.push_back(std::move(*none));
    if (with_device_only && !hierarchy_is_device_only) {
      Result<RunSummary> dev = RunOne(s, RunKind::kDeviceOnly, 0, RunName(RunKind::kDeviceOnly));
      if (!dev.ok()) return Failed(dev.status().WithContext("device-only run"));
      report->runs.push_back(std::move(*dev));
    }
  }
  Result<RunSummary> hier =
      RunOne(s, RunKind::kHierarchy, o.host_tokens, RunName(RunKind::kHierarchy));
  if (!hier.ok()) return Failed(hier.status().WithContext("hierarchy run"));
  const double pcie = s.engine->ceiling_bytes_per_s();
  const double storage_rate = StorageRateFor(s, *hier, report);
  hier->ideal_ttft_ms = IdealTtftOf(s, *hier, pcie, storage_rate);
  report->runs.push_back(std::move(*hier));
  if (with_device_only && hierarchy_is_device_only) {
    RunSummary dev = report->runs.back();
    dev.name = RunName(RunKind::kDeviceOnly);
    dev.ideal_ttft_ms.clear();
    report->runs.insert(report->runs.end() - 1, std::move(dev));
  }
  if (!o.sweep.empty()) {
    const std::vector<int64_t> values = *ParseSweep(o.sweep);
    for (int64_t value : values) {
      Result<RunSummary> r =
          RunOne(s, RunKind::kHierarchy, value, fmt::format("host-tokens={}", value));
      if (!r.ok()) {
        return Failed(r.status().WithContext(fmt::format("sweep host-tokens={}", value)));
      }
      r->ideal_ttft_ms = IdealTtftOf(s, *r, pcie, storage_rate);
      report->sweep.push_back({"host-tokens", value, std::move(*r)});
    }
  }
  return 0;
}

// --json and --plot. The exit code so far, 1 when a file could not be written (a plot without
// matplotlib only warns).
int WriteOutputs(const ReplayOptions& o, const ReplayReport& report, int code) {
  if (!o.json_path.empty()) {
    if (Status st = WriteReplayJson(o.json_path, report); !st.ok()) code = Failed(st);
  }
  if (!o.plot_path.empty()) {
    std::string json = o.json_path;
    std::string temp_json;
    if (json.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      temp_json = fmt::format("{}/kvtier-replay-plot-{}.json",
                              tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", ::getpid());
      json = temp_json;
      if (Status st = WriteReplayJson(json, report); !st.ok()) code = Failed(st);
    }
    if (Status st = WriteReplayPlot(o.plot_path, json); !st.ok()) {
      std::fprintf(stderr, "kvtier replay: --plot: %s%s\n", st.message().c_str(),
                   o.json_path.empty() ? "" : " (the JSON was written)");
      if (!st.IsUnavailable()) code = 1;
    } else {
      std::printf("plot: %s\n", o.plot_path.c_str());
    }
    if (!temp_json.empty()) std::remove(temp_json.c_str());
  }
  return code;
}

// Wrong bytes and hit classes slower than no cache, on stderr; the exit code so far, 3 for a slow
// class (unless --slow-class-warn) when nothing else failed.
int CheckVerdicts(const ReplayOptions& o, const ReplayReport& report, int code) {
  if (report.wrong_bytes() > 0) {
    std::fprintf(stderr, "kvtier replay: %lld WRONG bytes in loaded KV\n",
                 static_cast<long long>(report.wrong_bytes()));
  }
  for (const ClassComparison& c : report.CompareHitClasses()) {
    if (!c.slower) continue;
    std::fprintf(stderr,
                 "kvtier replay: %s: hit class %s is slower than no cache beyond noise: TTFT p50 "
                 "%.1f ms against %.1f ms, %.2fx [95 %% interval %.2f, %.2f] over %lld requests, "
                 "above %.2fx%s\n",
                 o.slow_class_warn ? "WARNING" : "FAIL", HitClassName(c.hit_class),
                 c.hierarchy_p50_ms, c.no_cache_p50_ms, c.ratio.value, c.ratio.lo, c.ratio.hi,
                 static_cast<long long>(c.requests), 1 + o.slow_class_margin,
                 o.slow_class_warn ? "" : " (--slow-class-warn makes this a warning)");
    if (!o.slow_class_warn && code == 0) code = 3;
  }
  return code;
}

}  // namespace

int RunReplay(const ReplayOptions& input) {
  ReplaySetup s;
  if (int code = PrepareRuns(input, &s); code != 0) return code;
  if (int code = MakeDevice(&s); code != 0) return code;
  if (int code = ResolveDecode(&s); code != 0) return code;
  const ReplayOptions& o = s.options;
  ReplayReport report = ReportHeader(s);
  if (int code = MakeRuns(s, &report); code != 0) return code;
  PrintReport(stdout, report);
  int code = report.wrong_bytes() > 0 ? 1 : 0;
  code = WriteOutputs(o, report, code);
  code = CheckVerdicts(o, report, code);
  if (s.kv_events != nullptr && o.kv_events_hold_s > 0) {
    // The report is written: subscribers that missed batches can still ask the replay socket.
    std::fprintf(stderr, "kvtier replay: holding the kv event sockets open for %g s\n",
                 o.kv_events_hold_s);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.kv_events_hold_s));
  }
  return code;
}

}  // namespace kvtier::tools
