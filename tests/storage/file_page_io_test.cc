// The file store's page I/O on its own (file_page_io.h): a page written by WritePage reads back
// byte for byte through ReadPage (thread path and, where liburing is present, the io_uring batch),
// in one segment and in two of odd sizes, large enough for several chunks; each fault has its
// outcome: a flipped payload byte or nonzero padding kCorrupt, a header of another namespace
// kWrongNamespace, a file grown or cut since it was written kCorrupt.
#include "storage/file/file_page_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "storage/file/file_io.h"

namespace kvtier::storage {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kNamespace = 0x1234'5678'9abc'def0;
// Several 256 KiB chunks and a partial last one; split into two segments of odd sizes below.
constexpr int64_t kPageBytes = 3 * (int64_t{256} << 10) + 12'345;
constexpr int64_t kFileBytes = static_cast<int64_t>(kFilePayloadOffset) + kPageBytes;

PageKey KeyOf(uint8_t i) {
  PageKey key;
  for (size_t b = 0; b < key.bytes.size(); ++b) key.bytes[b] = static_cast<uint8_t>(i * 31 + b);
  return key;
}

class FilePageIoTest : public ::testing::TestWithParam<bool> {  // two segments or one
 protected:
  void SetUp() override {
    std::string tmpl = "/tmp/kvtier_file_page_io_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::mt19937 rng(7);
    page_.resize(kPageBytes);
    for (auto& b : page_) b = static_cast<std::byte>(rng());
  }
  void TearDown() override { fs::remove_all(dir_); }

  PageBuffer Buffer(std::vector<std::byte>& bytes) const {
    if (!GetParam()) return PageBuffer::Of(bytes);
    const size_t split = 100'003;
    return PageBuffer::Of(std::span(bytes).first(split), std::span(bytes).subspan(split));
  }
  std::string Path(const PageKey& key) const { return dir_ + "/" + key.Hex(); }

