// The decision ring's records: copies and messages round-trip, slot lists travel as runs, and bad
// bytes are Corruption, never a crash.
#include "tp/decision_ring.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <limits>
#include <random>

namespace kvtier::tp {
namespace {

TpCopy RandomCopy(std::mt19937_64& rng) {
  TpCopy c;
  c.src = rng() % 2 ? TpTier::kDevice : TpTier::kHost;
  c.dst = c.src == TpTier::kDevice ? TpTier::kHost : TpTier::kDevice;
  c.num_layers = 1 + static_cast<int64_t>(rng() % 80);
  c.src_layer = static_cast<int64_t>(rng() % 4);
  c.dst_layer = static_cast<int64_t>(rng() % 4);
  const int64_t pages = 1 + static_cast<int64_t>(rng() % 20);
  const int64_t page = int64_t{1} << (rng() % 6);
  for (auto* slots : {&c.src_slots, &c.dst_slots}) {
    for (int64_t p = 0; p < pages; ++p) {
      const int64_t start = static_cast<int64_t>(rng() % 1000) * page;
      for (int64_t i = 0; i < page; ++i) slots->push_back(start + i);
    }
  }
  return c;
}

TEST(DecisionRingTest, CopiesRoundTripThroughTheirRecords) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 500; ++iter) {
    const TpCopy c = RandomCopy(rng);
    ASSERT_TRUE(ValidateCopy(c).ok());
    const uint64_t seq = rng();
    const std::vector<std::byte> rec = EncodeCopy(c, seq);
    ASSERT_EQ(static_cast<int64_t>(rec.size()), EncodedCopyBytes(c));
    ASSERT_EQ(rec.size() % kRecordAlignment, 0u);
    RecordHeader h;
    std::memcpy(&h, rec.data(), sizeof(h));
    EXPECT_EQ(h.seq, seq);
    EXPECT_EQ(h.bytes, rec.size());
    Result<TpCopy> back = DecodeCopy(rec);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, c);
  }
}

TEST(DecisionRingTest, PageAlignedSlotListsAreOneRunPerRunOfPages) {
  std::vector<int64_t> slots;
  for (int64_t p : {3, 4, 5, 9, 2}) {
    for (int64_t i = 0; i < 64; ++i) slots.push_back(p * 64 + i);
  }
  const auto runs = SlotRuns(slots);
  ASSERT_EQ(runs.size(), 3u);  // pages 3-5, 9, 2
  EXPECT_EQ(runs[0], std::make_pair(int64_t{192}, int64_t{192}));
  EXPECT_EQ(runs[1], std::make_pair(int64_t{576}, int64_t{64}));
  EXPECT_EQ(runs[2], std::make_pair(int64_t{128}, int64_t{64}));
  TpCopy c{TpTier::kDevice, TpTier::kHost, 0, 0, 32, slots, slots};
  // 16 header + 32 body + 6 runs of 16 bytes, for 320 slots.
  EXPECT_EQ(EncodedCopyBytes(c), 144);
}

TEST(DecisionRingTest, BadCopiesAreRefusedNamingTheProblem) {
  TpCopy c{TpTier::kDevice, TpTier::kHost, 0, 0, 4, {1, 2}, {3}};
  EXPECT_NE(ValidateCopy(c).message().find("2 source slots but 1"), std::string::npos);
  c.dst_slots = {3, -4};
  EXPECT_NE(ValidateCopy(c).message().find("dst_slots[1] = -4"), std::string::npos);
  c.dst_slots = {3, 4};
  c.num_layers = 0;
  EXPECT_TRUE(ValidateCopy(c).IsInvalidArgument());
  c.num_layers = 1;
  c.src_slots.clear();
  c.dst_slots.clear();
  EXPECT_TRUE(ValidateCopy(c).IsInvalidArgument());
}

TEST(DecisionRingTest, CorruptRecordsAreCorruptionNeverACrash) {
  std::mt19937_64 rng(11);
  const TpCopy c = RandomCopy(rng);
  const std::vector<std::byte> good = EncodeCopy(c, 5);
  EXPECT_EQ(DecodeCopy(std::span(good).first(20)).status().code(), StatusCode::kCorruption);
  int corrupt = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<std::byte> bad = good;
    const size_t at = rng() % bad.size();
    bad[at] = static_cast<std::byte>(rng());
    Result<TpCopy> r = DecodeCopy(bad);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
      ++corrupt;
    } else {
      EXPECT_EQ(r->src_slots.size(), r->dst_slots.size());
      EXPECT_EQ(r->src_slots.size(), c.src_slots.size());
    }
  }
  EXPECT_GT(corrupt, 0);
  // A run that claims more slots than the record has.
  std::vector<std::byte> bad = good;
  const int64_t huge = int64_t{1} << 39;
  std::memcpy(bad.data() + sizeof(RecordHeader) + sizeof(CopyBody) + 8, &huge, sizeof(huge));
  EXPECT_EQ(DecodeCopy(bad).status().code(), StatusCode::kCorruption);
}

