// HostKvPool: capacity arithmetic, one anonymous mmap per buffer (huge pages when asked and
// available), optional CUDA registration, and a SlotAllocator over the resulting slots.
//
// Resource order: mappings are made first, registrations second; `Buffers` declares them in that
// order so destruction unregisters before it unmaps, and a failure half-way through Create
// releases whatever was already made.
//
// Thread safety: see kvtier/host_pool.h; nothing here is shared between pools.
#include "kvtier/host_pool.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "kvtier/device.h"
#include "util/log.h"

namespace kvtier {
namespace {

constexpr int64_t kDefaultHugePageBytes = int64_t{2} << 20;

const char* BufferName(bool mla, int b) { return mla ? "mla" : (b == 0 ? "k" : "v"); }

// An anonymous private mapping, unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t length) : addr_(addr), length_(length) {}
  Mapping(Mapping&& other) noexcept
      : addr_(std::exchange(other.addr_, nullptr)), length_(std::exchange(other.length_, 0)) {}
  Mapping& operator=(Mapping&& other) noexcept {
    if (this != &other) {
      Release();
      addr_ = std::exchange(other.addr_, nullptr);
      length_ = std::exchange(other.length_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { Release(); }

  void* data() const { return addr_; }
  size_t length() const { return length_; }

 private:
  void Release() {
    if (addr_ != nullptr && munmap(addr_, length_) != 0) {
      util::Log(util::LogLevel::kError, "host pool: munmap of {} bytes at {} failed: {}", length_,
                addr_, std::strerror(errno));
    }
    addr_ = nullptr;
    length_ = 0;
  }

  void* addr_ = nullptr;
  size_t length_ = 0;
};

// Maps `length` bytes; on failure returns an empty Mapping and sets `*error` to errno.
Mapping MapAnonymous(size_t length, bool huge, int* error) {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (huge) flags |= MAP_HUGETLB;
  void* addr = mmap(nullptr, length, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (addr == MAP_FAILED) {
    *error = errno;
    return Mapping();
  }
  *error = 0;
  return Mapping(addr, length);
}

// The default huge page size from /proc/meminfo ("Hugepagesize:    2048 kB"), or 2 MiB.
int64_t HugePageBytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return kDefaultHugePageBytes;
  char line[256];
  int64_t bytes = kDefaultHugePageBytes;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long kib = 0;
    if (std::sscanf(line, "Hugepagesize: %lld kB", &kib) == 1 && kib > 0) {
      bytes = static_cast<int64_t>(kib) * 1024;
      break;
    }
  }
  std::fclose(f);
  return bytes;
}

// a * b, or InvalidArgument naming `what` on overflow.
Result<int64_t> CheckedMul(int64_t a, int64_t b, const char* what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    return Status::InvalidArgument(
        fmt::format("HostKvPoolConfig: {} overflows int64 ({} x {})", what, a, b));
  }
  return out;
}

// What a valid config turns into: whole pages of all buffers within the capacity budget.
struct PoolShape {
  int num_buffers = 0;
  int64_t num_slots = 0;
  int64_t buffer_bytes = 0;  // bytes of each buffer
};

// REQUIRES: the per-field checks of HostKvPoolConfig::Validate passed.
Result<PoolShape> ComputeShape(const HostKvPoolConfig& config) {
  const int num_buffers = config.mla ? 1 : 2;
  KVTIER_ASSIGN_OR_RETURN(const int64_t layer_slot_bytes,
                          CheckedMul(config.geometry.num_layers, config.geometry.slot_bytes,
                                     "num_layers * slot_bytes"));
  KVTIER_ASSIGN_OR_RETURN(const int64_t slot_total_bytes,
                          CheckedMul(layer_slot_bytes, num_buffers, "bytes per slot"));
  KVTIER_ASSIGN_OR_RETURN(
      const int64_t page_bytes,
      CheckedMul(slot_total_bytes, config.geometry.page_size, "bytes per page"));
  int64_t budget = config.capacity_bytes;
  std::string budget_source = fmt::format("capacity_bytes = {}", config.capacity_bytes);
  if (config.device_ratio > 0) {
    const long double wanted =
        static_cast<long double>(config.device_ratio) * config.device_pool_bytes;
    if (wanted >= static_cast<long double>(std::numeric_limits<int64_t>::max())) {
      return Status::InvalidArgument(fmt::format(
          "HostKvPoolConfig.device_ratio = {} times device_pool_bytes = {} overflows int64",
          config.device_ratio, config.device_pool_bytes));
    }
    budget = static_cast<int64_t>(std::floor(wanted));
    budget_source = fmt::format("device_ratio = {} x device_pool_bytes = {} = {} bytes",
                                config.device_ratio, config.device_pool_bytes, budget);
  }
  const int64_t num_pages = budget / page_bytes;
  if (num_pages < 1) {
    return Status::InvalidArgument(fmt::format(
        "HostKvPoolConfig: {} is less than one page of {} bytes ({} buffer(s) x {} layers x "
        "page_size {} x slot_bytes {})",
        budget_source, page_bytes, num_buffers, config.geometry.num_layers,
        config.geometry.page_size, config.geometry.slot_bytes));
  }
  PoolShape shape;
  shape.num_buffers = num_buffers;
  shape.num_slots = num_pages * config.geometry.page_size;
  shape.buffer_bytes = num_pages * (page_bytes / num_buffers);
  return shape;
}

}  // namespace

struct HostKvPool::Buffers {
  // Declaration order matters: registrations are destroyed (unregistered) before the mappings.
  std::vector<Mapping> mappings;
  std::vector<PinnedRegistration> registrations;  // empty: plain memory
  bool huge_pages = false;
  int64_t capacity_bytes = 0;