  // Writes the page under `key` (naming `parent`) into a new file.
  void Write(const PageFileIo& io, const PageKey& key,
             const std::optional<PageKey>& parent = std::nullopt) {
    const int fd = ::open(Path(key).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    EXPECT_TRUE(io.WritePage(fd, key, Buffer(page_), parent)) << std::strerror(errno);
    ::close(fd);
  }

  // The first `n` bytes of the page file of `key`.
  std::vector<std::byte> Head(const PageKey& key, size_t n) {
    std::vector<std::byte> bytes(n);
    const int fd = ::open(Path(key).c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::pread(fd, bytes.data(), n, 0), static_cast<ssize_t>(n));
    ::close(fd);
    return bytes;
  }

  // Reads the page under `key` into a poisoned buffer on the thread path: its outcome, and
  // whether the buffer then holds the page.
  PageStatus Read(const PageFileIo& io, const PageKey& key, bool* same = nullptr) {
    std::vector<std::byte> out(kPageBytes, std::byte{0xCD});
    const PageBuffer buffer = Buffer(out);
    PageRead read;
    read.fd = ::open(Path(key).c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(read.fd, 0) << std::strerror(errno);
    io.PrepareRead(buffer, read);
    const PageStatus st = io.ReadPage(key, buffer, read);
    if (same != nullptr) *same = out == page_;
    return st;
  }

  // Overwrites `bytes` at `offset` of the page file of `key`.
  void Patch(const PageKey& key, off_t offset, std::span<const std::byte> bytes) {
    const int fd = ::open(Path(key).c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(WriteFull(fd, bytes.data(), bytes.size(), offset));
    ::close(fd);
  }

  std::string dir_;
  std::vector<std::byte> page_;
};

TEST_P(FilePageIoTest, WrittenPagesReadBackByteForByte) {
  const PageFileIo io(kNamespace, kFileBytes, /*direct=*/false);
  Write(io, KeyOf(1));
  EXPECT_EQ(fs::file_size(Path(KeyOf(1))), static_cast<uintmax_t>(kFileBytes));
  bool same = false;
  EXPECT_EQ(Read(io, KeyOf(1), &same), PageStatus::kOk);
  EXPECT_TRUE(same);
}

// The header names the page's parent (format version 2); a file of version 1, as an older kvtier
// wrote it (72-byte header, zeros, payload at 4 KiB), still reads byte for byte, and its padding
// is checked from byte 72.
TEST_P(FilePageIoTest, HeaderNamesTheParentAndVersionOneFilesStillRead) {
  const PageFileIo io(kNamespace, kFileBytes, /*direct=*/false);
  Write(io, KeyOf(1), KeyOf(2));
  Write(io, KeyOf(3));
  for (const auto& [key, parent] : {std::pair{KeyOf(1), std::optional<PageKey>(KeyOf(2))},
                                    std::pair{KeyOf(3), std::optional<PageKey>()}}) {
    PageHeader header;
    ASSERT_EQ(ParsePageHeader(Head(key, kFilePayloadOffset), kNamespace, key, kPageBytes, &header),
              PageStatus::kOk);
    EXPECT_EQ(header.version, kPageFormatV2);
    EXPECT_EQ(header.parent, parent);
    bool same = false;
    EXPECT_EQ(Read(io, key, &same), PageStatus::kOk);
    EXPECT_TRUE(same);
  }

  // Version 1: the header the file held before version 2, moved into place over a written page.
  for (uint8_t i : {4, 5}) {
    Write(io, KeyOf(i));
    PageHeader v1 = NewPageHeader(kNamespace, KeyOf(i), kPageBytes);
    ASSERT_TRUE(PayloadChecksum(v1.checksum_kind, Buffer(page_), &v1.payload_checksum));
    std::vector<std::byte> block(kFilePayloadOffset);
    EncodePageHeader(v1, block);
    Patch(KeyOf(i), 0, block);
  }
  ASSERT_EQ(std::to_integer<int>(Head(KeyOf(4), 8)[4]), 1);
  bool same = false;
  EXPECT_EQ(Read(io, KeyOf(4), &same), PageStatus::kOk);
  EXPECT_TRUE(same);
  const std::byte one[1] = {std::byte{1}};
  Patch(KeyOf(5), kPageHeaderBytes + 5, one);  // in version 2's parent field: padding here
  EXPECT_EQ(Read(io, KeyOf(5)), PageStatus::kCorrupt);
}

TEST_P(FilePageIoTest, EachFaultHasItsOutcome) {
  const PageFileIo io(kNamespace, kFileBytes, /*direct=*/false);
  const std::byte one[1] = {std::byte{1}};
  for (uint8_t i = 0; i < 4; ++i) Write(io, KeyOf(i));
  // A payload byte in the last chunk flipped.
  std::byte flipped[1] = {page_[kPageBytes - 7] ^ std::byte{0x40}};
  Patch(KeyOf(0), kFileBytes - 7, flipped);
  EXPECT_EQ(Read(io, KeyOf(0)), PageStatus::kCorrupt);
  // The padding between the header and the payload is not zero.
  Patch(KeyOf(1), kPageHeaderV2Bytes + 5, one);
  EXPECT_EQ(Read(io, KeyOf(1)), PageStatus::kCorrupt);
  // The file grew after it was written (one byte past the page).
  Patch(KeyOf(2), kFileBytes, one);
  EXPECT_EQ(Read(io, KeyOf(2)), PageStatus::kCorrupt);
  // Another namespace reads the page as not its own; another key as corrupt.
  const PageFileIo other(kNamespace + 1, kFileBytes, /*direct=*/false);
  EXPECT_EQ(Read(other, KeyOf(3)), PageStatus::kWrongNamespace);
  fs::copy_file(Path(KeyOf(3)), Path(KeyOf(9)));
  EXPECT_EQ(Read(io, KeyOf(9)), PageStatus::kCorrupt);
  // Cut short.
  fs::resize_file(Path(KeyOf(3)), kFileBytes - 1);
  EXPECT_EQ(Read(io, KeyOf(3)), PageStatus::kCorrupt);
}

#if KVTIER_HAVE_URING
TEST_P(FilePageIoTest, UringBatchChecksEachPageAndReportsHits) {
  io_uring* ring = PageFileIo::ThreadRing();
  if (ring == nullptr) GTEST_SKIP() << "io_uring is not available here";
  const PageFileIo io(kNamespace, kFileBytes, /*direct=*/false);
  constexpr int kPages = 5;
  std::vector<PageKey> keys;
  for (uint8_t i = 0; i < kPages; ++i) {
    keys.push_back(KeyOf(i));
    Write(io, keys.back());
  }
  const std::byte one[1] = {std::byte{1}};
  Patch(keys[2], kPageHeaderV2Bytes + 1, one);  // nonzero padding
  std::vector<std::vector<std::byte>> out(kPages,
                                          std::vector<std::byte>(kPageBytes, std::byte{0xCD}));
  std::vector<PageBuffer> buffers;
  std::vector<PageRead> reads(kPages);
  std::vector<PageStatus> status(kPages, PageStatus::kOk);
  for (int i = 0; i < kPages; ++i) {
    buffers.push_back(Buffer(out[i]));
    reads[i].fd = ::open(Path(keys[i]).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(reads[i].fd, 0);
    io.PrepareRead(buffers[i], reads[i]);
  }
  status[4] = PageStatus::kAbsent;  // not opened by the caller: left alone
  std::vector<size_t> hits;
  io.ReadBatchWithUring(*ring, keys, buffers, reads, status,
                        std::chrono::steady_clock::now() + std::chrono::seconds(30),
                        [&](size_t i) { hits.push_back(i); });
  EXPECT_EQ(status, (std::vector<PageStatus>{PageStatus::kOk, PageStatus::kOk, PageStatus::kCorrupt,
                                             PageStatus::kOk, PageStatus::kAbsent}));
  std::sort(hits.begin(), hits.end());
  EXPECT_EQ(hits, (std::vector<size_t>{0, 1, 3}));
  for (size_t i : hits) EXPECT_TRUE(out[i] == page_) << i;
}
#endif

// Pages around the thread path's chunk boundaries (a first chunk of 252 KiB, then 256 KiB ones,
// a last remainder of at most 64 KiB read with the chunk before it): each reads back byte for
// byte in one segment and in two, and a flipped last byte or one byte more in the file is
// kCorrupt.
TEST(FilePageIoChunksTest, PagesAroundChunkBoundariesReadAndCheckEveryByte) {
  std::string tmpl = "/tmp/kvtier_file_page_io_chunks_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  constexpr int64_t kKiB = 1024;
  std::mt19937 rng(11);
  for (const int64_t bytes : {252 * kKiB, 252 * kKiB + 1, 316 * kKiB, 316 * kKiB + 1, 508 * kKiB,
                              512 * kKiB, 572 * kKiB + 1, 2048 * kKiB}) {
    for (const bool two : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << bytes << " bytes, " << (two ? "two" : "one") << " segments");
      std::vector<std::byte> page(static_cast<size_t>(bytes));
      for (auto& b : page) b = static_cast<std::byte>(rng());
      auto buffer_of = [&](std::vector<std::byte>& v) {
        const size_t split = static_cast<size_t>(bytes) / 3 + 1;
        return two ? PageBuffer::Of(std::span(v).first(split), std::span(v).subspan(split))
                   : PageBuffer::Of(v);
      };
      const int64_t file_bytes = static_cast<int64_t>(kFilePayloadOffset) + bytes;
      const PageFileIo io(kNamespace, file_bytes, /*direct=*/false);
      const PageKey key = KeyOf(static_cast<uint8_t>(bytes % 251));
      const std::string path = dir + "/" + key.Hex();
      fs::remove(path);
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      ASSERT_GE(fd, 0) << std::strerror(errno);
      ASSERT_TRUE(io.WritePage(fd, key, buffer_of(page))) << std::strerror(errno);
      ::close(fd);
      auto read = [&](bool* same) {
        std::vector<std::byte> out(page.size(), std::byte{0xCD});
        const PageBuffer buffer = buffer_of(out);
        PageRead r;
        r.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        EXPECT_GE(r.fd, 0) << std::strerror(errno);
        io.PrepareRead(buffer, r);
        const PageStatus st = io.ReadPage(key, buffer, r);
        *same = out == page;
        return st;
      };
      bool same = false;
      EXPECT_EQ(read(&same), PageStatus::kOk);
      EXPECT_TRUE(same);
      fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      const std::byte flipped[1] = {page.back() ^ std::byte{0x01}};
      ASSERT_TRUE(WriteFull(fd, flipped, 1, file_bytes - 1));
      EXPECT_EQ(read(&same), PageStatus::kCorrupt);
      ASSERT_TRUE(WriteFull(fd, &page.back(), 1, file_bytes - 1));  // restored
      EXPECT_EQ(read(&same), PageStatus::kOk);
      ASSERT_TRUE(WriteFull(fd, flipped, 1, file_bytes));  // one byte more
      EXPECT_EQ(read(&same), PageStatus::kCorrupt);
      ::close(fd);
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Segments, FilePageIoTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "two" : "one"; });

}  // namespace
}  // namespace kvtier::storage
