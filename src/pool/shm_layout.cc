// Internal: where the sections of a shared host pool segment go (see shm_layout.h).
//
// Thread safety: a pure function.
#include "pool/shm_layout.h"

#include <fmt/format.h>

namespace kvtier::shm {

namespace {

// Rounds `value` up to a multiple of `alignment` (a power of two), or fails on overflow.
bool AlignUp(uint64_t value, uint64_t alignment, uint64_t* out) {
  if (value > UINT64_MAX - (alignment - 1)) return false;
  *out = (value + alignment - 1) & ~(alignment - 1);
  return true;
}

}  // namespace

Result<SegmentLayout> ComputeSegmentLayout(const KvGeometry& geometry, bool mla,
                                           int max_processes) {
  SegmentLayout out;
  out.num_buffers = mla ? 1 : 2;
  out.max_processes = max_processes;
  out.num_pages = geometry.num_slots / geometry.page_size;
  const auto overflow = [&](const char* what) {
    return Status::InvalidArgument(fmt::format(
        "shared host pool: {} overflows for {} pages of {} layers x {} slots x {} bytes", what,
        out.num_pages, geometry.num_layers, geometry.page_size, geometry.slot_bytes));
  };
  if (out.num_pages >= INT32_MAX) return overflow("the page count");
  if (__builtin_mul_overflow(geometry.num_layers, geometry.num_slots, &out.buffer_bytes) ||
      __builtin_mul_overflow(out.buffer_bytes, geometry.slot_bytes, &out.buffer_bytes)) {
    return overflow("the buffer size");
  }
  uint64_t buckets = 16;
  while (buckets < static_cast<uint64_t>(out.num_pages)) buckets <<= 1;
  out.num_buckets = buckets;

  const uint64_t pages = static_cast<uint64_t>(out.num_pages);
  uint64_t offset = 0;
  bool ok = AlignUp(sizeof(SegmentHeader), 64, &out.process_offset);
  ok = ok &&
       AlignUp(out.process_offset + sizeof(ProcessRecord) * max_processes, 64, &out.page_offset);
  ok = ok && AlignUp(out.page_offset + sizeof(PageRecord) * pages, 64, &out.refs_offset);
  ok = ok &&
       AlignUp(out.refs_offset + sizeof(uint16_t) * pages * max_processes, 64, &out.bucket_offset);
  ok = ok && AlignUp(out.bucket_offset + sizeof(int32_t) * buckets, 64, &out.child_bucket_offset);
  ok = ok && AlignUp(out.child_bucket_offset + sizeof(int32_t) * buckets, kDataAlignment,
                     &out.data_offset);
  uint64_t stride = 0;
  ok = ok && AlignUp(static_cast<uint64_t>(out.buffer_bytes), kDataAlignment, &stride);
  if (!ok) return overflow("the segment size");
  out.buffer_stride = static_cast<int64_t>(stride);
  if (__builtin_mul_overflow(stride, static_cast<uint64_t>(out.num_buffers - 1), &offset) ||
      __builtin_add_overflow(offset, out.data_offset, &offset) ||
      __builtin_add_overflow(offset, static_cast<uint64_t>(out.buffer_bytes), &offset) ||
      !AlignUp(offset, 4096, &out.segment_bytes) || out.segment_bytes > INT64_MAX) {
    return overflow("the segment size");
  }
  return out;
}

}  // namespace kvtier::shm
