// tools/kvtier/bench.cc — the workload, buffers and output of `kvtier bench`, and its cpu rows.
//
// The cpu rows follow docs/performance.md with host memory standing in for the GPU: the "device"
// pool is a second host region. The ceiling of a cpu row is one plain memcpy of the same byte count
// from the same source (target 6: the gather/scatter reaches >= 70 % of it), measured in the same
// row, alternating with the backend's runs so both see the same machine. Every row fills its
// source with random bytes, poisons its destination, runs the backend (warm-up, then the timed
// repeats), and compares the whole destination with testing::ReferenceTransfer run into a second
// poisoned destination.
//
// Thread safety: used from one thread (the cpu backend spreads each copy over its own pool).
#include "bench.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "kvtier/testing/reference_copy.h"

namespace kvtier::tools {
namespace {

constexpr ModelShape kMhaShape = {BenchShape::kMha, "Llama-3-8B", 32, 2048, 8, false, 65536};
constexpr ModelShape kMlaShape = {BenchShape::kMla, "DeepSeek-V3", 61, 1152, 1, true, 65536};

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// (layer, slot, head) of byte `offset` of a buffer with geometry `g`: the inverse of
// KvGeometry::HeadOffset, for error messages only.
std::string DescribeOffset(const KvGeometry& g, int64_t offset) {
  const int64_t L = g.num_layers, N = g.num_slots, S = g.slot_bytes, P = g.page_size;
  const int64_t H = g.head_num, D = S / H;
  int64_t layer = 0, slot = 0, head = 0;
  switch (g.layout) {
    case KvLayout::kLayerFirst:
      layer = offset / (N * S);
      slot = offset % (N * S) / S;
      break;
    case KvLayout::kPageFirst:
      slot = offset / (L * S);
      layer = offset % (L * S) / S;
      break;
    case KvLayout::kPageFirstDirect: {
      const int64_t p = offset / (L * P * S), r = offset % (L * P * S);
      layer = r / (P * S);
      slot = p * P + r % (P * S) / S;
      break;
    }
    case KvLayout::kPageHead: {
      const int64_t p = offset / (H * P * L * D), r = offset % (H * P * L * D);
      head = r / (P * L * D);
      const int64_t r2 = r % (P * L * D);
      slot = p * P + r2 / (L * D);
      layer = r2 % (L * D) / D;
      break;
    }
  }
  return fmt::format("layer {} slot {} head {}", layer, slot, head);
}

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read (no check then).
int64_t AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// Copies the first `bytes` bytes of `src`'s buffers into `dst`'s (K then V): one memcpy when
// they fit in one buffer, as they do whenever the pools hold twice the tokens.
void FlatCopy(const HostKvBuffers& src, const HostKvBuffers& dst, int64_t bytes) {
  for (int b = 0; b < src.num_buffers() && bytes > 0; ++b) {
    const int64_t n = std::min(bytes, std::min(src.buffer_bytes(), dst.buffer_bytes()));
    std::memcpy(dst.buffer(b).data(), src.buffer(b).data(), static_cast<size_t>(n));
    bytes -= n;
  }
}

// Runs one cpu row on pools that the caller allocated for the case's shape/layout/page size.
Result<BenchRow> RunCpuRow(const BenchCase& c, const BenchOptions& options, TransferEngine& engine,
                           HostKvBuffers& device_pool, HostKvBuffers& host_pool,
                           uint64_t row_seed) {
  BenchRow row = RowOf(c, TransferBackend::kCpu);
  row.ceiling = "memcpy";
  row.sms_used = 0;

  const BenchSlots slots = DrawSlots(c, row_seed);
  const bool load = c.op == BenchOp::kLoad;
  HostKvBuffers& src = load ? host_pool : device_pool;
  HostKvBuffers& dst = load ? device_pool : host_pool;
  const KvRegion src_region = src.region();
  const KvRegion dst_region = dst.region();
  const SlotIndices src_slots = SlotIndices::Host(load ? slots.host : slots.device);
  const SlotIndices dst_slots = SlotIndices::Host(load ? slots.device : slots.host);
  TransferRequest request =
      load ? TransferRequest::PerLayer(src_region, dst_region, src_slots, dst_slots, c.load_layer)
           : TransferRequest::AllLayers(src_region, dst_region, src_slots, dst_slots);

  // The second destination: first the target of the memcpy ceiling, then of the reference.
  KVTIER_ASSIGN_OR_RETURN(
      HostKvBuffers expected,
      HostKvBuffers::Allocate(dst_region.geometry, c.mla, options.host_pages != "4k"));
  src.FillRandom(row_seed ^ 0x5EEDF00Dull);
  dst.Poison();
  expected.Poison();
  for (int w = 0; w < options.warmup; ++w) {
    FlatCopy(src, expected, row.bytes);
    KVTIER_RETURN_IF_ERROR(engine.Transfer(request).WithContext(c.Label()));
  }
  // The ceiling and the backend alternate, so both see the same machine (other processes, clock
  // and cache state); each is the median of `repeats` runs.
  std::vector<double> memcpy_seconds, transfer_seconds;
  for (int r = 0; r < options.repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    FlatCopy(src, expected, row.bytes);
    memcpy_seconds.push_back(SecondsSince(t0));
    t0 = std::chrono::steady_clock::now();
    KVTIER_RETURN_IF_ERROR(engine.Transfer(request).WithContext(c.Label()));
    transfer_seconds.push_back(SecondsSince(t0));
  }
  const double median_s = Median(transfer_seconds);
  row.ms = median_s * 1e3;
  row.gbps = static_cast<double>(row.bytes) / median_s / 1e9;
  row.ceiling_gbps = static_cast<double>(row.bytes) / Median(memcpy_seconds) / 1e9;
  row.pct_of_ceiling = 100.0 * row.gbps / row.ceiling_gbps;
  // The cpu backend is synchronous: the submitting call is the whole copy.
  row.host_submit_us = median_s * 1e6;

  // The independent reference, into a second poisoned destination of the same geometry.
  expected.Poison();
  const KvRegion expected_region = expected.region();
  TransferRequest reference = request;
  reference.dst = &expected_region;
  KVTIER_RETURN_IF_ERROR(testing::ReferenceTransfer(reference).WithContext("reference copy"));
  const Status check = dst.CompareWith(expected);
  row.check_ok = check.ok();
  if (!check.ok()) row.note = check.message();
  return row;
}

std::string JoinLayoutNames(const std::vector<KvLayout>& layouts) {
  std::string out;
  for (KvLayout l : layouts) {
    if (!out.empty()) out += ',';
    out += LayoutName(l);
  }
  return out;
}

}  // namespace

const char* BenchShapeName(BenchShape shape) { return shape == BenchShape::kMha ? "mha" : "mla"; }
const char* BenchOpName(BenchOp op) { return op == BenchOp::kLoad ? "load" : "backup"; }

Result<BenchShape> ParseBenchShape(std::string_view name) {
  if (name == "mha") return BenchShape::kMha;
  if (name == "mla") return BenchShape::kMla;
  return Status::InvalidArgument(
      fmt::format("shape '{}' is not one of: mha (Llama-3-8B), mla (DeepSeek-V3)", name));
}

Result<BenchOp> ParseBenchOp(std::string_view name) {
  if (name == "load") return BenchOp::kLoad;
  if (name == "backup") return BenchOp::kBackup;
  return Status::InvalidArgument(fmt::format(
      "op '{}' is not one of: load (per-layer host->device), backup (all-layer device->host)",
      name));
}

const ModelShape& ModelShapeOf(BenchShape shape) {
  return shape == BenchShape::kMha ? kMhaShape : kMlaShape;
}

Status BenchOptions::Validate() const {
  auto range = [](std::string_view name, auto value, auto lo, auto hi) -> Status {
    if (value < lo || value > hi) {
      return Status::InvalidArgument(
          fmt::format("{} = {} is out of range; must be in [{}, {}]", name, value, lo, hi));
    }
    return Status::OK();
  };
  if (backends.empty()) return Status::InvalidArgument("backends is empty");
  KVTIER_RETURN_IF_ERROR(range("tokens", tokens, int64_t{1}, kMaxTokens));
  KVTIER_RETURN_IF_ERROR(range("layers", layers, int64_t{0}, kMaxLayers));
  if (page_sizes.empty()) return Status::InvalidArgument("page_sizes is empty");
  for (int64_t p : page_sizes) KVTIER_RETURN_IF_ERROR(ValidatePageSize(p, "page size"));
  if (shapes.empty()) return Status::InvalidArgument("shapes is empty");
  if (layouts.empty()) return Status::InvalidArgument("layouts is empty");
  if (ops.empty()) return Status::InvalidArgument("ops is empty");
  KVTIER_RETURN_IF_ERROR(range("repeats", repeats, 1, kMaxRepeats));
  KVTIER_RETURN_IF_ERROR(range("warmup", warmup, 0, kMaxRepeats));
  // The per-call SM caps of the both-direction rows: up to the engine's own max_sms bound.
  const int64_t max_sms = FindField(TransferEngineConfigSchema(), "max_sms")->int_max;
  KVTIER_RETURN_IF_ERROR(range("both_load_sms", both_load_sms, 0, max_sms));
  KVTIER_RETURN_IF_ERROR(range("both_backup_sms", both_backup_sms, 0, max_sms));
  KVTIER_RETURN_IF_ERROR(range("warmup_ms", warmup_ms, 0.0, kMaxWarmupMs));
  if (host_pages != "default" && host_pages != "4k" && host_pages != "thp" &&
      host_pages != "hugetlb") {
    return Status::InvalidArgument(
        fmt::format("host_pages = '{}' is not one of default, 4k, thp, hugetlb", host_pages));
  }
  return transfer.Validate();
}

KvGeometry BenchCase::DeviceGeometry() const {
  KvGeometry g;
  g.layout = KvLayout::kLayerFirst;
  g.num_layers = num_layers;
  g.num_slots = pool_slots;
  g.slot_bytes = slot_bytes;
  g.page_size = page_size;
  g.head_num = 1;
  return g;
}

KvGeometry BenchCase::HostGeometry() const {
  KvGeometry g = DeviceGeometry();
  g.layout = host_layout;
  g.head_num = head_num;
  return g;
}

int64_t BenchCase::BytesMoved() const {
  const int64_t layers_moved = op == BenchOp::kLoad ? 1 : num_layers;
  return tokens * layers_moved * slot_bytes * (mla ? 1 : 2);
}

int64_t BenchCase::PoolBytes() const {
  return pool_slots * num_layers * slot_bytes * (mla ? 1 : 2);
}

BenchRow RowOf(const BenchCase& c, TransferBackend backend) {
  BenchRow row;
  row.shape = BenchShapeName(c.shape);
  row.op = BenchOpName(c.op);
  row.layout = LayoutName(c.host_layout);
  row.page_size = c.page_size;
  row.backend = TransferBackendName(backend);
  row.tokens = c.tokens;
  row.bytes = c.BytesMoved();
  return row;
}

std::string BenchCase::Label() const {
  return fmt::format("{} {} {} p{}", BenchShapeName(shape), BenchOpName(op),
                     LayoutName(host_layout), page_size);
}

int64_t PoolSlotsFor(int64_t tokens, int64_t page_size, int64_t reference_slots) {
  const int64_t unit = std::max<int64_t>(64, page_size);
  const int64_t moved = RoundUp(tokens, page_size);
  // Twice the tokens; never more than the reference pool unless the tokens alone need more.
  const int64_t want = std::min(2 * moved, std::max(reference_slots, moved));
  return RoundUp(std::max(want, moved), unit);
}

std::vector<BenchCase> EnumerateCases(const BenchOptions& options) {
  std::vector<BenchCase> cases;
  for (BenchShape shape : options.shapes) {
    const ModelShape& m = ModelShapeOf(shape);
    for (BenchOp op : options.ops) {
      for (KvLayout layout : options.layouts) {
        for (int64_t page : options.page_sizes) {
          BenchCase c;
          c.shape = shape;
          c.op = op;
          c.host_layout = layout;
          c.page_size = page;
          c.num_layers = options.layers > 0 ? options.layers : m.num_layers;
          c.slot_bytes = m.slot_bytes;
          c.head_num = layout == KvLayout::kPageHead ? m.page_head_heads : 1;
          c.mla = m.mla;
          c.tokens = RoundUp(options.tokens, page);
          c.pool_slots = PoolSlotsFor(options.tokens, page, m.reference_device_slots);
          c.load_layer = c.num_layers / 2;
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}

BenchSlots DrawSlots(const BenchCase& c, uint64_t seed) {
  const int64_t pages_needed = c.tokens / c.page_size;
  const int64_t pool_pages = c.pool_slots / c.page_size;
  std::mt19937_64 rng(seed);
  auto draw = [&](std::vector<int64_t>* out) {
    std::vector<int64_t> pages(static_cast<size_t>(pool_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    out->reserve(static_cast<size_t>(c.tokens));
    for (int64_t k = 0; k < pages_needed; ++k) {
      for (int64_t o = 0; o < c.page_size; ++o) out->push_back(pages[k] * c.page_size + o);
    }
  };
  BenchSlots slots;
  draw(&slots.host);
  draw(&slots.device);
  return slots;
}

// ---- HostKvBuffers ------------------------------------------------------------------------

Result<HostKvBuffers> HostKvBuffers::Allocate(const KvGeometry& geometry, bool mla,
                                              bool huge_pages) {
  HostKvBuffers b;
  b.geometry_ = geometry;
  b.mla_ = mla;
  const int64_t bytes = geometry.buffer_bytes();
  if (bytes <= 0) {
    return Status::InvalidArgument(fmt::format("buffer of {} bytes (geometry {}x{}x{})", bytes,
                                               geometry.num_layers, geometry.num_slots,
                                               geometry.slot_bytes));
  }
  for (int i = 0; i < b.num_buffers(); ++i) {
    void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return Status::OutOfMemory(fmt::format("mmap of {} bytes for KV buffer {} failed: {}", bytes,
                                             i, std::strerror(errno)));
    }
    // Transparent huge pages, as every HostKvPool asks for (--host-pages 4k: 4 KiB pages, to
    // measure what the page size is worth).
    if (huge_pages) (void)madvise(p, static_cast<size_t>(bytes), MADV_HUGEPAGE);
    b.data_[i] = p;
  }
  return b;
}

HostKvBuffers::HostKvBuffers(HostKvBuffers&& other) noexcept
    : geometry_(other.geometry_), mla_(other.mla_) {
  data_[0] = std::exchange(other.data_[0], nullptr);
  data_[1] = std::exchange(other.data_[1], nullptr);
}

HostKvBuffers& HostKvBuffers::operator=(HostKvBuffers&& other) noexcept {
  if (this != &other) {
    this->~HostKvBuffers();
    geometry_ = other.geometry_;
    mla_ = other.mla_;
    data_[0] = std::exchange(other.data_[0], nullptr);
    data_[1] = std::exchange(other.data_[1], nullptr);
  }
  return *this;
}

HostKvBuffers::~HostKvBuffers() {
  for (void*& p : data_) {
    if (p != nullptr) munmap(p, static_cast<size_t>(buffer_bytes()));
    p = nullptr;
  }
}

KvRegion HostKvBuffers::region() const {
  KvRegion r;
  r.geometry = geometry_;
  r.mla = mla_;
  r.memory = MemoryKind::kHost;
  r.k = data_[0];
  r.v = mla_ ? nullptr : data_[1];
  return r;
}

void HostKvBuffers::FillRandom(uint64_t seed) {
  uint64_t state = seed;
  for (int b = 0; b < num_buffers(); ++b) {
    std::span<std::byte> buf = buffer(b);
    const size_t words = buf.size() / 8;
    auto* w = reinterpret_cast<uint64_t*>(buf.data());  // mmap memory: page aligned
    for (size_t i = 0; i < words; ++i) w[i] = SplitMix64(&state);
    for (size_t i = words * 8; i < buf.size(); ++i) {
      buf[i] = static_cast<std::byte>(SplitMix64(&state) | 1);
    }
  }
}

void HostKvBuffers::Poison(uint8_t poison) {
  for (int b = 0; b < num_buffers(); ++b) std::memset(buffer(b).data(), poison, buffer(b).size());
}

Status HostKvBuffers::CompareWith(const HostKvBuffers& other) const {
  for (int b = 0; b < num_buffers(); ++b) {
    std::span<const std::byte> mine = buffer(b), theirs = other.buffer(b);
    if (std::memcmp(mine.data(), theirs.data(), mine.size()) == 0) continue;
    const auto [a, e] = std::mismatch(mine.begin(), mine.end(), theirs.begin());
    const int64_t offset = a - mine.begin();
    int64_t differing = 0;
    for (size_t i = 0; i < mine.size(); ++i) differing += mine[i] != theirs[i];
    return Status::Corruption(fmt::format(
        "buffer {} differs from the reference in {} bytes; first at byte {} ({}): got 0x{:02x}, "
        "expected 0x{:02x}",
        b == 0 ? (mla_ ? "kv" : "k") : "v", differing, offset, DescribeOffset(geometry_, offset),
        static_cast<unsigned>(*a), static_cast<unsigned>(*e)));
  }
  return Status::OK();
}

// ---- output -------------------------------------------------------------------------------

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void PrintProgress(const BenchRow& row, size_t index, size_t total) {
  std::fprintf(stderr, "[%zu/%zu] %s %s %s p%lld %s: %.2f GB/s (%.0f%% of %s) %s%s%s\n", index + 1,
               total, row.shape.c_str(), row.op.c_str(), row.layout.c_str(),
               static_cast<long long>(row.page_size), row.backend.c_str(), row.gbps,
               row.pct_of_ceiling, row.ceiling.c_str(), row.check_ok ? "ok" : "FAIL",
               row.note.empty() ? "" : ": ", row.note.c_str());
}

void PrintTable(std::FILE* out, const std::vector<BenchRow>& rows) {
  std::fprintf(out, "%-5s %-6s %-17s %4s %-7s %7s %12s %9s %8s %7s %11s %4s %-5s %8s\n", "shape",
               "op", "layout", "page", "backend", "tokens", "bytes", "ms", "GB/s", "%ceil",
               "submit_us", "SMs", "check", "dma_now");
  for (const BenchRow& r : rows) {
    const std::string dma_now = r.dma_now_gbps > 0 ? fmt::format("{:.2f}", r.dma_now_gbps) : "-";
    std::fprintf(
        out, "%-5s %-6s %-17s %4lld %-7s %7lld %12lld %9.3f %8.2f %6.1f%% %11.1f %4d %-5s %8s\n",
        r.shape.c_str(), r.op.c_str(), r.layout.c_str(), static_cast<long long>(r.page_size),
        r.backend.c_str(), static_cast<long long>(r.tokens), static_cast<long long>(r.bytes), r.ms,
        r.gbps, r.pct_of_ceiling, r.host_submit_us, r.sms_used, r.check_ok ? "ok" : "FAIL",
        dma_now.c_str());
  }
  for (const BenchRow& r : rows) {
    if (!r.note.empty()) {
      std::fprintf(out, "note: %s %s %s p%lld %s: %s\n", r.shape.c_str(), r.op.c_str(),
                   r.layout.c_str(), static_cast<long long>(r.page_size), r.backend.c_str(),
                   r.note.c_str());
    }
  }
}

Status WriteJson(const std::string& path, const std::string& command,
                 const std::vector<BenchRow>& rows) {
  nlohmann::json doc;
  doc["command"] = command;
  nlohmann::json& out = doc["rows"] = nlohmann::json::array();
  for (const BenchRow& r : rows) {
    out.push_back({{"shape", r.shape},
                   {"op", r.op},
                   {"layout", r.layout},
                   {"page_size", r.page_size},
                   {"backend", r.backend},
                   {"tokens", r.tokens},
                   {"bytes", r.bytes},
                   {"ms", r.ms},
                   {"gbps", r.gbps},
                   {"ceiling", r.ceiling},
                   {"ceiling_gbps", r.ceiling_gbps},
                   {"pct_of_ceiling", r.pct_of_ceiling},
                   {"host_submit_us", r.host_submit_us},
                   {"host_submit_timed_us", r.host_submit_timed_us},
                   {"host_launch_us", r.host_launch_us},
                   {"dma_now_gbps", r.dma_now_gbps},
                   {"sms_used", r.sms_used},
                   {"check", r.check_ok ? "ok" : "FAIL"},
                   {"note", r.note}});
  }
  std::ofstream file(path);
  if (!file) return Status::IOError(fmt::format("cannot open --json file '{}' for writing", path));
  file << doc.dump(2) << '\n';
  file.close();
  if (!file) return Status::IOError(fmt::format("writing --json file '{}' failed", path));
  return Status::OK();
}

// ---- the cpu rows ---------------------------------------------------------------------------

Status RunCpuBench(const BenchOptions& options, std::vector<BenchRow>* rows) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> engine,
                          MakeTransferEngine(TransferBackend::kCpu, options.transfer));
  const std::vector<BenchCase> cases = EnumerateCases(options);

  // Sizes first, so a run that will not fit says so before it starts.
  for (BenchShape shape : options.shapes) {
    for (const BenchCase& c : cases) {
      if (c.shape != shape) continue;
      std::fprintf(stderr,
                   "%s (%s): %lld layers, slot_bytes %lld%s, pools of %lld slots (%.2f GiB "
                   "each; 3 live at once: device, host, reference), %lld tokens per row, "
                   "layouts %s\n",
                   BenchShapeName(shape), ModelShapeOf(shape).model,
                   static_cast<long long>(c.num_layers), static_cast<long long>(c.slot_bytes),
                   c.mla ? "" : " (K and V)", static_cast<long long>(c.pool_slots),
                   static_cast<double>(c.PoolBytes()) / (1 << 30), static_cast<long long>(c.tokens),
                   JoinLayoutNames(options.layouts).c_str());
      break;
    }
  }

  int64_t peak_bytes = 0;
  for (const BenchCase& c : cases) peak_bytes = std::max(peak_bytes, 3 * c.PoolBytes());
  const int64_t available = AvailableMemoryBytes();
  if (available > 0 && peak_bytes > available) {
    return Status::OutOfMemory(fmt::format(
        "the run needs {:.1f} GiB at once (3 pools) but the machine has {:.1f} GiB available; "
        "pass a smaller --tokens (or --layers)",
        static_cast<double>(peak_bytes) / (1 << 30), static_cast<double>(available) / (1 << 30)));
  }

  // Pools are shared by the rows of one (shape, layout, page size); allocate them per group.
  size_t index = 0;
  for (BenchShape shape : options.shapes) {
    for (KvLayout layout : options.layouts) {
      for (int64_t page : options.page_sizes) {
        std::optional<HostKvBuffers> device_pool, host_pool;
        for (const BenchCase& c : cases) {
          if (c.shape != shape || c.host_layout != layout || c.page_size != page) continue;
          if (!device_pool) {
            KVTIER_ASSIGN_OR_RETURN(
                device_pool,
                HostKvBuffers::Allocate(c.DeviceGeometry(), c.mla, options.host_pages != "4k"));
            KVTIER_ASSIGN_OR_RETURN(host_pool, HostKvBuffers::Allocate(c.HostGeometry(), c.mla,
                                                                       options.host_pages != "4k"));
          }
          const uint64_t row_seed = options.seed * 1000003ull + index;
          KVTIER_ASSIGN_OR_RETURN(
              BenchRow row, RunCpuRow(c, options, *engine, *device_pool, *host_pool, row_seed));
          PrintProgress(row, index, cases.size());
          rows->push_back(std::move(row));
          ++index;
        }
      }
    }
  }
  return Status::OK();
}

}  // namespace kvtier::tools
