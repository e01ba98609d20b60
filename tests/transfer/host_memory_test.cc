// kvtier/host_memory.h: this process's mappings, read from /proc/self/maps — how far a run of
// mappings reaches from an address, writable or not, and the check a cache makes of its device
// region (issue 36: read-only memory was accepted and written into).
#include "kvtier/host_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>

namespace kvtier {
namespace {

TEST(HostMemoryTest, RunsOfMappingsWritableOrNot) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  // Five pages: a PROT_NONE guard on each side of two writable pages and one read-only page.
  auto* base = static_cast<std::byte*>(::mmap(nullptr, static_cast<size_t>(5 * page), PROT_NONE,
                                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(static_cast<void*>(base), MAP_FAILED);
  ASSERT_EQ(::mprotect(base + page, static_cast<size_t>(2 * page), PROT_READ | PROT_WRITE), 0);
  ASSERT_EQ(::mprotect(base + 3 * page, static_cast<size_t>(page), PROT_READ), 0);

  EXPECT_EQ(MappedBytesFrom(base, false), -1);  // PROT_NONE
  EXPECT_EQ(MappedBytesFrom(base + page + 10, true), 2 * page - 10);
  EXPECT_EQ(MappedBytesFrom(base + page + 10, false), 3 * page - 10);
  EXPECT_EQ(MappedBytesFrom(base + 3 * page, true), -1);
  EXPECT_EQ(MappedBytesFrom(base + 3 * page, false), page);

  EXPECT_TRUE(CheckHostWritable(base + page, 2 * page, "ok").ok());
  const Status ro = CheckHostWritable(base + 3 * page, page, "ro");
  EXPECT_TRUE(ro.IsInvalidArgument());
  EXPECT_NE(ro.message().find("ro ("), std::string::npos) << ro.ToString();
  EXPECT_NE(ro.message().find("read-only"), std::string::npos) << ro.ToString();
  const Status part = CheckHostWritable(base + page, 3 * page, "part");
  EXPECT_NE(part.message().find("first " + std::to_string(2 * page) + " bytes"), std::string::npos)
      << part.ToString();
  const Status none = CheckHostWritable(base, page, "none");
  EXPECT_NE(none.message().find("not mapped writable"), std::string::npos) << none.ToString();
  ::munmap(base, static_cast<size_t>(5 * page));
}

}  // namespace
}  // namespace kvtier
