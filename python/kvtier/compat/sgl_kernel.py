"""Drop-in replacements for SGLang's ``sgl_kernel.kvcacheio`` transfer functions.

Switch an engine with one import::

    from kvtier.compat import sgl_kernel as kvcacheio   # instead of sgl_kernel.kvcacheio

Every function has the name, argument names, order and defaults of its SGLang counterpart and the
same meaning:
  * ``item_size`` and ``*_layout_dim`` are in bytes (``item_size`` = bytes of one token in one layer
    of K, or of the MLA buffer; ``*_layout_dim`` = bytes of one token over all layers of a
    page_first / page_head pool, i.e. ``num_layers * item_size``);
  * indices are token indices; ``src_indices[i]`` goes to ``dst_indices[i]``;
  * ``*_layers`` arguments of the all-layer functions are uint64 tensors of per-layer base
    addresses (a layer_first pool whose layers are separate allocations);
  * the ``*_direct*`` functions take lists of tensors (per-layer tensors; a host
    ``page_first_direct`` pool as ``[K, V]``, or ``[buffer]`` for MLA).

How they run:
  * with any CUDA tensor involved, the kernel functions use kvtier's ``kernel`` backend and the
    direct ones its ``dma`` backend (copy engines), enqueued on PyTorch's current stream; unlike
    SGLang's, all of them also work on the legacy default stream. With only host memory (CPU
    tensors, numpy arrays) they use the ``cpu`` backend and return once the bytes are in place.
  * ``block_quota`` and ``num_warps_per_block`` are accepted for compatibility and ignored: the
    kernel backend sizes its own grid (its SM budget is ``kvtier.ops.configure(max_sms=...)``).
  * indices may be int32 or int64, on the host or the device (SGLang needs int64 CUDA tensors).
    Host indices are range-checked before anything moves (ValueError); device indices are checked
    in the kernels, which skip an out-of-range index and report it through
    ``kvtier.ops.synchronize()`` (SGLang silently skips negative ones and trusts the rest).
  * sizes: tensor arguments are checked against the geometry, so a too-small buffer raises
    ValueError instead of being written past its end. A uint64 pointer table carries no sizes;
    in a CUDA build every entry is bounded by the CUDA allocation it points into, so an index
    past it is an error too (SGLang crashes there): device memory (bounded by the whole
    ``cudaMalloc`` allocation: for PyTorch's caching allocator its segment, which may be larger
    than the tensor), pinned host memory (``cudaHostAlloc``, ``torch.empty(..., pin_memory=True)``)
    and registered host memory (the ``cudaHostRegister`` range). Unchecked, and copied from or
    to as the table says: entries into pageable host memory (numpy arrays, unpinned CPU tensors,
    ``malloc``), into another process's memory, and every entry in a build without CUDA — an
    index past such an allocation is undefined behaviour (a segfault at best).
  * a uint64 pointer table that lives on the GPU is read back to the host once and cached while
    the tensor is alive and unmodified (torch's version counter), so steady-state calls do not
    synchronize.
  * every function's arguments are read and checked in C++ (``_kvtier.sgl_kernel`` /
    ``_kvtier.sgl_direct``): these Python functions only forward them, so a call costs a few
    microseconds on top of the copy's own submission.

Thread safety: as kvtier.ops; the C++ caches are guarded by the GIL.
"""

from __future__ import annotations

from .. import _kvtier

__all__ = [
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_all_layer_direct_lf_pf",
]

# Kinds of _kvtier.sgl_kernel (python/src/compat_binding.cc).
_PER_LAYER, _PER_LAYER_PF_LF, _PER_LAYER_PH_LF = 0, 1, 2
_ALL_LAYER, _ALL_LAYER_LF_PF, _ALL_LAYER_LF_PH = 3, 4, 5
# Kinds of _kvtier.sgl_direct.
_DIRECT, _DIRECT_PF_LF, _DIRECT_LF_PF = 0, 1, 2

_kernel = _kvtier.sgl_kernel
_direct = _kvtier.sgl_direct


# ---- kernel functions -------------------------------------------------------------------------
# Arguments of _kernel: kind, mla, src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id,
# item_size, layout_dim, num_layers, page_size, head_num.

def transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size,
                          block_quota=2, num_warps_per_block=32):
    """One layer, layer_first to layer_first: each buffer is one layer [tokens, item_size]."""
    _kernel(_PER_LAYER, False, src_k, dst_k, src_v, dst_v, src_indices, dst_indices, 0, item_size,
            None, None, None, None)


def transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id,
                                item_size, src_layout_dim, block_quota=2, num_warps_per_block=32):
    """Layer layer_id of a page_first pool [tokens, L, item_size] to one layer_first layer."""
    _kernel(_PER_LAYER_PF_LF, False, src_k, dst_k, src_v, dst_v, src_indices, dst_indices,
            layer_id, item_size, src_layout_dim, None, None, None)


