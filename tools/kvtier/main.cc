// tools/kvtier/main.cc — the `kvtier` command line: `kvtier replay`, `kvtier demo`, `kvtier bench`.
//
// CLI11 parses; everything else is errors as values. Exit codes: 0 success, 1 a check failed or
// a run could not complete, 2 bad command line (CLI11's own codes for parse errors).
//
// Thread safety: a single-threaded program (the transfer engines run their own workers).
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"
#include "config_flags.h"
#include "kvtier/storage.h"
#include "replay_cli.h"
#include "replay_tp.h"
#include "shm.h"
#include "storage_bench.h"
#include "storage_hit_bench.h"

namespace kvtier::tools {
namespace {

template <typename T, typename Parse>
Status ParseList(const std::vector<std::string>& names, Parse parse, std::vector<T>* out) {
  out->clear();
  for (const std::string& name : names) {
    KVTIER_ASSIGN_OR_RETURN(T value, parse(name));
    if (std::find(out->begin(), out->end(), value) == out->end()) out->push_back(value);
  }
  return Status::OK();
}

// The command line as reports record it, the user info of every URL (an argument with "://")
// redacted: --storage URL and --storage=URL alike.
std::string JoinArgs(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) s += ' ';
    const std::string_view arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.find("://") == std::string_view::npos) {
      s += arg;
    } else if (arg.starts_with("--") && eq != std::string_view::npos && eq < arg.find("://")) {
      s += arg.substr(0, eq + 1);
      s += RedactUrl(arg.substr(eq + 1));
    } else {
      s += RedactUrl(arg);
    }
  }
  return s;
}

struct BenchArgs {
  std::string backend = "cpu";
  std::vector<std::string> shapes = {"mha", "mla"};
  std::vector<std::string> layouts = {"layer_first", "page_first", "page_first_direct",
                                      "page_head"};
  std::vector<std::string> ops = {"load", "backup"};
  std::vector<int> both_sms = {0, 0};
};

// Checks before a run that `path` can be written (a run takes minutes; its JSON should not fail
// at the end). Leaves no file behind that was not there.
Status CheckWritable(const std::string& path) {
  const bool existed = std::filesystem::exists(path);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    return Status::InvalidArgument(
        fmt::format("--json {}: cannot write there: {}", path, std::strerror(errno)));
  }
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
  return Status::OK();
}

