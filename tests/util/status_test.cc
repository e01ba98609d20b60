#include "kvtier/status.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(StatusTest, OkIsDefaultAndCheap) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, FactoriesCarryCodeAndMessage) {
  const Status s = Status::InvalidArgument("page_size = 3 does not divide 32");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_EQ(s.ToString(), "InvalidArgument: page_size = 3 does not divide 32");
  EXPECT_EQ(Status::OutOfMemory("x").code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(Status::CudaError("x").code(), StatusCode::kCudaError);
  EXPECT_EQ(Status::Corruption("x").code(), StatusCode::kCorruption);
  EXPECT_EQ(Status::Unavailable("x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(Status::IOError("x").code(), StatusCode::kIOError);
  EXPECT_EQ(Status::NotFound("x").code(), StatusCode::kNotFound);
}

TEST(StatusTest, CopyMoveAndContext) {
  Status a = Status::NotFound("key");
  Status b = a;
  EXPECT_EQ(b.ToString(), a.ToString());
  Status c = std::move(a);
  EXPECT_TRUE(c.IsNotFound());
  EXPECT_EQ(c.WithContext("storage").message(), "storage: key");
  EXPECT_TRUE(Status::OK().WithContext("x").ok());
}

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd");
  return x / 2;
}

Status UseMacros(int x, int* out) {
  KVTIER_ASSIGN_OR_RETURN(int h, Half(x));
  KVTIER_RETURN_IF_ERROR(h > 10 ? Status::OutOfMemory("big") : Status::OK());
  *out = h;
  return Status::OK();
}

TEST(StatusTest, ResultAndMacros) {
  int out = 0;
  EXPECT_TRUE(UseMacros(8, &out).ok());
  EXPECT_EQ(out, 4);
  EXPECT_TRUE(UseMacros(7, &out).IsInvalidArgument());
  EXPECT_TRUE(UseMacros(40, &out).IsOutOfMemory());
  Result<int> r(Status::OK());
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace kvtier
