// tools/kvtier/bench.h — `kvtier bench`: the reference transfer workload of docs/performance.md.
//
// Shared by the CPU half (bench.cc) and the GPU half (bench_gpu.cc, built only with CUDA):
//   - BenchOptions: what the command line asked for.
//   - BenchCase / EnumerateCases: the workload, one case per (shape, op, host layout, page size).
//   - DrawSlots: the random page selection of a case (source and destination drawn independently).
//   - HostKvBuffers: owned, mmap-backed host buffers of one KV region, with random fill, poison
//     and whole-buffer comparison (the correctness check of every row).
//   - BenchRow, PrintTable, PrintProgress, WriteJson: the output of docs/performance.md.
//
// Per case the pools are: a "device" pool (layer_first, what the engine owns on the GPU; a second
// host region on the cpu backend) and a host pool in the case's host layout. Both hold
// `pool_slots` slots, scaled from --tokens so the run fits the machine (see PoolSlotsFor).
//   load   = per-layer load: host pool -> device pool, one layer (layer `load_layer`).
//   backup = all-layer backup: device pool -> host pool, all layers.
//
// Thread safety: everything here is used from the one thread that runs the benchmark.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/status.h"
#include "kvtier/transfer.h"

namespace kvtier::tools {

enum class BenchShape : uint8_t { kMha = 0, kMla = 1 };
enum class BenchOp : uint8_t { kLoad = 0, kBackup = 1 };

const char* BenchShapeName(BenchShape shape);  // "mha", "mla"
const char* BenchOpName(BenchOp op);           // "load", "backup"
Result<BenchShape> ParseBenchShape(std::string_view name);
Result<BenchOp> ParseBenchOp(std::string_view name);

// The model shapes of the reference workload.
struct ModelShape {
  BenchShape shape;
  const char* model;        // "Llama-3-8B", "DeepSeek-V3"
  int64_t num_layers;       // 32, 61
  int64_t slot_bytes;       // 2048 (each of K and V), 1152 (the one MLA buffer)
  int64_t page_head_heads;  // head_num used for the page_head host layout: 8, 1
  bool mla;
  int64_t reference_device_slots;  // 65,536: the device pool of docs/performance.md
};
const ModelShape& ModelShapeOf(BenchShape shape);

struct BenchOptions {
  // Backends to run, in order. The CLI expands "all" to cpu, kernel, dma, auto.
  std::vector<TransferBackend> backends = {TransferBackend::kCpu};
  bool backends_from_all = false;  // "all": GPU backends that are unavailable are skipped
  int64_t tokens = 16384;          // tokens moved per row (rounded up to a page)
  int64_t layers = 0;              // 0 = the model's own layer count (32 MHA, 61 MLA)
  std::vector<int64_t> page_sizes = {1, 16, 64};
  std::vector<BenchShape> shapes = {BenchShape::kMha, BenchShape::kMla};
  std::vector<KvLayout> layouts = {KvLayout::kLayerFirst, KvLayout::kPageFirst,
                                   KvLayout::kPageFirstDirect, KvLayout::kPageHead};
  std::vector<BenchOp> ops = {BenchOp::kLoad, BenchOp::kBackup};
  int repeats = 5;  // timed runs per row (median reported), after one warm-up run
  int warmup = 1;
  uint64_t seed = 1;
  std::string json_path;  // empty: no JSON
  // The engines' configuration (cpu threads, device, SM caps, the dma fields): its flags are
  // generated from TransferEngineConfigSchema, which also holds their bounds.
  TransferEngineConfig transfer;
  // Pages of the bench's own host buffers: "default" (cpu rows: transparent huge pages; GPU
  // rows: cudaHostAlloc), "4k" (cpu rows: no THP), "thp" / "hugetlb" (GPU rows: an mmap on
  // transparent / reserved 2 MiB huge pages, registered with cudaHostRegister).
  std::string host_pages = "default";
  double warmup_ms = 0;          // GPU rows: keep calling this long before the warm-up calls
  bool reference_first = false;  // GPU loads: the cpu reference copy before the timed copies
  int both_load_sms = 0;         // both-direction rows: kernel SMs of the loads; 0 = engine's
  int both_backup_sms = 0;       // and of the backup; 0 = engine's
  // Bounds of the numeric options (Validate and the command line use them).
  static constexpr int64_t kMaxTokens = int64_t{1} << 22;
  static constexpr int64_t kMaxLayers = 1024;
  static constexpr int kMaxRepeats = 10000;
  static constexpr double kMaxWarmupMs = 60000;
  Status Validate() const;
};

// One configuration of the workload. All sizes are the scaled ones actually used.
struct BenchCase {
  BenchShape shape = BenchShape::kMha;
  BenchOp op = BenchOp::kLoad;
  KvLayout host_layout = KvLayout::kLayerFirst;
  int64_t page_size = 1;
  int64_t num_layers = 0;
  int64_t slot_bytes = 0;
  int64_t head_num = 1;  // of the host pool (page_head: 8 MHA / 1 MLA; else 1)
  bool mla = false;
  int64_t tokens = 0;      // tokens moved: a multiple of page_size
  int64_t pool_slots = 0;  // slots of each pool (device and host): a multiple of page_size
  int64_t load_layer = 0;  // the layer a per-layer load moves