// Runs `kvtier bench` with parsed options. Returns the process exit code.
int RunBench(BenchOptions options, const BenchArgs& args, const std::string& command) {
  Status parsed = ParseList<BenchShape>(args.shapes, ParseBenchShape, &options.shapes);
  if (parsed.ok()) parsed = ParseList<KvLayout>(args.layouts, ParseLayout, &options.layouts);
  if (parsed.ok()) parsed = ParseList<BenchOp>(args.ops, ParseBenchOp, &options.ops);
  if (args.backend == "all") {
    options.backends = {TransferBackend::kCpu, TransferBackend::kKernel, TransferBackend::kDma,
                        TransferBackend::kAuto};
    options.backends_from_all = true;
  } else if (parsed.ok()) {
    Result<TransferBackend> b = ParseTransferBackend(args.backend);
    if (b.ok()) {
      options.backends = {*b};
    } else {
      parsed = b.status();
    }
  }
  options.both_load_sms = args.both_sms[0];
  options.both_backup_sms = args.both_sms[1];
  if (parsed.ok()) parsed = options.Validate();
  if (parsed.ok() && !options.json_path.empty()) parsed = CheckWritable(options.json_path);
  if (!parsed.ok()) {
    std::fprintf(stderr, "kvtier bench: %s\n", parsed.ToString().c_str());
    return 2;
  }

  std::vector<BenchRow> rows;
  const bool want_cpu = std::find(options.backends.begin(), options.backends.end(),
                                  TransferBackend::kCpu) != options.backends.end();
  BenchOptions gpu_options = options;
  gpu_options.backends.clear();
  for (TransferBackend b : options.backends) {
    if (b != TransferBackend::kCpu) gpu_options.backends.push_back(b);
  }
  int exit_code = 0;
  if (want_cpu) {
    Status s = RunCpuBench(options, &rows);
    if (!s.ok()) {
      std::fprintf(stderr, "kvtier bench: cpu rows: %s\n", s.ToString().c_str());
      exit_code = 1;
    }
  }
  if (!gpu_options.backends.empty()) {
    Status s = RunGpuBench(gpu_options, &rows);
    if (s.IsUnavailable() && options.backends_from_all) {
      std::fprintf(stderr, "kvtier bench: GPU backends skipped: %s\n", s.message().c_str());
    } else if (!s.ok()) {
      std::fprintf(stderr, "kvtier bench: GPU rows: %s\n", s.ToString().c_str());
      exit_code = 1;
    }
  }
  // Table order: shape, op, then the order each half produced (layout, page size, backend).
  auto rank = [&](const BenchRow& r) {
    const size_t shape = std::find_if(options.shapes.begin(), options.shapes.end(),
                                      [&](BenchShape s) { return r.shape == BenchShapeName(s); }) -
                         options.shapes.begin();
    const size_t op = std::find_if(options.ops.begin(), options.ops.end(),
                                   [&](BenchOp o) { return r.op == BenchOpName(o); }) -
                      options.ops.begin();
    return std::pair(shape, op);
  };
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const BenchRow& a, const BenchRow& b) { return rank(a) < rank(b); });
  if (!rows.empty()) PrintTable(stdout, rows);
  const auto failed =
      std::count_if(rows.begin(), rows.end(), [](const BenchRow& r) { return !r.check_ok; });
  if (failed > 0) {
    std::fprintf(stderr, "kvtier bench: %lld of %zu rows FAILED the byte-for-byte check\n",
                 static_cast<long long>(failed), rows.size());
    exit_code = 1;
  }
  if (!options.json_path.empty()) {
    Status s = WriteJson(options.json_path, command, rows);
    if (!s.ok()) {
      std::fprintf(stderr, "kvtier bench: %s\n", s.ToString().c_str());
      exit_code = 1;
    }
  }
  return exit_code;
}

// Standard output that cannot take the report: a regular file on a full filesystem, or the
// device that refuses every write (/dev/full). Checked before a command runs, so that it fails at
// once rather than after the run (what else fills up meanwhile shows at the end: FinishStdout).
Status CheckStdoutWritable() {
  struct stat out {};
  if (fstat(STDOUT_FILENO, &out) != 0) return Status::OK();
  if (S_ISREG(out.st_mode)) {
    struct statvfs fs {};
    if (fstatvfs(STDOUT_FILENO, &fs) == 0 && fs.f_bavail == 0 && fs.f_blocks > 0) {
      return Status::IOError("cannot write to standard output: its filesystem is full");
    }
  } else if (S_ISCHR(out.st_mode)) {
    struct stat full {};
    if (stat("/dev/full", &full) == 0 && S_ISCHR(full.st_mode) && full.st_rdev == out.st_rdev) {
      return Status::IOError(
          "cannot write to standard output: it is /dev/full, which refuses every write");
    }
  }
  return Status::OK();
}

// A command's exit code once what it printed is flushed: a write error on standard output (the
// report lost) turns a 0 into 1, with a message.
int FinishStdout(int code) {
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "kvtier: cannot write to standard output: %s\n",
                 std::strerror(errno != 0 ? errno : EIO));
    return code == 0 ? 1 : code;
  }
  return code;
}

