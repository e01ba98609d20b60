// Whole reads and writes over several iovecs (consumed as they go, short at the end of a file),
// and OpenBeneath with openat2 and with the openat fallback: plain paths open, a symlink on any
// component (the last, an intermediate directory) is ELOOP or ENOTDIR and nothing is created
// through it, "." / ".." / "a/b" components are EINVAL; PublishFile swaps an older file out.
#include "storage/file/file_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <vector>

#include "storage/file_test_caps.h"

namespace kvtier::storage {
namespace {

namespace fs = std::filesystem;

class FileIoTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ForceOpenatFallbackForTesting(GetParam());
    std::string tmpl = "/tmp/kvtier_file_io_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    root_ = Fd(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY));
    ASSERT_TRUE(root_.ok());
  }
  void TearDown() override {
    ForceOpenatFallbackForTesting(false);
    fs::remove_all(dir_);
  }
  std::string dir_;
  Fd root_;
};

TEST_P(FileIoTest, WholeWritesAndReadsAcrossIovecs) {
  Fd fd(OpenBeneath(root_.get(), {"f"}, O_RDWR | O_CREAT | O_EXCL, 0600));
  ASSERT_TRUE(fd.ok()) << std::strerror(errno);
  std::vector<char> a(70'001), b(3);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 7);
  iovec w[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
  ASSERT_TRUE(WriteFull(fd.get(), w, 2, 10));
  std::vector<char> ra(a.size()), rb(b.size() + 5);
  iovec r[2] = {{ra.data(), ra.size()}, {rb.data(), rb.size()}};
  // Asks for 5 bytes past the end: short, the bytes that exist are all there.
  EXPECT_EQ(ReadFull(fd.get(), r, 2, 10), static_cast<ssize_t>(a.size() + b.size()));
  EXPECT_EQ(ra, a);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), rb.begin()));
  char head[10];
  EXPECT_EQ(ReadFull(fd.get(), head, sizeof(head), 0), 10);  // a hole reads as zeros
  EXPECT_EQ(std::count(head, head + 10, 0), 10);
  EXPECT_EQ(ReadFull(fd.get(), head, sizeof(head), 1 << 20), 0);
  EXPECT_EQ(ReadFull(-1, head, sizeof(head), 0), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_FALSE(WriteFull(-1, head, sizeof(head), 0));
}

// O_DIRECT reads stop at the end of the file although it ends off a 4 KiB boundary (a further
// read from there would be EINVAL), with every byte in place.
TEST_P(FileIoTest, DirectReadStopsAtAnUnalignedEnd) {
  std::vector<char> bytes(4096 + 100);
  std::iota(bytes.begin(), bytes.end(), 1);
  {
    Fd w(OpenBeneath(root_.get(), {"d"}, O_WRONLY | O_CREAT | O_EXCL, 0600));
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(WriteFull(w.get(), bytes.data(), bytes.size(), 0));
  }
  Fd fd(OpenBeneath(root_.get(), {"d"}, O_RDONLY | O_DIRECT));
  if (!fd.ok() && errno == EINVAL) GTEST_SKIP() << "no O_DIRECT on /tmp";
  ASSERT_TRUE(fd.ok()) << std::strerror(errno);
  char* buf = static_cast<char*>(std::aligned_alloc(4096, 3 * 4096));
  iovec iov[2] = {{buf, 4096}, {buf + 4096, 2 * 4096}};
  EXPECT_EQ(ReadFullDirect(fd.get(), iov, 2, 0, 4096), static_cast<ssize_t>(bytes.size()));
  EXPECT_EQ(std::memcmp(buf, bytes.data(), bytes.size()), 0);
  std::free(buf);
}

TEST_P(FileIoTest, OpenBeneathNeverFollowsASymlink) {
  fs::create_directories(dir_ + "/ns/ab");
  fs::create_directories(dir_ + "/../" + fs::path(dir_).filename().string() + "_out");
  const std::string outside = dir_ + "_out";
  fs::create_directories(outside);
  std::ofstream(dir_ + "/ns/ab/page") << "x";
  std::ofstream(outside + "/page") << "y";
  Fd ok(OpenBeneath(root_.get(), {"ns", "ab", "page"}, O_RDONLY));
  EXPECT_TRUE(ok.ok()) << std::strerror(errno);
  Fd dir(OpenBeneath(root_.get(), {"ns", "ab"}, O_RDONLY | O_DIRECTORY));
  EXPECT_TRUE(dir.ok()) << std::strerror(errno);

  // A symlinked last component, a symlinked intermediate directory.
  fs::create_symlink(outside + "/page", dir_ + "/ns/ab/link");
  fs::create_symlink(outside, dir_ + "/ns/cd");
  errno = 0;
  EXPECT_EQ(OpenBeneath(root_.get(), {"ns", "ab", "link"}, O_RDONLY), -1);
  EXPECT_EQ(errno, ELOOP);
  errno = 0;
  EXPECT_EQ(OpenBeneath(root_.get(), {"ns", "cd", "page"}, O_RDONLY), -1);
  EXPECT_TRUE(errno == ELOOP || errno == ENOTDIR) << std::strerror(errno);
  errno = 0;
  EXPECT_EQ(OpenBeneath(root_.get(), {"ns", "cd"}, O_RDONLY | O_DIRECTORY), -1);
  EXPECT_TRUE(errno == ELOOP || errno == ENOTDIR) << std::strerror(errno);
  // Nothing is created through the symlinked directory.
  EXPECT_EQ(OpenBeneath(root_.get(), {"ns", "cd", "new"}, O_WRONLY | O_CREAT, 0600), -1);
  EXPECT_FALSE(fs::exists(outside + "/new"));
  for (auto bad : {std::string_view(".."), std::string_view("."), std::string_view(""),
                   std::string_view("ns/ab")}) {
    errno = 0;
    EXPECT_EQ(OpenBeneath(root_.get(), {bad, "page"}, O_RDONLY), -1) << bad;
    EXPECT_EQ(errno, EINVAL) << bad;
  }
  fs::remove_all(outside);
}

