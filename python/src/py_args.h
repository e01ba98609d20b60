// python/src/py_args.h — reading the arguments of a transfer call in C++: integers, buffers
// (torch tensors, buffer-protocol objects such as numpy arrays, CUDA / numpy array interfaces),
// index lists and the CUDA stream to enqueue on.
//
// This is the fast path of kvtier.ops and kvtier.compat.sgl_kernel: every per-call argument is
// read here, with the Python C API, without running Python code of kvtier's own. torch is never
// imported: a tensor is recognised by `torch.Tensor` once the caller has imported torch.
// Every bad argument throws StatusError(InvalidArgument) (a ValueError in Python) whose message
// names the argument, as the Python layer did before.
//
// Thread safety: every function REQUIRES the GIL; the cached type objects are set once under it.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/transfer.h"

namespace kvtier::python {

inline constexpr int kHostDevice = -1;  // device ordinal of host memory

// Throws StatusError(InvalidArgument(message)).
[[noreturn]] void ThrowInvalid(std::string message);

// An integer argument: a Python int or an object with __index__ (numpy integers), never a bool or
// a float, within [min, max]. Otherwise InvalidArgument "<name> = <value> must be ...".
int64_t ReadInt(pybind11::handle value, std::string_view name, int64_t min, int64_t max);

// A list of integers: a list, tuple or range of ints, or any other ordered iterable of integer
// objects (a 1-D numpy array or tensor); each element as ReadInt reads it ("<name>[i] = ...").
// str, bytes, bytearray, memoryview, set, frozenset and dict are refused (their iteration is not
// a token list), as is anything not iterable.
std::vector<int64_t> ReadIntList(pybind11::handle obj, std::string_view name, int64_t min,
                                 int64_t max);

// A contiguous buffer.
struct BufferArg {
  uint64_t address = 0;
  int64_t nbytes = 0;
  int device = kHostDevice;  // CUDA device ordinal, or kHostDevice
  bool readonly = false;
  int ndim = 0;
  std::array<int64_t, 3> shape{};  // the first min(ndim, 3) dimensions

  const char* where() const { return device == kHostDevice ? "host memory" : "cuda"; }
};

// Reads a torch tensor, a buffer-protocol object (host memory), or an object with
// __cuda_array_interface__ / __array_interface__. REQUIRES the buffer stays alive during the call
// (the caller holds `obj`).
BufferArg ReadBuffer(pybind11::handle obj, std::string_view name);

// True when `obj` can no longer be written (a numpy array whose `writeable` flag was cleared, a
// read-only memoryview). Tensors and CUDA arrays are always writable.
bool IsReadOnly(pybind11::handle obj);

// A 1-D int32/int64 index list. Lists, tuples and ranges of integers are copied into `owned`;
// non-contiguous host arrays too.
struct IndexArg {
  const void* data = nullptr;
  int64_t count = 0;
  bool int64 = true;
  int device = kHostDevice;
  std::vector<int64_t> owned;
  pybind11::object keep;  // a converted object (a host copy of device indices)

  SlotIndices Get() const {
    return {data, count, int64 ? IndexType::kInt64 : IndexType::kInt32,
            device == kHostDevice ? MemoryKind::kHost : MemoryKind::kDevice};
  }
};

IndexArg ReadIndices(pybind11::handle obj, std::string_view name);

// The same indices in host memory: device tensors are read back with `.cpu()` (torch) or `.get()`
// (CuPy), which waits for the producing stream.
IndexArg HostIndices(IndexArg arg, pybind11::handle obj, std::string_view name);

// A uint64 (or int64) table of `count` addresses on the host or a GPU (torch). A table on a GPU
// is read back once and cached while the tensor is alive and unmodified (torch's version
// counter). `on_gpu` tells where the table itself lived.
std::vector<uint64_t> ReadAddressTable(pybind11::handle obj, std::string_view name, int64_t count,
                                       bool* on_gpu);

// The stream to enqueue on. `stream` None: PyTorch's current stream of `device` when torch is
// imported and `device` is a CUDA device, else 0 (the legacy default stream). Otherwise an int
// address or an object with `cuda_stream` (torch), `ptr` (CuPy) or `handle`.
CudaStream ResolveStreamArg(pybind11::handle stream, int device);

// The one CUDA device that a copy's operands (name, device ordinal or kHostDevice) are on, or
// kHostDevice when all are in host memory; a ValueError naming each operand on a device when they
// are on several.
int CommonDevice(std::span<const std::pair<std::string, int>> operands);

// Where `address` lives: kHostDevice for host memory (or without CUDA), else the device ordinal.
int PointerDevice(uint64_t address);

// Bytes from `address` to the end of the CUDA allocation that holds it: device memory (the whole
// cudaMalloc allocation, which for a caching allocator such as PyTorch's is its segment, not the
// tensor), pinned host memory (cudaHostAlloc / cudaMallocHost) and registered host memory (the
// cudaHostRegister range), through cuPointerGetAttributes' range or, for host memory,
// cudaPointerGetAttributes' device alias and cuMemGetAddressRange. -1 when CUDA cannot tell:
// pageable host memory (numpy arrays, unpinned CPU tensors, malloc), memory of another process,
// and everything in a build without CUDA.
int64_t AllocationBytesFrom(uint64_t address);

}  // namespace kvtier::python