// Runs the parsed command; its exit code.
int RunCommand(int argc, char** argv, CLI::App* bench, BenchOptions& options, const BenchArgs& args,
               StorageBenchOptions& storage_options, StorageHitBenchOptions& storage_hit_options,
               CLI::App* replay, ReplayOptions& replay_options, const TpReplayArgs& tp_args,
               CLI::App* demo, DemoOptions& demo_options, ShmCommand& shm) {
  if (bench->parsed() && bench->count("--storage") > 0 && storage_options.url.empty()) {
    std::fprintf(stderr,
                 "kvtier bench: --storage is empty (give a URL: file:///dir, redis://host:port, "
                 "memory://; without --storage the bench measures transfers)\n");
    return 2;
  }
  if (bench->parsed() && bench->count("--storage-hit") > 0 && storage_hit_options.url.empty()) {
    std::fprintf(stderr,
                 "kvtier bench: --storage-hit is empty (give a URL: file:///dir, "
                 "redis://host:port, memory://)\n");
    return 2;
  }
  if (bench->parsed() && !storage_hit_options.url.empty()) {
    storage_hit_options.repeats = options.repeats;
    return RunStorageHitBench(storage_hit_options);
  }
  if (bench->parsed() && !storage_options.url.empty()) {
    storage_options.repeats = options.repeats;
    storage_options.json_path = options.json_path;
    return RunStorageBench(storage_options, JoinArgs(argc, argv));
  }
  if (bench->parsed()) return RunBench(options, args, JoinArgs(argc, argv));
  if (replay->parsed()) {
    replay_options.command_line = JoinArgs(argc, argv);
    if (tp_args.tp > 1 || tp_args.rank > 0) {
      return RunReplayTp(replay_options, tp_args, std::vector<std::string>(argv + 1, argv + argc));
    }
    return RunReplay(replay_options);
  }
  if (demo->parsed()) {
    demo_options.command_line = JoinArgs(argc, argv);
    return RunDemo(demo_options);
  }
  if (shm.parsed()) return shm.Run();
  return 2;
}

// `kvtier bench` and its transfer benchmark's flags (the storage benches add theirs).
CLI::App* AddBenchCommand(CLI::App* app, BenchOptions* options, BenchArgs* args) {
  CLI::App* bench = app->add_subcommand(
      "bench", "Benchmark the transfer backends on the reference workload; checks every byte");
  bench->footer(
      "Transfer benchmark on the reference workload of docs/performance.md: MHA (Llama-3-8B: 32 "
      "layers, slot_bytes 2048 for K and for V) and MLA (DeepSeek-V3: 61 layers, slot_bytes "
      "1152), tokens moved in random pages (source and destination pages drawn independently), "
      "per-layer load (host -> device, one layer) and all-layer backup (device -> host) for every "
      "host layout. Every row is checked byte-for-byte against an independent reference and "
      "compared with a ceiling measured in the same run (cpu: one memcpy of the same byte count; "
      "GPU: a DMA copy). Prints one table; exits non-zero if any check fails.");
  bench
      ->add_option("--backend", args->backend,
                   "cpu: multi-threaded gather/scatter, host memory only (the 'device' pool is a "
                   "second host region); kernel: CUDA copy kernels over pinned host memory; dma: "
                   "copy engines; auto: picks kernel or dma per request; all: every backend "
                   "(GPU ones skipped with a message when no GPU is usable)")
      ->check(CLI::IsMember({"cpu", "kernel", "dma", "auto", "all"}))
      ->capture_default_str();
  bench
      ->add_option("--tokens", options->tokens,
                   "tokens moved per row (rounded up to the page size); the pools hold about "
                   "twice this many slots, so memory grows with it")
      ->check(CLI::Range(int64_t{1}, BenchOptions::kMaxTokens))
      ->capture_default_str();
  bench
      ->add_option("--layers", options->layers,
                   "layers of both shapes; 0 = the model's own (32 for mha, 61 for mla)")
      ->check(CLI::Range(int64_t{0}, BenchOptions::kMaxLayers))
      ->capture_default_str();
  bench
      ->add_option("--page-sizes", options->page_sizes,
                   "comma-separated page sizes (powers of two, 1..256)")
      ->delimiter(',')
      ->capture_default_str();
  bench->add_option("--shapes", args->shapes, "comma-separated model shapes: mha, mla")
      ->delimiter(',')
      ->capture_default_str();
  bench
      ->add_option("--layouts", args->layouts,
                   "comma-separated host layouts: layer_first, page_first, page_first_direct, "
                   "page_head (page_head uses 8 heads for mha, 1 for mla)")
      ->delimiter(',')
      ->capture_default_str();
  bench
      ->add_option("--ops", args->ops,
                   "comma-separated ops: load (per-layer, host -> device), backup (all layers, "
                   "device -> host)")
      ->delimiter(',')
      ->capture_default_str();
  bench
      ->add_option("--repeats", options->repeats,
                   "timed runs per row after the warm-up; the median is reported")
      ->check(CLI::Range(1, BenchOptions::kMaxRepeats))
      ->capture_default_str();
  bench->add_option("--warmup", options->warmup, "untimed warm-up runs per row")
      ->check(CLI::Range(0, BenchOptions::kMaxRepeats))
      ->capture_default_str();
  bench->add_option("--seed", options->seed, "seed of the random pages and random data")
      ->capture_default_str();
  bench->add_option("--json", options->json_path,
                    "also write the rows as JSON to this file (checked to be writable first)");
  // The engines' TransferEngineConfig: one flag per field of its schema (names, defaults, bounds
  // and help from include/kvtier/transfer.h); --threads is the older name of --cpu-threads.
  AddSchemaFlags(bench, kvtier::TransferEngineConfigSchema(), &options->transfer,
                 {{"cpu_threads", ",--threads"}});
  // Measurement switches.
  bench
      ->add_option("--host-pages", options->host_pages,
                   "pages of the bench's host buffers: default (cpu rows: transparent huge "
                   "pages; GPU rows: cudaHostAlloc), 4k (cpu rows), thp, hugetlb (GPU rows)")
      ->check(CLI::IsMember({"default", "4k", "thp", "hugetlb"}))
      ->capture_default_str();
  bench
      ->add_option("--warmup-ms", options->warmup_ms,
                   "GPU rows: keep calling this many ms before the warm-up calls")
      ->check(CLI::Range(0.0, BenchOptions::kMaxWarmupMs))
      ->capture_default_str();
  bench->add_flag("--reference-first", options->reference_first,
                  "GPU loads: make the cpu reference copy before the timed copies");
  bench
      ->add_option("--both-sms", args->both_sms,
                   "both-direction rows: kernel SMs of the loads and of the backup, e.g. 8,3; "
                   "0 = the engine's choice")
      ->delimiter(',')
      ->expected(2)
      ->check(CLI::Range(
          int64_t{0}, kvtier::FindField(kvtier::TransferEngineConfigSchema(), "max_sms")->int_max));
  return bench;
}

}  // namespace
}  // namespace kvtier::tools

