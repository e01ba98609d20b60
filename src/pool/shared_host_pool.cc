// The shared host tier (see kvtier/shared_host_pool.h): a segment (shm_segment.h) laid out as
// shm_layout.h says, its page index (shm_page_index.h) and the CUDA registration of its page
// bytes in this process.
//
// Resource order: the mapping is made first, this process's record in the index second, the CUDA
// registration last; `State` declares them so that destruction unregisters, then detaches, then
// unmaps, and a failure half-way through releases what was made.
//
// Thread safety: see kvtier/shared_host_pool.h; the index lock serialises the bookkeeping.
#include "kvtier/shared_host_pool.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <utility>

#include "kvtier/device.h"
#include "pool/shm_layout.h"
#include "pool/shm_page_index.h"
#include "pool/shm_segment.h"
#include "util/log.h"

namespace kvtier {

namespace {

constexpr int64_t kSlotBytesAlignment = 4;  // what the transfer backends require

Status ValidateGeometry(const KvGeometry& g, const char* what) {
  const int layout_index = static_cast<int>(g.layout);
  if (layout_index < 0 || layout_index >= kNumLayouts) {
    return Status::InvalidArgument(
        fmt::format("{}.layout = {} is not a known layout", what, layout_index));
  }
  if (g.num_layers <= 0) {
    return Status::InvalidArgument(
        fmt::format("{}.num_layers = {} must be positive", what, g.num_layers));
  }
  if (g.slot_bytes <= 0 || g.slot_bytes % kSlotBytesAlignment != 0) {
    return Status::InvalidArgument(
        fmt::format("{}.slot_bytes = {} must be a positive multiple of {}", what, g.slot_bytes,
                    kSlotBytesAlignment));
  }
  if (g.page_size <= 0) {
    return Status::InvalidArgument(
        fmt::format("{}.page_size = {} must be positive", what, g.page_size));
  }
  if (g.head_num <= 0) {
    return Status::InvalidArgument(
        fmt::format("{}.head_num = {} must be positive", what, g.head_num));
  }
  if (g.layout == KvLayout::kPageHead &&
      (g.slot_bytes % g.head_num != 0 || (g.slot_bytes / g.head_num) % kSlotBytesAlignment != 0)) {
    return Status::InvalidArgument(fmt::format(
        "{}.head_num = {} must divide slot_bytes = {} into multiples of {} bytes for page_head",
        what, g.head_num, g.slot_bytes, kSlotBytesAlignment));
  }
  if (g.num_slots < 0 || g.num_slots % g.page_size != 0) {
    return Status::InvalidArgument(
        fmt::format("{}.num_slots = {} must be a non-negative multiple of page_size = {}", what,
                    g.num_slots, g.page_size));
  }
  return Status::OK();
}

// The config's geometry with num_slots derived from capacity_bytes when it is 0.
Result<KvGeometry> PoolGeometry(const SharedHostPoolConfig& config) {
  KvGeometry g = config.geometry;
  if (g.num_slots == 0) {
    const int64_t num_buffers = config.mla ? 1 : 2;
    int64_t page_bytes = 0;
    if (__builtin_mul_overflow(g.num_layers, g.slot_bytes, &page_bytes) ||
        __builtin_mul_overflow(page_bytes, g.page_size, &page_bytes) ||
        __builtin_mul_overflow(page_bytes, num_buffers, &page_bytes)) {
      return Status::InvalidArgument(fmt::format(
          "SharedHostPoolConfig: bytes per page overflow ({} layers x {} slots x {} bytes)",
          g.num_layers, g.page_size, g.slot_bytes));
    }
    const int64_t pages = config.capacity_bytes / page_bytes;
    if (pages < 1) {
      return Status::InvalidArgument(
          fmt::format("SharedHostPoolConfig.capacity_bytes = {} is less than one page of {} bytes",
                      config.capacity_bytes, page_bytes));
    }
    g.num_slots = pages * g.page_size;
  }
  return g;
}

// Compares the segment's geometry with the expected one; InvalidArgument naming the field.
Status CheckExpectedGeometry(std::string_view name, const KvGeometry& have, bool have_mla,
                             const KvGeometry& want, bool want_mla) {
  const auto mismatch = [&](const char* field, auto segment_value, auto wanted) {
    return Status::InvalidArgument(
        fmt::format("shared host pool '{}': {} is {} in the segment but {} was expected", name,
                    field, segment_value, wanted));
  };
  if (have.layout != want.layout) {
    return mismatch("layout", LayoutName(have.layout), LayoutName(want.layout));
  }
  if (have_mla != want_mla) return mismatch("mla", have_mla, want_mla);
  if (have.num_layers != want.num_layers) {
    return mismatch("num_layers", have.num_layers, want.num_layers);
  }
  if (have.slot_bytes != want.slot_bytes) {
    return mismatch("slot_bytes", have.slot_bytes, want.slot_bytes);
  }
  if (have.page_size != want.page_size) {
    return mismatch("page_size", have.page_size, want.page_size);
  }
  if (have.head_num != want.head_num) return mismatch("head_num", have.head_num, want.head_num);
  if (want.num_slots != 0 && have.num_slots != want.num_slots) {
    return mismatch("num_slots", have.num_slots, want.num_slots);
  }
  return Status::OK();
}

// Waits for the creator to finish, then checks that the header describes a segment this build
// can use and that fits the mapping. Returns the segment's geometry and MLA flag.
Status CheckSegmentHeader(std::string_view name, const shm::SharedMapping& mapping, int timeout_ms,
                          KvGeometry* geometry, bool* mla) {
  if (mapping.bytes() < static_cast<int64_t>(sizeof(shm::SegmentHeader))) {
    return Status::InvalidArgument(fmt::format(
        "shared host pool '{}' ({}) is {} bytes, smaller than a header: not a kvtier segment", name,
        mapping.path(), mapping.bytes()));
  }
  const auto* h = reinterpret_cast<const shm::SegmentHeader*>(mapping.data());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  uint64_t magic = h->magic.load(std::memory_order_acquire);
  while (magic == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    magic = h->magic.load(std::memory_order_acquire);
  }
  if (magic == 0) {
    return Status::Unavailable(fmt::format(
        "shared host pool '{}' ({}) was not initialised within {} ms (its creator is slow or "
        "died; `kvtier shm destroy {}` removes it)",
        name, mapping.path(), timeout_ms, name));
  }
  if (magic != shm::kSegmentMagic) {
    return Status::InvalidArgument(
        fmt::format("shared host pool '{}' ({}) is not a kvtier segment (magic {:#x})", name,
                    mapping.path(), magic));
  }
  if (h->version != shm::kSegmentVersion || h->header_bytes != sizeof(shm::SegmentHeader)) {
    return Status::InvalidArgument(fmt::format(
        "shared host pool '{}': version is {} (header {} bytes) in the segment but this kvtier "
        "uses version {} (header {} bytes); a segment of another version cannot be opened: "
        "remove it (`kvtier shm destroy {}`, once no process uses it) and create it again",
        name, h->version, h->header_bytes, shm::kSegmentVersion, sizeof(shm::SegmentHeader), name));
  }
  KvGeometry g;
  g.layout = static_cast<KvLayout>(h->layout);
  g.num_layers = h->num_layers;
  g.num_slots = h->num_slots;
  g.slot_bytes = h->slot_bytes;
  g.page_size = h->page_size;
  g.head_num = h->head_num;
  if (h->layout >= static_cast<uint32_t>(kNumLayouts) || h->mla > 1) {
    return Status::Corruption(
        fmt::format("shared host pool '{}': the header's layout or mla field is invalid", name));
  }
  KVTIER_RETURN_IF_ERROR(
      ValidateGeometry(g, "segment header")
          .WithContext(fmt::format("shared host pool '{}' has a corrupt header", name)));
  const int max_processes = h->max_processes;
  if (max_processes < 1 || max_processes > shm::kMaxProcessesLimit) {
    return Status::Corruption(fmt::format(
        "shared host pool '{}': the header's max_processes = {} is invalid", name, max_processes));
  }
  KVTIER_ASSIGN_OR_RETURN(const shm::SegmentLayout layout,
                          shm::ComputeSegmentLayout(g, h->mla != 0, max_processes));
  if (layout.num_pages != h->num_pages || layout.process_offset != h->process_offset ||
      layout.page_offset != h->page_offset || layout.refs_offset != h->refs_offset ||
      layout.bucket_offset != h->bucket_offset || layout.num_buckets != h->num_buckets ||
      layout.child_bucket_offset != h->child_bucket_offset ||
      layout.data_offset != h->data_offset ||
      static_cast<uint64_t>(layout.buffer_bytes) != h->buffer_bytes ||
      static_cast<uint64_t>(layout.buffer_stride) != h->buffer_stride ||
      layout.segment_bytes != h->segment_bytes ||
      static_cast<int64_t>(layout.segment_bytes) > mapping.bytes()) {
    return Status::Corruption(fmt::format(
        "shared host pool '{}': the header's sections do not match its geometry or the segment "
        "size ({} bytes)",
        name, mapping.bytes()));
  }
  *geometry = g;
  *mla = h->mla != 0;
  return Status::OK();
}

}  // namespace

const char* ReserveOutcomeName(ReserveOutcome outcome) {
  switch (outcome) {
    case ReserveOutcome::kReserved:
      return "reserved";
    case ReserveOutcome::kAlreadyReady:
      return "already_ready";
    case ReserveOutcome::kBeingWritten:
      return "being_written";
    case ReserveOutcome::kNoSpace:
      return "no_space";
    case ReserveOutcome::kNoParent:
      return "no_parent";
  }
  return "unknown";
}

Status SharedHostPoolConfig::Validate() const {
  KVTIER_RETURN_IF_ERROR(shm::ValidateSegmentName(name));
  KVTIER_RETURN_IF_ERROR(ValidateGeometry(geometry, "SharedHostPoolConfig.geometry"));
  if (capacity_bytes < 0) {
    return Status::InvalidArgument(fmt::format(
        "SharedHostPoolConfig.capacity_bytes = {} must not be negative", capacity_bytes));
  }
  if ((capacity_bytes > 0) == (geometry.num_slots > 0)) {
    return Status::InvalidArgument(fmt::format(
        "SharedHostPoolConfig: set exactly one of capacity_bytes (= {}) and geometry.num_slots "
        "(= {})",
        capacity_bytes, geometry.num_slots));
  }
  if (max_processes < 1 || max_processes > shm::kMaxProcessesLimit) {
    return Status::InvalidArgument(
        fmt::format("SharedHostPoolConfig.max_processes = {} must be in [1, {}]", max_processes,
                    shm::kMaxProcessesLimit));
  }
  if (group_id < -1 || group_id > INT32_MAX) {
    return Status::InvalidArgument(fmt::format(
        "SharedHostPoolConfig.group_id = {} must be -1 (none) or a group id", group_id));
  }
  KVTIER_ASSIGN_OR_RETURN(const KvGeometry g, PoolGeometry(*this));
  return shm::ComputeSegmentLayout(g, mla, max_processes).status();
}

struct SharedHostPool::State {
  // Declaration order matters: registration is undone, then the record detached (in ~State),
  // then the mapping unmapped.
  std::string name;
  shm::SharedMapping mapping;
  std::unique_ptr<shm::PageIndex> index;
  int slot = -1;
  int64_t pid = 0;
  KvRegion region;
  std::vector<PinnedRegistration> registrations;

