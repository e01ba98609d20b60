// libFuzzer target over a shared host pool segment's index as `kvtier shm inspect --check` reads
// it: SharedHostPool::Attach, Inspect and CheckInvariants on a segment whose bytes were corrupted.
//
// Once per process a small segment is created (kvtier-fuzz-<pid>, removed at exit) and a few
// pages are committed and pinned, so the index has READY pages, hash chains, parent links and
// child chains, an LRU list and references; its bytes up to the page data are the pristine image.
// Per input the image is written back, then the input is applied to it: a 4-byte offset into the
// image, then bytes XORed in from there (wrapping). The index lock's own bytes are left alone (a
// garbage pthread mutex is outside what any reader can check). Properties checked:
//   1. no crash, out-of-bounds access, leak or undefined behaviour (ASan/UBSan/LSan), no hang:
//      a corrupted segment is refused (Attach fails), reported (CheckInvariants fails) or
//      repaired, never read out of bounds;
//   2. an unmodified image attaches and passes CheckInvariants.
// Any violation aborts (a finding). Run: build-fuzz/tests/fuzz/kvtier_fuzz_shm_index
// -max_total_time=30
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/page_key.h"
#include "kvtier/shared_host_pool.h"
#include "pool/shm_layout.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

struct Segment {
  std::string name;
  std::string path;
  std::vector<std::byte> image;  // [0, data_offset) after setup
  size_t lock_begin = 0, lock_end = 0;

  Segment() {
    name = "kvtier-fuzz-" + std::to_string(::getpid());
    kvtier::SharedHostPoolConfig config;
    config.name = name;
    config.geometry.layout = kvtier::KvLayout::kPageFirst;
    config.geometry.num_layers = 1;
    config.geometry.slot_bytes = 16;
    config.geometry.page_size = 1;
    config.geometry.head_num = 1;
    config.geometry.num_slots = 16;
    config.max_processes = 4;
    config.register_with_cuda = false;
    auto pool = kvtier::SharedHostPool::Create(config);
    Check(pool.ok());
    // Some READY pages (one of them pinned by this process, which then detaches: its
    // references are dropped), so the image has chains, an LRU list and counts.
    // Pages 1-4 form a chain (each names the one before as parent: child chains and counts),
    // pages 5 and 6 name none.
    std::vector<kvtier::PageKey> keys(6);
    std::vector<std::optional<kvtier::PageKey>> parents(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) keys[i].bytes[0] = static_cast<uint8_t>(i + 1);
    for (size_t i = 1; i < 4; ++i) parents[i] = keys[i - 1];
    auto reserved = (*pool)->Reserve(7, keys, parents);
    Check(reserved.ok());
    std::vector<int64_t> pages;
    for (const auto& r : *reserved) pages.push_back(r.page);
    Check((*pool)->Commit(pages).ok());
    auto info = (*pool)->Inspect();
    Check(info.ok());
    path = info->path;
    pool->reset();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    Check(fd >= 0);
    kvtier::shm::SegmentHeader header;
    Check(::pread(fd, &header, sizeof(header), 0) == static_cast<ssize_t>(sizeof(header)));
    image.resize(header.data_offset);
    Check(::pread(fd, image.data(), image.size(), 0) == static_cast<ssize_t>(image.size()));
    ::close(fd);
    lock_begin = offsetof(kvtier::shm::SegmentHeader, lock);
    lock_end = lock_begin + sizeof(pthread_mutex_t);
    std::atexit([] { (void)kvtier::SharedHostPool::Destroy(Get().name); });
  }
  static Segment& Get() {
    static Segment* segment = new Segment;  // never destroyed: the atexit handler reads its name
    return *segment;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Segment& s = Segment::Get();
  std::vector<std::byte> bytes = s.image;
  if (size >= 4) {
    uint32_t offset = 0;
    std::memcpy(&offset, data, 4);
    size_t at = offset % bytes.size();
    for (size_t i = 4; i < size; ++i, at = (at + 1) % bytes.size()) {
      if (at >= s.lock_begin && at < s.lock_end) continue;
      bytes[at] ^= static_cast<std::byte>(data[i]);
    }
  }
  const int fd = ::open(s.path.c_str(), O_WRONLY | O_CLOEXEC);
  Check(fd >= 0);
  Check(::pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);

  kvtier::SharedHostPoolAttachOptions options;
  options.register_with_cuda = false;
  auto pool = kvtier::SharedHostPool::Attach(s.name, options);
  if (!pool.ok()) {
    Check(size >= 5);  // only a corrupted image may be refused
    return 0;
  }
  auto info = (*pool)->Inspect();
  const kvtier::Status invariants = (*pool)->CheckInvariants();
  if (size < 5) Check(info.ok() && invariants.ok());
  return 0;
}