  // The "device" pool: layer_first, head_num 1.
  KvGeometry DeviceGeometry() const;
  // The host pool in host_layout.
  KvGeometry HostGeometry() const;
  // Bytes moved by one run: tokens * layers moved * slot_bytes * buffers.
  int64_t BytesMoved() const;
  // Bytes of one pool (all buffers).
  int64_t PoolBytes() const;
  // "mha load page_first p16", for progress lines and messages.
  std::string Label() const;
};

// Pool slots for a run of `tokens` tokens at page `page_size`: room for twice the tokens, so the
// random pages are really scattered, capped at the reference pool (65,536) when that is enough,
// and always a multiple of 64 (every page size of the workload divides it) and of page_size.
int64_t PoolSlotsFor(int64_t tokens, int64_t page_size, int64_t reference_slots);

// Every case the options ask for, in table order: shape, op, layout, page size.
std::vector<BenchCase> EnumerateCases(const BenchOptions& options);

// The slot lists of one case: tokens/page_size distinct random pages on each side, drawn
// independently, each page contributing its page_size consecutive slots.
struct BenchSlots {
  std::vector<int64_t> host;    // indices into the host pool
  std::vector<int64_t> device;  // indices into the device pool
};
BenchSlots DrawSlots(const BenchCase& c, uint64_t seed);

// Owned host memory for the buffers of one KV region (K and V, or one MLA buffer), each an
// anonymous mmap (so a failed allocation is OutOfMemory, never an abort). Move-only.
class HostKvBuffers {
 public:
  // `huge_pages`: advise the buffers to transparent huge pages (MADV_HUGEPAGE).
  static Result<HostKvBuffers> Allocate(const KvGeometry& geometry, bool mla,
                                        bool huge_pages = true);

  HostKvBuffers() = default;
  HostKvBuffers(HostKvBuffers&& other) noexcept;
  HostKvBuffers& operator=(HostKvBuffers&& other) noexcept;
  HostKvBuffers(const HostKvBuffers&) = delete;
  HostKvBuffers& operator=(const HostKvBuffers&) = delete;
  ~HostKvBuffers();

  int num_buffers() const { return mla_ ? 1 : 2; }
  int64_t buffer_bytes() const { return geometry_.buffer_bytes(); }
  std::span<std::byte> buffer(int b) const {
    return {static_cast<std::byte*>(data_[b]), static_cast<size_t>(buffer_bytes())};
  }
  // A host region over these buffers (memory = kHost).
  KvRegion region() const;

  // Random bytes from `seed` (a splitmix64 stream; never an all-zero buffer).
  void FillRandom(uint64_t seed);
  // Every byte = `poison` (0xA5 by default; never what a correct copy leaves everywhere).
  void Poison(uint8_t poison = 0xA5);
  // OK when every byte of every buffer equals `other`'s; otherwise Corruption naming the first
  // differing buffer, byte offset, (layer, slot) in this geometry, and the two values.
  // REQUIRES: same geometry and kind.
  Status CompareWith(const HostKvBuffers& other) const;

 private:
  KvGeometry geometry_;
  bool mla_ = false;
  void* data_[2] = {nullptr, nullptr};
};

// One row of the table (docs/performance.md "How to measure").
struct BenchRow {
  std::string shape;   // "mha" / "mla"
  std::string op;      // "load" / "backup"
  std::string layout;  // host layout
  int64_t page_size = 0;
  std::string backend;  // "cpu", "kernel", "dma", "auto"
  int64_t tokens = 0;
  int64_t bytes = 0;
  double ms = 0;              // median time of one run (GPU time by events on GPU backends)
  double gbps = 0;            // bytes / ms (1 GB = 1e9 bytes)
  double ceiling_gbps = 0;    // the ceiling this row is compared with, measured in this run
  std::string ceiling;        // what the ceiling is: "memcpy" (cpu), "dma_h2d", "dma_d2h"
  double pct_of_ceiling = 0;  // 100 * gbps / ceiling_gbps
  double host_submit_us = 0;  // median wall time of the submitting call on the host
  // GPU rows: the same, measured while the timed calls were submitted (behind the stream gate,
  // in bursts for short calls), next to host_submit_us which is each call alone on an idle stream.
  double host_submit_timed_us = 0;
  // GPU rows, kernel backend: of host_submit_us, the median time inside the kernel launch calls
  // (the driver's share; the rest is the engine's own work).
  double host_launch_us = 0;
  // GPU rows: the copy engines' rate in the row's direction right after the row (64 MiB
  // cudaMemcpyAsync, median of 3), to tell a slow row from a slow link at that moment.
  double dma_now_gbps = 0;
  int sms_used = 0;       // SMs the backend occupied (0: cpu and dma)
  bool check_ok = false;  // byte-for-byte equal to testing::ReferenceTransfer
  std::string note;       // first mismatch, or why the row could not run
};

// A row of case `c` on `backend` with what names it filled in (shape, op, host layout, page
// size, backend, tokens, bytes moved); the measurements are the caller's.
BenchRow RowOf(const BenchCase& c, TransferBackend backend);

// One line on stderr per finished row: "[k/n] mha load page_first p16 cpu: 12.3 GB/s ok".
void PrintProgress(const BenchRow& row, size_t index, size_t total);
// The table, with a header line, to `out`.
void PrintTable(std::FILE* out, const std::vector<BenchRow>& rows);
// {"command": ..., "rows": [ {field: value, ...}, ... ]} to `path`.
Status WriteJson(const std::string& path, const std::string& command,
                 const std::vector<BenchRow>& rows);

double Median(std::vector<double> values);

// The cpu rows (options.backends containing kCpu). Appends to *rows.
Status RunCpuBench(const BenchOptions& options, std::vector<BenchRow>* rows);

// The GPU rows: every backend in options.backends other than kCpu. Defined in bench_gpu.cc.
// Returns Unavailable when kvtier was built without CUDA or no GPU is present (the caller skips
// GPU backends then when they came from "all", and fails otherwise).
Status RunGpuBench(const BenchOptions& options, std::vector<BenchRow>* rows);

}  // namespace kvtier::tools
