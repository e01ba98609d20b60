// Internal: the shared-memory object behind a shared host pool — naming, creating (exclusive,
// 0600 or 0660 + group, hugetlbfs when asked and available), opening, mapping MAP_SHARED and
// removing it. Knows nothing of what the bytes mean (shm_layout.h, shm_page_index.h).
//
// Thread safety: a SharedMapping is immutable after it is made; the free functions are safe to
// call from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/status.h"

namespace kvtier::shm {

// InvalidArgument unless 1-200 of [A-Za-z0-9._-] not starting with '.'.
Status ValidateSegmentName(std::string_view name);

// A MAP_SHARED mapping of a whole segment; unmapped on destruction. Move-only.
class SharedMapping {
 public:
  SharedMapping() = default;
  SharedMapping(SharedMapping&& other) noexcept;
  SharedMapping& operator=(SharedMapping&& other) noexcept;
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  ~SharedMapping();

  std::byte* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }  // the file behind it
  bool huge_pages() const { return huge_pages_; }

 private:
  friend struct SegmentFiles;
  friend Status UnlinkSegmentIfSame(const SharedMapping& mapping);
  std::byte* data_ = nullptr;
  int64_t bytes_ = 0;
  std::string path_;
  bool huge_pages_ = false;
  uint64_t device_ = 0, inode_ = 0;  // the file's identity (fstat when mapped)
};

struct CreateSegmentOptions {
  int64_t bytes = 0;
  bool huge_pages = false;  // try hugetlbfs; fall back to /dev/shm with a warning
  int64_t group_id = -1;    // -1: mode 0600; else mode 0660 and this group
};

// Creates the segment exclusively, sizes it (zero-filled) and maps it. FailedPrecondition when it
// exists already (under /dev/shm or a hugetlbfs mount); OutOfMemory when it cannot be sized or
// mapped; the name is removed again on any failure.
Result<SharedMapping> CreateSegment(std::string_view name, const CreateSegmentOptions& options);
// Opens and maps an existing segment whole. NotFound when there is none.
Result<SharedMapping> OpenSegment(std::string_view name);
// Removes the segment's name wherever it is. NotFound when there is none.
Status UnlinkSegment(std::string_view name);
// Removes the name of the object `mapping` maps (its path()) only while that name still refers
// to that very object (same device and inode), not to one a successor made under the same name
// since. NotFound when the name is gone or refers to another object. The mapping (and every
// other process's) stays valid: the object lives until its last mapping goes. Not atomic with a
// successor's replacing the name between the check and the unlink (shm names have no
// compare-and-unlink); callers replace a name only after its owner died or closed it.
Status UnlinkSegmentIfSame(const SharedMapping& mapping);

}  // namespace kvtier::shm
