// ReuseSketch: a count-min sketch with TinyLFU's aging — never below the true count (until it
// saturates or ages), conservative updates, halving every sample, deterministic.
#include "cache/reuse_sketch.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "kvtier/page_key.h"
#include "kvtier/token.h"

namespace kvtier {
namespace {

// The keys of `n` one-token pages: distinct SHA-256 chain keys, as the cache's.
std::vector<PageKey> Keys(int n, Token base = 1) {
  std::vector<Token> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = base + static_cast<Token>(i);
  auto keys = ComputePageKeys(tokens, 1, std::nullopt);
  EXPECT_TRUE(keys.ok());
  return *keys;
}

TEST(ReuseSketchTest, WidthIsAPowerOfTwoOfAtLeast16) {
  EXPECT_EQ(ReuseSketch(1).width(), 16);
  EXPECT_EQ(ReuseSketch(16).width(), 16);
  EXPECT_EQ(ReuseSketch(17).width(), 32);
  EXPECT_EQ(ReuseSketch(1000).width(), 1024);
  EXPECT_EQ(ReuseSketch(1000).sample(), 10240);
}

// Against a model (exact counts) over random records, below the first halving: every estimate is
// at least the true count (capped at kMaxCount), and in a sketch much wider than the key set most
// are exact.
TEST(ReuseSketchTest, NeverUnderestimatesAndIsMostlyExactWhenWide) {
  ReuseSketch sketch(4096);
  const std::vector<PageKey> keys = Keys(200);
  std::map<size_t, int64_t> truth;
  std::mt19937 rng(3);
  std::uniform_int_distribution<size_t> pick(0, keys.size() - 1);
  for (int i = 0; i < 3000; ++i) {  // < sample (40960): no halving
    const size_t k = pick(rng);
    sketch.Record(keys[k]);
    ++truth[k];
  }
  ASSERT_EQ(sketch.halvings(), 0);
  int exact = 0;
  for (size_t k = 0; k < keys.size(); ++k) {
    const int64_t t = std::min<int64_t>(truth[k], ReuseSketch::kMaxCount);
    const int64_t e = sketch.Estimate(keys[k]);
    EXPECT_GE(e, t) << "key " << k;
    EXPECT_LE(e, ReuseSketch::kMaxCount);
    exact += e == t;
  }
  EXPECT_GE(exact, 190);
}

TEST(ReuseSketchTest, UnseenKeysEstimateZeroAndCountsSaturate) {
  ReuseSketch sketch(1024);
  const std::vector<PageKey> keys = Keys(2);
  EXPECT_EQ(sketch.Estimate(keys[0]), 0);
  for (int i = 0; i < 3; ++i) sketch.Record(keys[0]);
  EXPECT_EQ(sketch.Estimate(keys[0]), 3);
  EXPECT_EQ(sketch.Estimate(keys[1]), 0);
  for (int i = 0; i < 40; ++i) sketch.Record(keys[0]);
  EXPECT_EQ(sketch.Estimate(keys[0]), ReuseSketch::kMaxCount);
}

// Every `sample` records every counter is halved: a key frequent long ago fades while the new
// working set is counted.
TEST(ReuseSketchTest, AgingHalvesEveryCounterEverySample) {
  ReuseSketch sketch(16);  // sample 160
  const std::vector<PageKey> old_key = Keys(1, 100000);
  for (int i = 0; i < 12; ++i) sketch.Record(old_key[0]);
  EXPECT_EQ(sketch.Estimate(old_key[0]), 12);
  // 148 more records (of one other key) reach the sample: one halving.
  const std::vector<PageKey> other = Keys(1, 200000);
  for (int i = 0; i < 148; ++i) sketch.Record(other[0]);
  EXPECT_EQ(sketch.halvings(), 1);
  EXPECT_EQ(sketch.records(), 80);
  EXPECT_LE(sketch.Estimate(old_key[0]), 12 / 2 + ReuseSketch::kMaxCount / 2);  // collisions
  EXPECT_GE(sketch.Estimate(old_key[0]), 6);
  // Another sample later it has faded below a recent key's count.
  for (int i = 0; i < 80; ++i) sketch.Record(other[0]);
  EXPECT_EQ(sketch.halvings(), 2);
  EXPECT_LT(sketch.Estimate(old_key[0]), 12);
}

TEST(ReuseSketchTest, SameRecordsSameEstimates) {
  const std::vector<PageKey> keys = Keys(300);
  ReuseSketch a(64), b(64);
  for (int round = 0; round < 5; ++round) {
    for (size_t i = 0; i < keys.size(); i += 1 + static_cast<size_t>(round)) {
      a.Record(keys[i]);
      b.Record(keys[i]);
    }
  }
  for (const PageKey& k : keys) EXPECT_EQ(a.Estimate(k), b.Estimate(k));
}

}  // namespace
}  // namespace kvtier