TEST(DecisionRingTest, MessagesRoundTrip) {
  for (size_t n : {0, 1, 7, 8, 100}) {
    std::vector<std::byte> msg(n);
    for (size_t i = 0; i < n; ++i) msg[i] = static_cast<std::byte>(i * 31 + 1);
    const std::vector<std::byte> rec = EncodeMessage(msg);
    ASSERT_EQ(rec.size() % kRecordAlignment, 0u);
    Result<std::span<const std::byte>> back = DecodeMessage(rec);
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(back->size(), n);
    if (n > 0) {  // no null for n = 0; braces: EXPECT_EQ is an if-else of its own
      EXPECT_EQ(std::memcmp(back->data(), msg.data(), n), 0);
    }
    std::vector<std::byte> bad = rec;
    const uint64_t too_long = rec.size();
    std::memcpy(bad.data() + sizeof(RecordHeader), &too_long, sizeof(too_long));
    EXPECT_EQ(DecodeMessage(bad).status().code(), StatusCode::kCorruption);
  }
}

// The leader writes records in place (WriteCopyRecord, WriteMessageRecord, straight into the
// ring over whatever bytes were there): the same bytes as the encoders', whatever was under them.
TEST(DecisionRingTest, RecordsWrittenInPlaceEqualTheEncodedOnes) {
  std::mt19937_64 rng(13);
  std::vector<SlotRun> src, dst;
  for (int iter = 0; iter < 300; ++iter) {
    const TpCopy c = RandomCopy(rng);
    const uint64_t seq = rng();
    SlotRunsOf(
        static_cast<int64_t>(c.src_slots.size()),
        [&](int64_t i) { return c.src_slots[static_cast<size_t>(i)]; }, &src);
    SlotRunsOf(
        static_cast<int64_t>(c.dst_slots.size()),
        [&](int64_t i) { return c.dst_slots[static_cast<size_t>(i)]; }, &dst);
    EXPECT_EQ(src, SlotRuns(c.src_slots));
    const CopyFields f{c.src,       c.dst,        c.src_layer,
                       c.dst_layer, c.num_layers, static_cast<int64_t>(c.src_slots.size())};
    ASSERT_TRUE(ValidateCopyRuns(f, src, dst).ok());
    const std::vector<std::byte> want = EncodeCopy(c, seq);
    const int64_t bytes =
        CopyRecordBytes(static_cast<int64_t>(src.size()), static_cast<int64_t>(dst.size()));
    ASSERT_EQ(bytes, static_cast<int64_t>(want.size()));
    std::vector<std::byte> ring(static_cast<size_t>(bytes), static_cast<std::byte>(rng()));
    WriteCopyRecord(f, src, dst, seq, ring.data());
    EXPECT_EQ(ring, want);
    Result<TpCopy> back = DecodeCopy(ring);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, c);
  }
  // A message from parts: the concatenation's record.
  std::vector<std::byte> a(13), b(40);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::byte>(rng());
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(rng());
  std::vector<std::byte> whole = a;
  whole.insert(whole.end(), b.begin(), b.end());
  std::vector<std::byte> want = EncodeMessage(whole, RecordType::kStorage);
  const uint64_t seq = 77;
  std::memcpy(want.data() + offsetof(RecordHeader, seq), &seq, sizeof(seq));
  std::vector<std::byte> ring(static_cast<size_t>(MessageRecordBytes(53)), std::byte{0xab});
  const std::span<const std::byte> parts[2] = {a, b};
  WriteMessageRecord(parts, RecordType::kStorage, seq, ring.data());
  EXPECT_EQ(ring, want);
}

TEST(DecisionRingTest, BadRunsAreRefusedNamingTheProblem) {
  const CopyFields f{TpTier::kDevice, TpTier::kHost, 0, 0, 4, 3};
  const std::vector<SlotRun> three = {{10, 2}, {20, 1}};
  EXPECT_TRUE(ValidateCopyRuns(f, three, three).ok());
  const std::vector<SlotRun> two = {{10, 2}};
  EXPECT_NE(ValidateCopyRuns(f, three, two).message().find("dst_slots has 2 slots, the copy 3"),
            std::string::npos);
  const std::vector<SlotRun> negative = {{-1, 3}};
  EXPECT_NE(ValidateCopyRuns(f, negative, three).message().find("src_slots has slots out of range"),
            std::string::npos);
  const std::vector<SlotRun> huge = {{int64_t{1} << 40, 3}};
  EXPECT_TRUE(ValidateCopyRuns(f, three, huge).IsInvalidArgument());
  CopyFields no_layers = f;
  no_layers.num_layers = 0;
  EXPECT_TRUE(ValidateCopyRuns(no_layers, three, three).IsInvalidArgument());
  CopyFields empty = f;
  empty.num_slots = 0;
  EXPECT_TRUE(ValidateCopyRuns(empty, {}, {}).IsInvalidArgument());
  // Runs of slots that would overflow int64 are one run each, never a wrapped-around one.
  std::vector<SlotRun> runs;
  const int64_t top = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> slots = {top, std::numeric_limits<int64_t>::min(), 0};
  SlotRunsOf(
      3, [&](int64_t i) { return slots[static_cast<size_t>(i)]; }, &runs);
  EXPECT_EQ(runs.size(), 3u);
}

}  // namespace
}  // namespace kvtier::tp