// O_NOATIME on a file of another owner, without CAP_FOWNER, is EPERM through either resolution;
// an EPERM the per-component open gives too is the file's, so a first open that meets it does not
// give openat2 up (only a seccomp filter's EPERM, which the fallback does not see, does). Needs
// root to give the file another owner and drop CAP_FOWNER (skipped otherwise).
TEST_P(FileIoTest, NoatimeRefusedForAnotherOwnersFileKeepsTheResolution) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown a file to another user";
  fs::create_directories(dir_ + "/ns");
  std::ofstream(dir_ + "/ns/page") << "x";
  ASSERT_EQ(::chown((dir_ + "/ns/page").c_str(), 65534, 65534), 0) << std::strerror(errno);
  testing::ScopedDropCapability no_fowner(CAP_FOWNER);
  if (!no_fowner.ok()) GTEST_SKIP() << "cannot drop CAP_FOWNER";
  ASSERT_EQ(Openat2StateForTesting(), GetParam() ? -1 : 0);  // SetUp: forced, or not known yet
  errno = 0;
  EXPECT_EQ(OpenBeneath(root_.get(), {"ns", "page"}, O_RDONLY | O_NOATIME), -1);
  EXPECT_EQ(errno, EPERM) << std::strerror(errno);
  EXPECT_EQ(Openat2StateForTesting(), GetParam() ? -1 : 0);
  Fd plain(OpenBeneath(root_.get(), {"ns", "page"}, O_RDONLY));
  EXPECT_TRUE(plain.ok()) << std::strerror(errno);
  if (!GetParam()) {  // braces: EXPECT_NE is an if-else of its own (-Wdangling-else)
    EXPECT_NE(Openat2StateForTesting(), 0);  // known once an open worked
  }
}

// PublishFile: into a free name a rename; over a regular file a swap (the old file then under the
// temporary name, for the caller to unlink; never a moment without a file at the name); over a
// symlink a plain rename that replaces the link, not what it names; over a directory it fails
// and leaves both.
TEST_P(FileIoTest, PublishFileSwapsOutAnOlderFile) {
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  };
  auto read = [&](const std::string& name) {
    std::ifstream in(dir_ + "/" + name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  bool replaced = true;
  write("t1", "new1");
  ASSERT_TRUE(PublishFile(root_.get(), "t1", "page", &replaced)) << std::strerror(errno);
  EXPECT_FALSE(replaced);
  EXPECT_EQ(read("page"), "new1");
  EXPECT_FALSE(fs::exists(dir_ + "/t1"));

  write("t2", "new2");
  struct stat new_file, old_file;
  ASSERT_EQ(::stat((dir_ + "/t2").c_str(), &new_file), 0);
  ASSERT_EQ(::stat((dir_ + "/page").c_str(), &old_file), 0);
  ASSERT_TRUE(PublishFile(root_.get(), "t2", "page", &replaced)) << std::strerror(errno);
  EXPECT_TRUE(replaced);
  EXPECT_EQ(read("page"), "new2");
  EXPECT_EQ(read("t2"), "new1");  // the older file, for the caller to unlink
  struct stat at_name, at_temp;
  ASSERT_EQ(::stat((dir_ + "/page").c_str(), &at_name), 0);
  ASSERT_EQ(::stat((dir_ + "/t2").c_str(), &at_temp), 0);
  EXPECT_EQ(at_name.st_ino, new_file.st_ino);
  EXPECT_EQ(at_temp.st_ino, old_file.st_ino);

  write("target", "kept");
  ASSERT_EQ(::symlink("target", (dir_ + "/link").c_str()), 0);
  write("t3", "new3");
  ASSERT_TRUE(PublishFile(root_.get(), "t3", "link", &replaced)) << std::strerror(errno);
  EXPECT_FALSE(replaced);
  EXPECT_FALSE(fs::is_symlink(dir_ + "/link"));
  EXPECT_EQ(read("link"), "new3");
  EXPECT_EQ(read("target"), "kept");

  fs::create_directory(dir_ + "/dir");
  write("t4", "new4");
  errno = 0;
  EXPECT_FALSE(PublishFile(root_.get(), "t4", "dir", &replaced));
  EXPECT_EQ(errno, EISDIR) << std::strerror(errno);
  EXPECT_FALSE(replaced);
  EXPECT_TRUE(fs::is_directory(dir_ + "/dir"));
  EXPECT_EQ(read("t4"), "new4");
}

INSTANTIATE_TEST_SUITE_P(Resolution, FileIoTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "openat" : "openat2"; });

}  // namespace
}  // namespace kvtier::storage