int main(int argc, char** argv) {
  using namespace kvtier::tools;
  CLI::App app{
      "kvtier: a hierarchical KV cache for LLM inference (GPU <-> pinned host <-> storage).\n"
      "This tool replays workloads through the cache's tiers (replay, demo) and benchmarks the KV "
      "transfer backends (bench).",
      "kvtier"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvtier 0.1.0");
  app.footer("Run `kvtier <command> --help` for the flags of a command.");

  // ---- bench ----
  BenchOptions options;
  BenchArgs args;
  CLI::App* bench = AddBenchCommand(&app, &options, &args);
  StorageBenchOptions storage_options;
  AddStorageBenchOptions(bench, &storage_options);
  StorageHitBenchOptions storage_hit_options;
  AddStorageHitBenchOptions(bench, &storage_hit_options);

  // ---- replay, demo ----
  ReplayOptions replay_options;
  CLI::App* replay = AddReplayCommand(app, &replay_options);
  TpReplayArgs tp_args;
  AddTpReplayFlags(replay, &tp_args);
  DemoOptions demo_options;
  CLI::App* demo = AddDemoCommand(app, &demo_options);

  ShmCommand shm(app);
  RejectUnrepresentableNumbers(&app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad flag exits 2, as every command's own checks do (CLI11's
    // own codes, 105 for a refused value, would make "2 for bad flags" depend on where the flag
    // was checked).
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (!shm.parsed()) {  // shm prints to a terminal, and writes nothing it could lose
    if (kvtier::Status st = CheckStdoutWritable(); !st.ok()) {
      std::fprintf(stderr, "kvtier: %s\n", st.message().c_str());
      return 1;
    }
  }
  return FinishStdout(RunCommand(argc, argv, bench, options, args, storage_options,
                                 storage_hit_options, replay, replay_options, tp_args, demo,
                                 demo_options, shm));
}
