// Internal: the type a copy kernel moves as one W-byte access (W = 16, 8, 4, 2 or 1: CUDA's
// built-in vectors, then plain unsigned integers), and the launchers' switch from a run-time
// width to the kernel instantiated for it; for the paged copy kernel (copy_kernels.cuh) and the
// dense <-> paged kernel (dense_paged_kernels.cuh). nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

namespace kvtier::transfer::cuda {

template <int W>
struct AccessVec;
template <>
struct AccessVec<16> {
  using Type = uint4;
};
template <>
struct AccessVec<8> {
  using Type = uint2;
};
template <>
struct AccessVec<4> {
  using Type = unsigned int;
};
template <>
struct AccessVec<2> {
  using Type = unsigned short;
};
template <>
struct AccessVec<1> {
  using Type = unsigned char;
};

// Calls `launch(std::integral_constant<int, W>{})` for the W of `Widths` that equals `width`:
// cudaSuccess, or cudaErrorInvalidValue (nothing called) for a width not among them.
template <int... Widths, typename Launch>
cudaError_t ForWidth(int width, Launch&& launch) {
  const bool found =
      ((width == Widths && (launch(std::integral_constant<int, Widths>{}), true)) || ...);
  return found ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace kvtier::transfer::cuda
