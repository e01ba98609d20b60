// `kvtier replay --tp N` (see replay_tp.h): the run rank 0 coordinates — the
// options checked, the follower processes started and reaped, the passes (TP=1, the equal-bytes
// baselines, TP=N; replay_tp_pass.h) and their report (replay_tp_report.h). A follower process
// goes from here to its side of the pass.
#include "replay_tp.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include "kvtier/device.h"
#include "kvtier/storage.h"
#include "kvtier/tp_group.h"
#include "replay_model.h"
#include "replay_options.h"
#include "replay_tp_janitor.h"
#include "replay_tp_pass.h"
#include "replay_tp_rank.h"
#include "replay_tp_report.h"
#include "workload.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

// Starts ranks 1 .. tp-1 as copies of this process with the follower flags.
std::vector<pid_t> StartFollowers(const TpReplayArgs& a, const std::string& group,
                                  const std::string& store,
                                  const std::vector<std::string>& self_args) {
  std::vector<pid_t> pids;
  for (int r = 1; r < a.tp; ++r) {
    std::vector<std::string> args = {"/proc/self/exe"};
    args.insert(args.end(), self_args.begin(), self_args.end());
    for (const char* flag : {"--json", "--plot"}) {  // rank 0 writes the outputs
      auto it = std::find(args.begin(), args.end(), flag);
      if (it != args.end() && it + 1 != args.end()) args.erase(it, it + 2);
    }
    args.insert(args.end(), {"--tp-rank", std::to_string(r), "--tp-group", group});
    if (!store.empty()) args.insert(args.end(), {"--tp-store", store});
    std::vector<char*> argv;
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      // A rank dies with rank 0, however rank 0 ends (SIGKILL included): no rank outlives it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(126);
      execv(argv[0], argv.data());
      std::fprintf(stderr, "kvtier replay --tp: exec of rank %d failed: %s\n", r,
                   std::strerror(errno));
      _exit(127);
    }
    if (pid > 0) pids.push_back(pid);
  }
  return pids;
}