def transfer_kv_per_layer_ph_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id,
                                item_size, src_layout_dim, page_size, head_num, block_quota=2,
                                num_warps_per_block=32):
    """Layer layer_id of a page_head pool [pages, H, P, L, item_size/H] to one layer_first layer."""
    _kernel(_PER_LAYER_PH_LF, False, src_k, dst_k, src_v, dst_v, src_indices, dst_indices,
            layer_id, item_size, src_layout_dim, None, page_size, head_num)


def transfer_kv_all_layer(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices,
                          dst_indices, item_size, num_layers, block_quota=2,
                          num_warps_per_block=32):
    """Every layer, per-layer pointer tables on both sides (layer_first to layer_first)."""
    _kernel(_ALL_LAYER, False, src_k_layers, dst_k_layers, src_v_layers, dst_v_layers,
            src_indices, dst_indices, 0, item_size, None, num_layers, None, None)


def transfer_kv_all_layer_lf_pf(src_k_layers, dst_k, src_v_layers, dst_v, src_indices,
                                dst_indices, item_size, dst_layout_dim, num_layers, block_quota=2,
                                num_warps_per_block=32):
    """Every layer, per-layer pointer tables to a page_first pool [tokens, L, item_size]."""
    _kernel(_ALL_LAYER_LF_PF, False, src_k_layers, dst_k, src_v_layers, dst_v, src_indices,
            dst_indices, 0, item_size, dst_layout_dim, num_layers, None, None)


def transfer_kv_all_layer_lf_ph(src_k_layers, dst_k, src_v_layers, dst_v, src_indices,
                                dst_indices, item_size, dst_layout_dim, num_layers, page_size,
                                head_num, block_quota=2, num_warps_per_block=32):
    """Every layer, per-layer pointer tables to a page_head pool [pages, H, P, L, item_size/H]."""
    _kernel(_ALL_LAYER_LF_PH, False, src_k_layers, dst_k, src_v_layers, dst_v, src_indices,
            dst_indices, 0, item_size, dst_layout_dim, num_layers, page_size, head_num)


# The MLA functions are the MHA ones with one buffer (argument names in messages follow, e.g.
# "src_layers" instead of "src_k_layers").

def transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size, block_quota=2,
                              num_warps_per_block=32):
    """MLA, one layer, layer_first to layer_first."""
    _kernel(_PER_LAYER, True, src, dst, None, None, src_indices, dst_indices, 0, item_size, None,
            None, None, None)


def transfer_kv_per_layer_mla_pf_lf(src, dst, src_indices, dst_indices, layer_id, item_size,
                                    src_layout_dim, block_quota=2, num_warps_per_block=32):
    """MLA, layer layer_id of a page_first pool to one layer_first layer."""
    _kernel(_PER_LAYER_PF_LF, True, src, dst, None, None, src_indices, dst_indices, layer_id,
            item_size, src_layout_dim, None, None, None)


def transfer_kv_all_layer_mla(src_layers, dst_layers, src_indices, dst_indices, item_size,
                              num_layers, block_quota=2, num_warps_per_block=32):
    """MLA, every layer, per-layer pointer tables on both sides."""
    _kernel(_ALL_LAYER, True, src_layers, dst_layers, None, None, src_indices, dst_indices, 0,
            item_size, None, num_layers, None, None)


def transfer_kv_all_layer_mla_lf_pf(src_layers, dst, src_indices, dst_indices, item_size,
                                    dst_layout_dim, num_layers, block_quota=2,
                                    num_warps_per_block=32):
    """MLA, every layer, per-layer pointer tables to a page_first pool."""
    _kernel(_ALL_LAYER_LF_PF, True, src_layers, dst, None, None, src_indices, dst_indices, 0,
            item_size, dst_layout_dim, num_layers, None, None)


# ---- direct functions (copy engines) ----------------------------------------------------------

def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """Copy token rows between lists of per-layer tensors: src_layers[j] -> dst_layers[j].
    Everything is checked before any byte moves."""
    _direct(_DIRECT, src_layers, dst_layers, src_indices, dst_indices, 0, page_size)


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id,
                                       page_size):
    """Layers [layer_id, layer_id + n) of a host page_first_direct pool ([K, V] or [buffer],
    each [pages, L, page_size, ...]) into per-layer tensors (n K layers then n V layers)."""
    _direct(_DIRECT_PF_LF, src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size):
    """Every layer of per-layer tensors (L K layers then L V layers, or L MLA layers) into a host
    page_first_direct pool ([K, V] or [buffer], each [pages, L, page_size, ...])."""
    _direct(_DIRECT_LF_PF, src_ptrs, dst_ptrs, src_indices, dst_indices, 0, page_size)


def _register_torch_ops() -> None:
    """torch.ops.kvtier.* (kvtier.compat.torch_ops), when PyTorch is already imported."""
    import sys

    if "torch" in sys.modules and "kvtier.compat.torch_ops" not in sys.modules:
        from . import torch_ops  # noqa: F401


_register_torch_ops()
