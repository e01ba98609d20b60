// CopyDensePaged (kvtier/dense_paged.h): argument checks, the CPU copy, and the dispatch to the
// CUDA kernel (cuda/dense_paged_gpu.cc).
//
// Thread safety: stateless.
#include "kvtier/dense_paged.h"

#include <fmt/format.h>

#include <cstring>

#include "transfer/dense_paged_internal.h"

namespace kvtier {
namespace {

using transfer::DenseHeadBytes;
using transfer::PoolHeadStride;

Status ValidateTensor(const DenseTensor& t, const char* name, size_t layer, bool empty) {
  for (int i = 0; i < 4; ++i) {
    if (t.strides[i] < 0) {
      return Status::InvalidArgument(
          fmt::format("{}[{}] has a negative stride ({} bytes in dimension {}); pass a view with "
                      "non-negative strides",
                      name, layer, t.strides[i], i));
    }
  }
  if (t.data == nullptr && !empty) {
    return Status::InvalidArgument(fmt::format("{}[{}] is null", name, layer));
  }
  return Status::OK();
}

Status Validate(const KvRegion& pool, SlotIndices slots, const DenseKv& d, int64_t first_layer) {
  KVTIER_RETURN_IF_ERROR(pool.Validate("pool"));
  const KvGeometry& g = pool.geometry;
  const auto layers = static_cast<int64_t>(d.k.size());
  if (layers == 0) return Status::InvalidArgument("k has no layers");
  if (pool.mla && !d.v.empty()) {
    return Status::InvalidArgument(
        fmt::format("v has {} layers but the pool is MLA (one buffer): pass k only", d.v.size()));
  }
  if (!pool.mla && static_cast<int64_t>(d.v.size()) != layers) {
    return Status::InvalidArgument(
        fmt::format("v has {} layers, k has {}; an MHA pool needs both", d.v.size(), layers));
  }
  if (first_layer < 0 || first_layer > g.num_layers - layers) {
    return Status::InvalidArgument(
        fmt::format("first_layer = {} with {} layers is outside the pool's {} layers", first_layer,
                    layers, g.num_layers));
  }
  if (d.batch < 0 || d.seq < 0 || d.heads <= 0 || d.head_dim <= 0) {
    return Status::InvalidArgument(fmt::format(
        "dense shape [batch {}, heads {}, seq {}, head_dim {}]: batch and seq must not be "
        "negative, heads and head_dim must be positive",
        d.batch, d.heads, d.seq, d.head_dim));
  }
  if (d.elem_bytes != 1 && d.elem_bytes != 2 && d.elem_bytes != 4 && d.elem_bytes != 8) {
    return Status::InvalidArgument(
        fmt::format("elem_bytes = {} must be 1, 2, 4 or 8", d.elem_bytes));
  }
  if (d.heads > (int64_t{1} << 20) || d.head_dim > (int64_t{1} << 20) ||
      d.heads * DenseHeadBytes(d) != g.slot_bytes) {
    return Status::InvalidArgument(fmt::format(
        "heads x head_dim x elem_bytes = {} x {} x {} does not equal the pool's slot_bytes = {}",
        d.heads, d.head_dim, d.elem_bytes, g.slot_bytes));
  }
  if (g.layout == KvLayout::kPageHead && d.heads != g.head_num) {
    return Status::InvalidArgument(fmt::format(
        "heads = {} must equal the page_head pool's head_num = {}", d.heads, g.head_num));
  }
  if (d.batch > 0 && d.seq > (int64_t{1} << 31) / d.batch) {
    return Status::InvalidArgument(
        fmt::format("batch x seq = {} x {} exceeds 2^31 tokens", d.batch, d.seq));
  }
  const int64_t tokens = d.batch * d.seq;
  if (slots.count != tokens) {
    return Status::InvalidArgument(
        fmt::format("slots has {} entries but batch x seq = {} x {} = {}", slots.count, d.batch,
                    d.seq, tokens));
  }
  if (tokens > 0 && slots.data == nullptr) return Status::InvalidArgument("slots is null");
  for (size_t l = 0; l < d.k.size(); ++l) {
    KVTIER_RETURN_IF_ERROR(ValidateTensor(d.k[l], "k", l, tokens == 0));
    if (!pool.mla) KVTIER_RETURN_IF_ERROR(ValidateTensor(d.v[l], "v", l, tokens == 0));
  }
  if (d.memory != pool.memory || (d.memory == MemoryKind::kDevice && d.device != pool.device)) {
    return Status::InvalidArgument(fmt::format(
        "the dense tensors are in {} (device {}) but the pool is in {} (device {}); both must be "
        "in host memory or on the same CUDA device",
        MemoryKindName(d.memory), d.device, MemoryKindName(pool.memory), pool.device));
  }
  if (slots.memory == MemoryKind::kDevice && pool.memory != MemoryKind::kDevice) {
    return Status::InvalidArgument("slots are in device memory but the pool is in host memory");
  }
  if (slots.memory == MemoryKind::kHost) {
    for (int64_t i = 0; i < tokens; ++i) {
      const int64_t s = slots.at(i);
      if (s < 0 || s >= g.num_slots) {
        return Status::InvalidArgument(
            fmt::format("slots[{}] = {} is outside the pool's [0, {})", i, s, g.num_slots));
      }
    }
  }
  return Status::OK();
}

// The CPU copy: one memcpy per head when head_dim is contiguous, else per element.
void CopyOnCpu(const KvRegion& pool, SlotIndices slots, const DenseKv& d, int64_t first_layer,
               DenseDirection direction) {
  const int64_t head_bytes = DenseHeadBytes(d);
  const int64_t pool_head_stride = PoolHeadStride(pool, d);
  for (int buffer = 0; buffer < pool.num_buffers(); ++buffer) {
    const std::span<const DenseTensor> tensors = buffer == 0 ? d.k : d.v;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int64_t layer = first_layer + static_cast<int64_t>(i);
      const DenseTensor& t = tensors[i];
      const bool contiguous = t.strides[3] == d.elem_bytes || d.head_dim == 1;
      std::byte* layer_base = pool.LayerBase(buffer, layer);
      for (int64_t b = 0; b < d.batch; ++b) {
        for (int64_t s = 0; s < d.seq; ++s) {
          const int64_t slot = slots.at(b * d.seq + s);
          std::byte* pool_slot = layer_base + pool.LayerOffset(layer, slot, 0);
          std::byte* dense_token =
              static_cast<std::byte*>(t.data) + b * t.strides[0] + s * t.strides[2];
          for (int64_t h = 0; h < d.heads; ++h) {
            std::byte* p = pool_slot + h * pool_head_stride;
            std::byte* q = dense_token + h * t.strides[1];
            std::byte* dst = direction == DenseDirection::kToPool ? p : q;
            const std::byte* src = direction == DenseDirection::kToPool ? q : p;
            if (contiguous) {
              std::memcpy(dst, src, static_cast<size_t>(head_bytes));
              continue;
            }
            for (int64_t e = 0; e < d.head_dim; ++e) {
              std::byte* pe = p + e * d.elem_bytes;
              std::byte* qe = q + e * t.strides[3];
              std::memcpy(direction == DenseDirection::kToPool ? pe : qe,
                          direction == DenseDirection::kToPool ? qe : pe,
                          static_cast<size_t>(d.elem_bytes));
            }
          }
        }
      }
    }
  }
}

}  // namespace