  ~State() {
    registrations.clear();
    if (index != nullptr && slot >= 0 && getpid() == pid) {
      Status s = index->DetachProcess(slot);
      if (!s.ok()) {
        util::Log(util::LogLevel::kError, "shared host pool '{}': detaching failed: {}", name,
                  s.ToString());
      }
    }
  }

  Status CheckCaller() const {
    if (getpid() != pid) {
      return Status::FailedPrecondition(fmt::format(
          "shared host pool '{}' was attached by process {}, not by this process {} (a child of "
          "fork() must attach again)",
          name, pid, static_cast<int64_t>(getpid())));
    }
    return Status::OK();
  }

  // Everything after the segment is mapped and its header checked: the index, this process's
  // record, the region and the CUDA registration.
  static Result<std::unique_ptr<State>> Open(std::string_view name, shm::SharedMapping mapping,
                                             const KvGeometry& geometry, bool mla,
                                             bool register_with_cuda) {
    auto state = std::make_unique<State>();
    state->name = std::string(name);
    state->mapping = std::move(mapping);
    state->index = std::make_unique<shm::PageIndex>(state->mapping.data());
    state->pid = getpid();
    KVTIER_ASSIGN_OR_RETURN(
        state->slot, state->index->AttachProcess(state->pid, shm::ProcessStartTime(state->pid)));
    const shm::SegmentHeader* h = state->index->header();
    std::byte* data = state->mapping.data() + h->data_offset;
    state->region.geometry = geometry;
    state->region.mla = mla;
    state->region.memory = MemoryKind::kHost;
    state->region.k = data;
    state->region.v = mla ? nullptr : data + h->buffer_stride;
    KVTIER_RETURN_IF_ERROR(state->region.Validate("shared host pool region"));
    if (register_with_cuda) {
      const int64_t bytes = static_cast<int64_t>(h->segment_bytes - h->data_offset);
      KVTIER_ASSIGN_OR_RETURN(PinnedRegistration reg,
                              PinnedRegistration::RegisterIfGpuPresent(data, bytes));
      if (reg.registered()) state->registrations.push_back(std::move(reg));
    }
    return state;
  }
};

SharedHostPool::SharedHostPool(std::unique_ptr<State> state) : state_(std::move(state)) {}
SharedHostPool::~SharedHostPool() = default;

Result<std::unique_ptr<SharedHostPool>> SharedHostPool::Create(const SharedHostPoolConfig& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  KVTIER_ASSIGN_OR_RETURN(const KvGeometry geometry, PoolGeometry(config));
  KVTIER_ASSIGN_OR_RETURN(const shm::SegmentLayout layout,
                          shm::ComputeSegmentLayout(geometry, config.mla, config.max_processes));
  shm::CreateSegmentOptions options;
  options.bytes = static_cast<int64_t>(layout.segment_bytes);
  options.huge_pages = config.huge_pages;
  options.group_id = config.group_id;
  KVTIER_ASSIGN_OR_RETURN(shm::SharedMapping mapping, shm::CreateSegment(config.name, options));
  Status s = shm::PageIndex::Initialize(mapping.data(), layout, geometry, config.mla,
                                        mapping.huge_pages());
  if (s.ok()) {
    reinterpret_cast<shm::SegmentHeader*>(mapping.data())
        ->magic.store(shm::kSegmentMagic, std::memory_order_release);
  }
  Result<std::unique_ptr<State>> state =
      s.ok() ? State::Open(config.name, std::move(mapping), geometry, config.mla,
                           config.register_with_cuda)
             : Result<std::unique_ptr<State>>(s);
  if (!state.ok()) {
    (void)shm::UnlinkSegment(config.name);
    return state.status();
  }
  return std::unique_ptr<SharedHostPool>(new SharedHostPool(std::move(state).value()));
}

Result<std::unique_ptr<SharedHostPool>> SharedHostPool::Attach(
    std::string_view name, const SharedHostPoolAttachOptions& options) {
  if (options.expected_geometry.has_value()) {
    KVTIER_RETURN_IF_ERROR(ValidateGeometry(*options.expected_geometry,
                                            "SharedHostPoolAttachOptions.expected_geometry"));
  }
  // A segment that its creator has not sized yet opens as Unavailable; wait for it a little.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.init_timeout_ms);
  Result<shm::SharedMapping> mapping = shm::OpenSegment(name);
  while (!mapping.ok() && mapping.status().IsUnavailable() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    mapping = shm::OpenSegment(name);
  }
  if (!mapping.ok()) return mapping.status();
  KvGeometry geometry;
  bool mla = false;
  KVTIER_RETURN_IF_ERROR(
      CheckSegmentHeader(name, *mapping, options.init_timeout_ms, &geometry, &mla));
  if (options.expected_geometry.has_value()) {
    KVTIER_RETURN_IF_ERROR(
        CheckExpectedGeometry(name, geometry, mla, *options.expected_geometry, options.mla));
  }
  KVTIER_ASSIGN_OR_RETURN(auto state, State::Open(name, std::move(mapping).value(), geometry, mla,
                                                  options.register_with_cuda));
  return std::unique_ptr<SharedHostPool>(new SharedHostPool(std::move(state)));
}

Result<std::unique_ptr<SharedHostPool>> SharedHostPool::CreateOrAttach(
    const SharedHostPoolConfig& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  KVTIER_ASSIGN_OR_RETURN(const KvGeometry geometry, PoolGeometry(config));
  SharedHostPoolAttachOptions options;
  options.expected_geometry = geometry;
  options.expected_geometry->num_slots = config.geometry.num_slots;  // 0: any capacity
  options.mla = config.mla;
  options.register_with_cuda = config.register_with_cuda;
  Result<std::unique_ptr<SharedHostPool>> created = Create(config);
  if (created.ok() || created.status().code() != StatusCode::kFailedPrecondition) return created;
  return Attach(config.name, options);  // another process created it first
}

Status SharedHostPool::Destroy(std::string_view name) { return shm::UnlinkSegment(name); }

const std::string& SharedHostPool::name() const { return state_->name; }
const KvRegion& SharedHostPool::region() const { return state_->region; }
bool SharedHostPool::huge_pages() const { return state_->mapping.huge_pages(); }
bool SharedHostPool::cuda_registered() const { return !state_->registrations.empty(); }

std::vector<int64_t> SharedHostPool::PageSlots(std::span<const int64_t> pages) const {
  const int64_t page_size = geometry().page_size;
  std::vector<int64_t> slots;
  slots.reserve(pages.size() * static_cast<size_t>(page_size));
  for (int64_t p : pages) {
    for (int64_t o = 0; o < page_size; ++o) slots.push_back(p * page_size + o);
  }
  return slots;
}

Result<std::vector<PageReservation>> SharedHostPool::Reserve(
    uint64_t namespace_hash, std::span<const PageKey> keys,
    std::span<const std::optional<PageKey>> parents) {
  KVTIER_RETURN_IF_ERROR(state_->CheckCaller());
  return state_->index->Reserve(state_->slot, namespace_hash, keys, parents, /*pin_ready=*/false);
}

Result<std::vector<PageReservation>> SharedHostPool::ReserveOrPin(
    uint64_t namespace_hash, std::span<const PageKey> keys,
    std::span<const std::optional<PageKey>> parents) {
  KVTIER_RETURN_IF_ERROR(state_->CheckCaller());
  return state_->index->Reserve(state_->slot, namespace_hash, keys, parents, /*pin_ready=*/true);
}

Status SharedHostPool::Commit(std::span<const int64_t> pages) {
  KVTIER_RETURN_IF_ERROR(state_->CheckCaller());
  return state_->index->Commit(state_->slot, pages, /*pin=*/false);
}

Status SharedHostPool::CommitPinned(std::span<const int64_t> pages) {
  KVTIER_RETURN_IF_ERROR(state_->CheckCaller());
  return state_->index->Commit(state_->slot, pages, /*pin=*/true);
}

Status SharedHostPool::Abort(std::span<const int64_t> pages) {
  KVTIER_RETURN_IF_ERROR(state_->CheckCaller());
  return state_->index->Abort(state_->slot, pages);
}

Result<std::vector<int64_t>> SharedHostPool::PinPrefix(uint64_t namespace_hash,
                                                       std::span<const PageKey> keys) {
  KVTIER_RETURN_IF_ERROR(state_->CheckCaller());
  return state_->index->PinPrefix(state_->slot, namespace_hash, keys);
}

Status SharedHostPool::Unpin(std::span<const int64_t> pages) {
  KVTIER_RETURN_IF_ERROR(state_->CheckCaller());
  return state_->index->Unpin(state_->slot, pages);
}

Result<int64_t> SharedHostPool::Evict(int64_t max_pages) {
  KVTIER_RETURN_IF_ERROR(state_->CheckCaller());
  return state_->index->Evict(max_pages);
}

Result<int64_t> SharedHostPool::ReapDeadProcesses() {
  KVTIER_RETURN_IF_ERROR(state_->CheckCaller());
  return state_->index->ReapDeadProcesses();
}

Result<SharedHostPoolInfo> SharedHostPool::Inspect() {
  KVTIER_RETURN_IF_ERROR(state_->CheckCaller());
  SharedHostPoolInfo info{};
  KVTIER_RETURN_IF_ERROR(state_->index->Inspect(state_->slot, &info));
  info.name = state_->name;
  info.path = state_->mapping.path();
  info.geometry = geometry();
  info.mla = region().mla;
  info.page_bytes =
      region().num_buffers() * geometry().num_layers * geometry().page_size * geometry().slot_bytes;
  info.segment_bytes = state_->mapping.bytes();
  info.huge_pages = huge_pages();
  info.cuda_registered = cuda_registered();
  return info;
}

Status SharedHostPool::CheckInvariants() {
  KVTIER_RETURN_IF_ERROR(state_->CheckCaller());
  return state_->index->CheckInvariants();
}

}  // namespace kvtier