  bool cuda_registered() const { return !registrations.empty(); }
};

Status HostKvPoolConfig::Validate() const {
  const int layout_index = static_cast<int>(geometry.layout);
  if (layout_index < 0 || layout_index >= kNumLayouts) {
    return Status::InvalidArgument(
        fmt::format("HostKvPoolConfig.geometry.layout = {} is not a known layout", layout_index));
  }
  if (geometry.num_layers <= 0) {
    return Status::InvalidArgument(fmt::format(
        "HostKvPoolConfig.geometry.num_layers = {} must be positive", geometry.num_layers));
  }
  if (geometry.slot_bytes <= 0 || geometry.slot_bytes % kSlotBytesAlignment != 0) {
    return Status::InvalidArgument(
        fmt::format("HostKvPoolConfig.geometry.slot_bytes = {} must be a positive multiple of {}",
                    geometry.slot_bytes, kSlotBytesAlignment));
  }
  if (geometry.page_size <= 0) {
    return Status::InvalidArgument(fmt::format(
        "HostKvPoolConfig.geometry.page_size = {} must be positive", geometry.page_size));
  }
  if (geometry.head_num <= 0) {
    return Status::InvalidArgument(
        fmt::format("HostKvPoolConfig.geometry.head_num = {} must be positive", geometry.head_num));
  }
  if (geometry.layout == KvLayout::kPageHead &&
      (geometry.slot_bytes % geometry.head_num != 0 ||
       (geometry.slot_bytes / geometry.head_num) % kSlotBytesAlignment != 0)) {
    return Status::InvalidArgument(
        fmt::format("HostKvPoolConfig.geometry.head_num = {} must divide slot_bytes = {} into "
                    "multiples of {} bytes for page_head",
                    geometry.head_num, geometry.slot_bytes, kSlotBytesAlignment));
  }
  if (capacity_bytes < 0) {
    return Status::InvalidArgument(
        fmt::format("HostKvPoolConfig.capacity_bytes = {} must not be negative", capacity_bytes));
  }
  if (!std::isfinite(device_ratio) || device_ratio < 0) {
    return Status::InvalidArgument(fmt::format(
        "HostKvPoolConfig.device_ratio = {} must be a finite non-negative number", device_ratio));
  }
  if (device_pool_bytes < 0) {
    return Status::InvalidArgument(fmt::format(
        "HostKvPoolConfig.device_pool_bytes = {} must not be negative", device_pool_bytes));
  }
  if ((capacity_bytes > 0) == (device_ratio > 0)) {
    return Status::InvalidArgument(fmt::format(
        "HostKvPoolConfig: set exactly one of capacity_bytes (= {}) and device_ratio (= {})",
        capacity_bytes, device_ratio));
  }
  if (device_ratio > 0 && device_pool_bytes <= 0) {
    return Status::InvalidArgument(fmt::format(
        "HostKvPoolConfig.device_pool_bytes = {} must be positive when device_ratio = {} is used",
        device_pool_bytes, device_ratio));
  }
  return ComputeShape(*this).status();
}

HostKvPool::HostKvPool(std::unique_ptr<Buffers> buffers, std::unique_ptr<SlotAllocator> allocator,
                       KvRegion region)
    : buffers_(std::move(buffers)), allocator_(std::move(allocator)), region_(region) {}

HostKvPool::HostKvPool(HostKvPool&&) noexcept = default;
HostKvPool& HostKvPool::operator=(HostKvPool&&) noexcept = default;
HostKvPool::~HostKvPool() = default;

int64_t HostKvPool::capacity_bytes() const { return buffers_ ? buffers_->capacity_bytes : 0; }
bool HostKvPool::huge_pages() const { return buffers_ && buffers_->huge_pages; }
bool HostKvPool::cuda_registered() const { return buffers_ && buffers_->cuda_registered(); }

Result<std::unique_ptr<HostKvPool>> HostKvPool::Create(const HostKvPoolConfig& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  KVTIER_ASSIGN_OR_RETURN(const PoolShape shape, ComputeShape(config));
  const int num_buffers = shape.num_buffers;
  const int64_t num_slots = shape.num_slots;
  const int64_t buffer_bytes = shape.buffer_bytes;

  KvRegion region;
  region.geometry = config.geometry;
  region.geometry.num_slots = num_slots;
  region.mla = config.mla;
  region.memory = MemoryKind::kHost;
  region.device = -1;

  auto buffers = std::make_unique<Buffers>();
  buffers->capacity_bytes = buffer_bytes * num_buffers;

  // ---- mappings: huge pages for all buffers, or normal pages for all ----
  if (config.huge_pages) {
    const int64_t huge_bytes = HugePageBytes();
    const int64_t rounded = buffer_bytes > std::numeric_limits<int64_t>::max() - huge_bytes
                                ? buffer_bytes  // cannot be mapped anyway; fails below
                                : (buffer_bytes + huge_bytes - 1) / huge_bytes * huge_bytes;
    int error = 0;
    for (int b = 0; b < num_buffers; ++b) {
      Mapping m = MapAnonymous(static_cast<size_t>(rounded), /*huge=*/true, &error);
      if (m.data() == nullptr) break;
      buffers->mappings.push_back(std::move(m));
    }
    if (static_cast<int>(buffers->mappings.size()) == num_buffers) {
      buffers->huge_pages = true;
    } else {
      buffers->mappings.clear();
      util::Log(util::LogLevel::kWarning,
                "host pool: huge pages requested but MAP_HUGETLB of {} bytes per buffer ({}-byte "
                "pages) failed: {}; using normal pages (reserve huge pages with "
                "`sysctl vm.nr_hugepages=N`)",
                rounded, huge_bytes, std::strerror(error));
    }
  }
  if (!buffers->huge_pages) {
    for (int b = 0; b < num_buffers; ++b) {
      int error = 0;
      Mapping m = MapAnonymous(static_cast<size_t>(buffer_bytes), /*huge=*/false, &error);
      if (m.data() == nullptr) {
        return Status::OutOfMemory(fmt::format(
            "host pool: mmap of {} bytes for buffer {} ({} bytes for the whole pool) failed: {}",
            buffer_bytes, BufferName(config.mla, b), buffers->capacity_bytes,
            std::strerror(error)));
      }
      // Always ask for transparent huge pages where the kernel has them (advisory, so failure
      // is fine): slot and head chunks land at random places in pools of many GiB, and with
      // 4 KiB pages every chunk is a TLB miss (docs/perf-notes/cpu-backend.md).
      (void)madvise(m.data(), m.length(), MADV_HUGEPAGE);
      buffers->mappings.push_back(std::move(m));
    }
  }
  region.k = buffers->mappings[0].data();
  region.v = config.mla ? nullptr : buffers->mappings[1].data();

  // ---- CUDA registration (when a GPU is present) ----
  if (config.register_with_cuda) {
    buffers->registrations.reserve(static_cast<size_t>(num_buffers));
    for (int b = 0; b < num_buffers; ++b) {
      const Mapping& m = buffers->mappings[b];
      Result<PinnedRegistration> reg =
          PinnedRegistration::RegisterIfGpuPresent(m.data(), static_cast<int64_t>(m.length()));
      if (!reg.ok()) {
        // `buffers` goes out of scope: earlier registrations are undone, then every mapping.
        return Status::CudaError(fmt::format(
            "host pool: the pool could not be pinned (buffer {}): {}. Shrink the host pool, or "
            "set register_with_cuda = false",
            BufferName(config.mla, b), reg.status().message()));
      }
      if (!reg->registered()) break;  // no GPU: plain memory
      buffers->registrations.push_back(std::move(reg).value());
    }
  }

  KVTIER_RETURN_IF_ERROR(region.Validate("host pool region").WithContext("internal error"));
  KVTIER_ASSIGN_OR_RETURN(auto allocator,
                          SlotAllocator::Create(num_slots, config.geometry.page_size));
  return std::unique_ptr<HostKvPool>(
      new HostKvPool(std::move(buffers), std::move(allocator), region));
}

}  // namespace kvtier
