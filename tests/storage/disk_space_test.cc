// The file store's free-space helpers that need no file system of their own: the log's byte
// counts (issue 36 probe 10: a 32 MiB floor was logged as "0.0 GiB") and a dense file's
// allocation. The floor and the watcher are file_disk_space_test's (a small tmpfs).
#include "storage/file/disk_space.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace kvtier::storage {
namespace {

TEST(DiskSpaceTest, FormatBytesUsesTheLargestUnitTheValueReaches) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(int64_t{32} << 20), "32.0 MiB");  // not "0.0 GiB"
  EXPECT_EQ(FormatBytes((int64_t{3} << 30) / 2), "1.5 GiB");
  EXPECT_EQ(FormatBytes(int64_t{5} << 40), "5.0 TiB");
  EXPECT_EQ(FormatBytes(int64_t{1} << 60), "1024.0 PiB");  // no unit beyond PiB
  EXPECT_EQ(FormatBytes(-1), "-1 B");                      // never a negative in a larger unit
}

TEST(DiskSpaceTest, AllocatedBytesRoundsUpToWholeBlocks) {
  EXPECT_EQ(AllocatedBytes(0), 0);
  EXPECT_EQ(AllocatedBytes(-5), 0);
  EXPECT_EQ(AllocatedBytes(1), 4096);
  EXPECT_EQ(AllocatedBytes(4096), 4096);
  EXPECT_EQ(AllocatedBytes(4097), 8192);
}

}  // namespace
}  // namespace kvtier::storage
