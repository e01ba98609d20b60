// FastDivmod (the CUDA copy kernel's division by run-time shapes) against plain division, on the
// host: the same code runs on the device. Header-only and CUDA-free, so it runs in every build.
#include <gtest/gtest.h>

#include <random>

#include "transfer/cuda/copy_view.h"

namespace kvtier::transfer::cuda {
namespace {

TEST(FastDivmodTest, MatchesDivisionForEdgeAndRandomValues) {
  std::mt19937_64 rng(7);
  std::vector<uint32_t> divisors = {
      1, 2, 3, 5, 7, 16, 61, 72, 128, 1000, 65535, 65536, 1u << 30, (1u << 31) - 1, 1u << 31};
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + static_cast<uint32_t>(rng() % (1u << 31)));
  for (uint32_t d : divisors) {
    const FastDivmod f = FastDivmod::Make(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, 0xffffffffu, 0xfffffffeu, 0x7fffffffu};
    for (int i = 0; i < 2000; ++i) ns.push_back(static_cast<uint32_t>(rng()));
    for (uint32_t n : ns) {
      uint32_t q, r;
      f.DivMod(n, &q, &r);
      ASSERT_EQ(q, n / d) << n << " / " << d;
      ASSERT_EQ(r, n % d) << n << " % " << d;
    }
  }
}

}  // namespace
}  // namespace kvtier::transfer::cuda
