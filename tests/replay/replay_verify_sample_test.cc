// --verify sample's choice of matched pages (PageChecked), shared by the CPU and GPU engines: one
// page in eight from the first, and always the last.
#include <gtest/gtest.h>

#include <vector>

#include "replay_engine.h"

namespace kvtier::tools {
namespace {

std::vector<int64_t> Checked(int64_t pages, bool sample) {
  std::vector<int64_t> out;
  for (int64_t p = 0; p < pages; ++p) {
    if (PageChecked(p, pages, sample)) out.push_back(p);
  }
  return out;
}

TEST(ReplayVerifySampleTest, SampleChecksOneInEightAndTheLast) {
  EXPECT_EQ(Checked(17, true), (std::vector<int64_t>{0, 8, 16}));
  EXPECT_EQ(Checked(10, true), (std::vector<int64_t>{0, 8, 9}));
  EXPECT_EQ(Checked(1, true), (std::vector<int64_t>{0}));
  EXPECT_EQ(Checked(0, true), (std::vector<int64_t>{}));
}

TEST(ReplayVerifySampleTest, FullChecksEveryPage) {
  EXPECT_EQ(Checked(4, false), (std::vector<int64_t>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace kvtier::tools