Status CopyDensePaged(const KvRegion& pool, SlotIndices slots, const DenseKv& dense,
                      int64_t first_layer, DenseDirection direction, CudaStream stream) {
  if (direction != DenseDirection::kToPool && direction != DenseDirection::kFromPool) {
    return Status::InvalidArgument(
        fmt::format("direction = {} is not to_pool or from_pool", static_cast<int>(direction)));
  }
  KVTIER_RETURN_IF_ERROR(Validate(pool, slots, dense, first_layer));
  if (dense.batch * dense.seq == 0) return Status::OK();
  if (pool.memory == MemoryKind::kHost) {
    CopyOnCpu(pool, slots, dense, first_layer, direction);
    return Status::OK();
  }
#if defined(KVTIER_WITH_CUDA)
  return transfer::CopyDensePagedOnGpu(pool, slots, dense, first_layer, direction, stream);
#else
  (void)stream;
  return Status::Unavailable(
      "dense <-> paged copies in device memory need kvtier built with CUDA (KVTIER_CUDA=ON)");
#endif
}

Result<int64_t> TakeDensePagedErrors(int device) {
#if defined(KVTIER_WITH_CUDA)
  return transfer::TakeDensePagedErrorsOnGpu(device);
#else
  (void)device;
  return int64_t{0};
#endif
}

}  // namespace kvtier