// Waits up to `seconds` for each follower to exit, then kills it. True when all exited with 0.
bool ReapFollowers(const std::vector<pid_t>& pids, double seconds) {
  bool clean = true;
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1e3));
  for (pid_t pid : pids) {
    int status = 0;
    for (;;) {
      const pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) break;
      if (r < 0 || Clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        clean = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    clean = clean && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return clean;
}

// The replay flags a TP run does not implement: refused by name rather than silently ignored
// (its passes are sequential, on one workload, with no sweep, publisher, pins, faults or plot).
Status CheckTpFlags(const ReplayOptions& o) {
  const ReplayOptions d;
  const std::pair<const char*, bool> unsupported[] = {
      {"--shared-host", !o.shared_host.empty()},
      {"--kv-events", !o.kv_events.empty()},
      {"--sweep", !o.sweep.empty()},
      {"--concurrency", o.concurrency != d.concurrency},
      {"--pin-system-prompt", !o.pin_system_prompt.empty()},
      {"--fault", !o.fault.empty()},
      {"--plot", !o.plot_path.empty()},
  };
  for (const auto& [flag, given] : unsupported) {
    if (given) {
      return Status::InvalidArgument(fmt::format(
          "--tp: {} is not supported with --tp (a TP replay serves the requests one at a time, "
          "at TP=1 and then TP=N, and compares)",
          flag));
    }
  }
  if (o.cache.storage.options.timeout != d.cache.storage.options.timeout) {
    return Status::InvalidArgument(fmt::format(
        "--tp: {} is not supported with --tp: its stores' calls wait up to {} ms, so that a "
        "loaded machine slows the passes down but never turns a storage hit into a miss in one "
        "pass only",
        ReplayFlagOf("storage_timeout_ms"), kTpStoreTimeout.count()));
  }
  return Status::OK();
}

void RemoveStore(const TpSetup& s) {
  if (s.store_dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(s.store_dir, ec);
}

// The run's setup from the options: checked, its model(s) and workload loaded, its device and
// copy backend chosen, the pools' slots and the longest context. On failure, `code` is the exit
// code: 1 when the run needs a GPU that is not there, 2 for a bad argument.
Status SetUpTp(const ReplayOptions& options, const TpReplayArgs& a, TpSetup& s, int& code) {
  code = 2;
  s.o = options;
  s.tp = a.tp;
  KVTIER_RETURN_IF_ERROR(s.o.Validate());
  if (a.rank > 0 && a.group.empty()) return Status::InvalidArgument("--tp-group missing");
  if (s.o.host_tokens == -1) s.o.host_tokens = 4 * s.o.device_tokens;
  KVTIER_RETURN_IF_ERROR(CheckTpFlags(s.o));
  KVTIER_ASSIGN_OR_RETURN(s.model, FindReplayModel(s.o.model));
  s.compute_model = s.o.compute_model.empty() ? s.model : *FindReplayModel(s.o.compute_model);
  KVTIER_RETURN_IF_ERROR(TpRankModel(s.model, a.tp).status());
  KVTIER_RETURN_IF_ERROR(TpRankModel(s.compute_model, a.tp).status());
  KVTIER_RETURN_IF_ERROR(LoadWorkload(s.o, &s.workload));
  const bool have_gpu = CudaDeviceCount() > 0;
  if (s.o.device == "gpu" && !have_gpu) {
    code = 1;
    return Status::Unavailable("--device gpu: no GPU is present (or built without CUDA)");
  }
  s.gpu = s.o.device == "gpu" || (s.o.device == "auto" && have_gpu);
  if (!s.gpu && s.o.io_backend != "auto" && s.o.io_backend != "cpu") {
    return Status::InvalidArgument("--hicache-io-backend needs a GPU for this run");
  }
  s.io = TransferBackend::kCpu;
  if (s.gpu) {
    Result<TransferBackend> io =
        ParseTransferBackend(s.o.io_backend == "auto" ? "kernel" : s.o.io_backend);
    if (!io.ok() || *io == TransferBackend::kCpu) {
      return Status::InvalidArgument("--hicache-io-backend: kernel, dma or auto on a GPU");
    }
    s.io = *io;
  }
  const int64_t P = s.o.cache.page_size;
  s.device_slots = (s.o.device_tokens + P - 1) / P * P;
  s.host_slots = s.o.host_tokens / P * P;
  for (const WorkloadRequest& r : s.workload.requests) {
    s.max_context = std::max(s.max_context, r.input_length);
  }
  return Status::OK();
}

// --storage file: the passes' store directory made (removed by the janitor should rank 0 die;
// by RemoveStore otherwise) and its bound set.
Status MakeTpStore(TpSetup& s, TpJanitor& janitor) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      fmt::format("{}/kvtier-replay-tp-XXXXXX", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
  if (mkdtemp(templ.data()) == nullptr) {
    return Status::IOError(fmt::format("cannot create a temporary directory {}", templ));
  }
  s.store_dir = templ;
  if (Status st = janitor.RemoveDirOnDeath(s.store_dir); !st.ok()) {
    RemoveStore(s);
    return st;
  }
  // Room for every page the run can store (every request's whole pages, the whole model's
  // bytes; a pass's TP size does not change them): the store never evicts, so storage hits
  // are the same at every TP size. (An evicting store is not: the ranks' writes of one page
  // interleave differently at TP=1 and TP=2, and so does what the store evicts first.) The
  // bound is a limit, not an allocation: the disk holds only the distinct pages.
  const int64_t P = s.o.cache.page_size;
  int64_t prompt_pages = 0;
  for (const WorkloadRequest& r : s.workload.requests) prompt_pages += r.input_length / P;
  const int64_t all_bytes = prompt_pages * P * s.model.kv_bytes_per_token();
  s.store_bytes =
      s.o.storage_bytes > 0 ? s.o.storage_bytes : std::max<int64_t>(all_bytes, int64_t{64} << 20);
  return Status::OK();
}

// --tp-equal-bytes: rank r's load baseline is a TP=1 pass on rank r's GPU at rank r's bytes
// per copy (MHA: one rank's share of the KV heads; MLA: the whole latent, which on GPU 0 is
// the TP=1 pass itself), each with its own store; the cpu device has one baseline for all.
// `passes` holds the passes run, `own_gpu` each rank's baseline (`tp1` for MLA's rank 0).
Status RunEqualBytesPasses(const TpSetup& s, const TpReplayArgs& a, const TpPassResult& tp1,
                           std::vector<TpPassResult>& passes,
                           std::vector<const TpPassResult*>& own_gpu) {
  const int gpus = s.gpu ? a.tp : 1;
  passes.resize(static_cast<size_t>(gpus));
  for (int r = 0; r < gpus; ++r) {
    if (s.model.mla && r == 0) continue;  // TP=1 itself
    TpSetup e = s;
    if (!s.model.mla) e.model = *TpRankModel(s.model, a.tp);
    e.first_gpu = s.DeviceOf(r);
    e.store_suffix = fmt::format("-gpu{}", r);
    Status st = RunTpPass(e, 1, nullptr, &passes[static_cast<size_t>(r)]);
    if (!st.ok()) {
      return st.WithContext(fmt::format("TP=1 on rank {}'s device at its bytes per copy", r));
    }
  }
  for (int r = 0; r < a.tp; ++r) {
    const size_t i = static_cast<size_t>(std::min(r, gpus - 1));
    own_gpu.push_back(s.model.mla && i == 0 ? &tp1 : &passes[i]);
  }
  return Status::OK();
}

// The TP=N pass: the ring created (and registered with the janitor), ranks 1 .. N-1 started and
// awaited, the pass served, the ring closed and the ranks reaped. A failed pass's status names
// TP=N; a rank that did not exit cleanly is Internal.
Status RunLeaderPass(const TpSetup& s, const TpReplayArgs& a, TpJanitor& janitor,
                     const std::vector<std::string>& self_args, TpPassResult& tpn) {
  const TpGroupConfig gc = TpGroupConfigOf(a, fmt::format("replay-tp.{}", getpid()));
  TpReplayArgs fa = a;
  auto leader = TpLeader::Create(gc, TpShape{s.device_slots, s.host_slots, s.model.num_layers,
                                             s.o.cache.page_size, s.model.mla});
  if (!leader.ok()) return leader.status();
  if (Status js = janitor.RemoveSegmentOnDeath(gc.name); !js.ok()) {
    leader->reset();
    return js;
  }
  // The point from which the ring exists and the ranks start (tests kill rank 0 here).
  std::fprintf(stderr, "kvtier replay --tp: group '%s' created; starting rank(s) 1-%d\n",
               gc.name.c_str(), a.tp - 1);
  std::fflush(stderr);
  const std::vector<pid_t> pids = StartFollowers(fa, gc.name, s.StoreUrl(a.tp), self_args);
  Status st = static_cast<int>(pids.size()) == a.tp - 1
                  ? (*leader)->WaitForFollowers()
                  : Status::Unavailable("could not start the follower ranks");
  if (st.ok()) {
    // The signal that the group is formed (tests wait for it before they kill a rank): every
    // rank attached, the TP=N pass about to start.
    std::string ranks;
    for (size_t i = 0; i < pids.size(); ++i) {
      ranks += fmt::format("{}rank {} (pid {})", i == 0 ? "" : ", ", i + 1, pids[i]);
    }
    std::fprintf(stderr, "kvtier replay --tp: %s attached; serving at TP=%d\n", ranks.c_str(),
                 a.tp);
    std::fflush(stderr);
    st = RunTpPass(s, a.tp, leader->get(), &tpn);
  }
  leader->reset();  // closes the ring: the followers exit
  const bool followers_clean = ReapFollowers(pids, st.ok() ? 30 : 2);
  if (!st.ok()) return st.WithContext(fmt::format("TP={}", a.tp));
  if (!followers_clean) {
    return Status::Internal("a follower rank did not exit cleanly (see its message above)");
  }
  return Status::OK();
}

TpRunInfo TpRunInfoOf(const TpSetup& s, const TpReplayArgs& a) {
  TpRunInfo info;
  info.tp = a.tp;
  info.workload = s.workload.name;
  info.warmup = s.o.warmup;
  info.model = s.model.name;
  info.mla = s.model.mla;
  info.gpu = s.gpu;
  info.io = TransferBackendName(s.io);
  info.storage = !s.store_dir.empty();
  info.command_line = s.o.command_line;
  info.json_path = s.o.json_path;
  return info;
}

}  // namespace

TpGroupConfig TpGroupConfigOf(const TpReplayArgs& a, std::string name) {
  TpGroupConfig gc = a.ring;
  gc.name = std::move(name);
  gc.tp_size = a.tp;
  return gc;
}

int RunReplayTp(const ReplayOptions& options, const TpReplayArgs& a,
                const std::vector<std::string>& self_args) {
  const char* who = a.rank > 0 ? "kvtier replay (tp rank)" : "kvtier replay --tp";
  auto fail = [&](const Status& st, int code) {
    std::fprintf(stderr, "%s%s: %s\n", who, a.rank > 0 ? fmt::format(" {}", a.rank).c_str() : "",
                 st.ToString().c_str());
    return code;
  };
  TpSetup s;
  int code = 2;
  if (Status st = SetUpTp(options, a, s, code); !st.ok()) return fail(st, code);
  if (a.rank > 0) {
    Status st = RunTpFollower(s, a);
    return st.ok() ? 0 : fail(st, 1);
  }
  if (s.o.storage != "none" && s.o.storage != "file") {
    return fail(Status::InvalidArgument(fmt::format(
                    "--tp: --storage {} is not supported; file (a file store of per-head "
                    "objects per pass) or none",
                    RedactUrl(s.o.storage))),
                2);
  }
  // Started before anything that must not outlive this run exists (the stores, the ring).
  std::error_code exe_error;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", exe_error).string();
  if (exe_error) {
    return fail(Status::IOError(fmt::format("/proc/self/exe: {}", exe_error.message())), 1);
  }
  Result<TpJanitor> janitor = TpJanitor::Start(self);
  if (!janitor.ok()) return fail(janitor.status(), 1);
  if (s.o.storage == "file") {
    if (Status st = MakeTpStore(s, *janitor); !st.ok()) return fail(st, 1);
  }

  TpPassResult tp1, tpn, tp1_shard;
  Status st = RunTpPass(s, 1, nullptr, &tp1);
  if (!st.ok()) {
    RemoveStore(s);
    return fail(st.WithContext("TP=1"), 1);
  }
  const bool shard_pass = a.equal_bytes && !s.model.mla && a.tp > 1;
  std::vector<TpPassResult> own_gpu_passes;
  std::vector<const TpPassResult*> own_gpu;
  if (a.equal_bytes && a.tp > 1) {
    st = RunEqualBytesPasses(s, a, tp1, own_gpu_passes, own_gpu);
    if (!st.ok()) {
      RemoveStore(s);
      return fail(st, 1);
    }
    // MHA: the baseline on GPU 0 is also the (GPU 0) equal-bytes pass of the earlier reports.
    if (shard_pass) tp1_shard = own_gpu_passes[0];
  }
  st = RunLeaderPass(s, a, *janitor, self_args, tpn);
  RemoveStore(s);
  if (!st.ok()) return fail(st, 1);

  Result<bool> equal =
      ReportTpPasses(TpRunInfoOf(s, a), tp1, tpn, shard_pass ? &tp1_shard : nullptr, own_gpu);
  if (!equal.ok()) return fail(equal.status(), 1);
  return *equal ? 0 : 1;
}

}  // namespace kvtier::tools
