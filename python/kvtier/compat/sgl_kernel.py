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
    ValueError instead of being written past its end. A uint64 pointer table carries no sizes, so
    indices into such a pool are not bounds-checked (as in SGLang).
  * a uint64 pointer table that lives on the GPU is read back to the host once and cached while
    the tensor is alive and unmodified (torch's version counter), so steady-state calls do not
    synchronize.

Thread safety: as kvtier.ops; the pointer-table cache is guarded by a lock.
"""

from __future__ import annotations

import collections
import sys
import threading
from typing import Any, List, Sequence, Tuple

from .. import _kvtier, ops
from .._buffers import HOST, describe_buffer, describe_indices, _is_torch_tensor

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

# Slots assumed behind a per-layer pointer table (which carries no size): large enough for any
# real pool, small enough that offsets stay far from overflow.
_TABLE_SLOTS = 1 << 31


# ---- argument helpers -------------------------------------------------------------------------

def _item_size(item_size: Any) -> int:
    item_size = ops._int(item_size, "item_size", 1)
    if item_size % 4 != 0:
        raise ValueError(f"item_size = {item_size} must be a multiple of 4 bytes")
    return item_size


def _layout_dim(layout_dim: Any, name: str, item_size: int) -> int:
    layout_dim = ops._int(layout_dim, name, 1)
    if layout_dim % item_size != 0:
        raise ValueError(f"{name} = {layout_dim} is not a multiple of item_size = {item_size} "
                         "(it is num_layers * item_size)")
    return layout_dim


def _indices(src_indices: Any, dst_indices: Any):
    si = describe_indices(src_indices, "src_indices")
    di = describe_indices(dst_indices, "dst_indices")
    if si.count != di.count:
        raise ValueError(f"src_indices and dst_indices differ in length: {si.count} vs {di.count}")
    return si, di


def _slots(nbytes: int, unit: int, name: str, page_size: int = 1) -> int:
    n = nbytes // unit
    n -= n % page_size
    if n <= 0:
        raise ValueError(f"{name} holds {nbytes} bytes, less than one "
                         f"{'page' if page_size > 1 else 'token'} of {unit * page_size} bytes")
    return n


# Regions by geometry and addresses. A region holds no reference to the buffers (the caller keeps
# them alive for the call, as with SGLang's functions), so an entry is valid for whatever buffer
# occupies those addresses with that geometry: building the C++ region is most of a call's host
# cost, and engines call these functions with the same pools every time.
_region_cache: dict = {}
_REGION_CACHE_CAPACITY = 512


def _cached_region(key: tuple, make) -> ops.KvRegion:
    region = _region_cache.get(key)
    if region is None:
        region = make()
        if len(_region_cache) >= _REGION_CACHE_CAPACITY:
            _region_cache.clear()
        _region_cache[key] = region
    return region


def _region_kv(k: Any, v: Any, name: str, *, layout: str, num_layers: int, item_size: int,
               unit: int, page_size: int = 1, head_num: int = 1) -> ops.KvRegion:
    """A region over K and V buffers (v None: MLA) with N = the slots every buffer holds."""
    labels = (f"{name}_k", f"{name}_v") if v is not None else (name,)
    bufs = [describe_buffer(k, labels[0])]
    if v is not None:
        bufs.append(describe_buffer(v, labels[1]))
    num_slots = min(_slots(b.nbytes, unit, label, page_size) for b, label in zip(bufs, labels))
    if len(bufs) == 2 and bufs[0].device != bufs[1].device:
        raise ValueError(f"{name} mixes memories: {labels[0]} in {bufs[0].where()}, "
                         f"{labels[1]} in {bufs[1].where()}")
    if name == "dst":
        for b, label in zip(bufs, labels):
            if b.readonly:
                raise ValueError(f"dst buffer {label} is read-only")
    key = (name, layout, num_layers, item_size, num_slots, page_size, head_num, bufs[0].device,
           tuple(b.address for b in bufs))
    return _cached_region(key, lambda: ops.KvRegion.from_addresses(
        layout=layout, num_layers=num_layers, num_slots=num_slots, slot_bytes=item_size,
        page_size=page_size, head_num=head_num, mla=v is None, device=bufs[0].device,
        k=bufs[0].address, v=bufs[1].address if v is not None else 0, name=name))


class _TableCache:
    """Host copies of GPU-resident uint64 pointer tables, with where their pointees live, keyed by
    the tensor's memory.

    An entry holds a reference to the tensor it was read from, so its memory cannot be reused by
    another tensor while cached; torch's version counter (shared by views) catches in-place
    changes.
    """

    def __init__(self, capacity: int = 64) -> None:
        self._lock = threading.Lock()
        self._entries: "collections.OrderedDict[Tuple[int, int, int], Tuple[Any, int, List[int], int]]"
        self._entries = collections.OrderedDict()
        self._capacity = capacity

    def get(self, table: Any, name: str) -> Tuple[List[int], int]:
        """(addresses, device of the pointees) of a contiguous int64/uint64 CUDA tensor."""
        key = (table.data_ptr(), table.numel(), table.device.index or 0)
        version = table._version
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[1] == version:
                self._entries.move_to_end(key)
                return entry[2], entry[3]
        torch = sys.modules["torch"]
        # One device-to-host read on the current stream (it waits for the stream's earlier work).
        addresses = _unsigned(table.view(torch.int64).cpu().tolist())
        _check_nonnull(addresses, name)
        device = _pointer_device(addresses, name, True)
        with self._lock:
            self._entries[key] = (table, version, addresses, device)
            self._entries.move_to_end(key)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        return addresses, device


_table_cache = _TableCache()


def _unsigned(values: Sequence[int]) -> List[int]:
    return [int(a) & 0xFFFFFFFFFFFFFFFF for a in values]


def _check_nonnull(addresses: Sequence[int], name: str) -> None:
    if 0 in addresses:
        raise ValueError(f"{name}[{list(addresses).index(0)}] is a null address")


def _pointer_device(addresses: Sequence[int], name: str, table_on_gpu: bool) -> int:
    """Where the memory behind a pointer table lives: HOST or a CUDA device ordinal."""
    if not hasattr(_kvtier, "pointer_info"):
        if table_on_gpu:
            raise _kvtier.UnavailableError(
                f"{name} is a CUDA tensor, and kvtier was built without CUDA (KVTIER_CUDA=OFF)")
        return HOST  # without CUDA, a host table can only point into host memory
    places = {tuple(_kvtier.pointer_info(a)) for a in addresses}
    if len(places) != 1:
        raise ValueError(f"{name} points into different memories: {sorted(places)}")
    memory, device = places.pop()
    return device if memory == "device" else HOST


def _table(table: Any, name: str, num_layers: int) -> Tuple[List[int], int, bool]:
    """(addresses, device of the pointees, whether the table itself is on a GPU)."""
    if table is None:
        raise ValueError(f"{name} is None; expected a uint64 tensor of per-layer addresses")
    if _is_torch_tensor(table):
        torch = sys.modules["torch"]
        allowed = [torch.int64] + ([torch.uint64] if hasattr(torch, "uint64") else [])
        if table.dtype not in allowed:
            raise ValueError(f"{name} has dtype {table.dtype}; expected torch.uint64 addresses")
        if table.dim() != 1 or table.numel() != num_layers:
            raise ValueError(f"{name} has shape {tuple(table.shape)}; expected ({num_layers},) "
                             f"for num_layers = {num_layers}")
        if not table.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if table.device.type == "cuda":
            addresses, device = _table_cache.get(table, name)
            return addresses, device, True
        addresses = _unsigned(table.view(torch.int64).tolist())
    else:
        import numpy as np

        arr = np.asarray(table)
        if arr.dtype not in (np.uint64, np.int64) or arr.ndim != 1 or arr.size != num_layers:
            raise ValueError(f"{name} must be a 1-D uint64 array of {num_layers} addresses, got "
                             f"dtype {arr.dtype} shape {arr.shape}")
        addresses = _unsigned(arr.view(np.uint64).tolist())
    _check_nonnull(addresses, name)
    return addresses, _pointer_device(addresses, name, False), False


def _table_region(k_table: Any, v_table: Any, name: str, num_layers: int,
                  item_size: int) -> Tuple[ops.KvRegion, bool]:
    """A layer_first region over per-layer pointer tables (v_table None: MLA)."""
    num_layers = ops._int(num_layers, "num_layers", 1)
    k_name = f"{name}_k_layers" if v_table is not None else f"{name}_layers"
    k_addr, k_dev, k_gpu = _table(k_table, k_name, num_layers)
    v_addr: List[int] = []
    on_gpu = k_gpu
    if v_table is not None:
        v_addr, v_dev, v_gpu = _table(v_table, f"{name}_v_layers", num_layers)
        on_gpu = on_gpu or v_gpu
        if v_dev != k_dev:
            raise ValueError(f"{k_name} and {name}_v_layers point into different memories")
    num_slots = max(1, min(_TABLE_SLOTS, (1 << 62) // (num_layers * item_size)))
    key = (name, "table", num_layers, item_size, k_dev, tuple(k_addr), tuple(v_addr))
    region = _cached_region(key, lambda: ops.KvRegion.from_addresses(
        layout="layer_first", num_layers=num_layers, num_slots=num_slots, slot_bytes=item_size,
        mla=v_table is None, device=k_dev, k_layers=k_addr, v_layers=v_addr, name=name))
    return region, on_gpu


def _launch(src: ops.KvRegion, dst: ops.KvRegion, si, di, *, src_layer: int, dst_layer: int,
            num_layers: int, gpu_backend: str, extra_gpu: bool = False) -> None:
    """Runs on the cpu backend when both regions are in host memory (and no pointer table lives
    on a GPU), else on `gpu_backend` with PyTorch's current stream."""
    if src.device == HOST and dst.device == HOST and not extra_gpu:
        si, di = _host_indices(si, "src_indices"), _host_indices(di, "dst_indices")
        backend = "cpu"
    else:
        backend = gpu_backend
    if dst._readonly:
        raise ValueError(f"dst buffer {dst._readonly[0]} is read-only")
    ops._run(src, dst, si, di, src_layer, dst_layer, num_layers, backend, None, None)


def _host_indices(info, name: str):
    if info.device == HOST:
        return info
    to_host = getattr(info.obj, "cpu", None) or getattr(info.obj, "get", None)
    if to_host is None:
        raise ValueError(f"{name} is in device memory and cannot be read back to the host")
    return describe_indices(to_host(), name)


# ---- kernel functions -------------------------------------------------------------------------

def transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size,
                          block_quota=2, num_warps_per_block=32):
    """One layer, layer_first to layer_first: each buffer is one layer [tokens, item_size]."""
    item_size = _item_size(item_size)
    si, di = _indices(src_indices, dst_indices)
    src = _region_kv(src_k, src_v, "src", layout="layer_first", num_layers=1,
                     item_size=item_size, unit=item_size)
    dst = _region_kv(dst_k, dst_v, "dst", layout="layer_first", num_layers=1,
                     item_size=item_size, unit=item_size)
    _launch(src, dst, si, di, src_layer=0, dst_layer=0, num_layers=1, gpu_backend="kernel")


def transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id,
                                item_size, src_layout_dim, block_quota=2, num_warps_per_block=32):
    """Layer layer_id of a page_first pool [tokens, L, item_size] to one layer_first layer."""
    item_size = _item_size(item_size)
    src_layout_dim = _layout_dim(src_layout_dim, "src_layout_dim", item_size)
    layer_id = ops._int(layer_id, "layer_id", 0)
    si, di = _indices(src_indices, dst_indices)
    src = _region_kv(src_k, src_v, "src", layout="page_first",
                     num_layers=src_layout_dim // item_size, item_size=item_size,
                     unit=src_layout_dim)
    dst = _region_kv(dst_k, dst_v, "dst", layout="layer_first", num_layers=1,
                     item_size=item_size, unit=item_size)
    _launch(src, dst, si, di, src_layer=layer_id, dst_layer=0, num_layers=1,
            gpu_backend="kernel")


def transfer_kv_per_layer_ph_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id,
                                item_size, src_layout_dim, page_size, head_num, block_quota=2,
                                num_warps_per_block=32):
    """Layer layer_id of a page_head pool [pages, H, P, L, item_size/H] to one layer_first layer."""
    item_size = _item_size(item_size)
    src_layout_dim = _layout_dim(src_layout_dim, "src_layout_dim", item_size)
    layer_id = ops._int(layer_id, "layer_id", 0)
    page_size = ops._int(page_size, "page_size", 1)
    head_num = ops._int(head_num, "head_num", 1)
    si, di = _indices(src_indices, dst_indices)
    src = _region_kv(src_k, src_v, "src", layout="page_head",
                     num_layers=src_layout_dim // item_size, item_size=item_size,
                     unit=src_layout_dim, page_size=page_size, head_num=head_num)
    dst = _region_kv(dst_k, dst_v, "dst", layout="layer_first", num_layers=1,
                     item_size=item_size, unit=item_size)
    _launch(src, dst, si, di, src_layer=layer_id, dst_layer=0, num_layers=1,
            gpu_backend="kernel")


def transfer_kv_all_layer(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices,
                          dst_indices, item_size, num_layers, block_quota=2,
                          num_warps_per_block=32):
    """Every layer, per-layer pointer tables on both sides (layer_first to layer_first)."""
    item_size = _item_size(item_size)
    si, di = _indices(src_indices, dst_indices)
    src, g1 = _table_region(src_k_layers, src_v_layers, "src", num_layers, item_size)
    dst, g2 = _table_region(dst_k_layers, dst_v_layers, "dst", num_layers, item_size)
    _launch(src, dst, si, di, src_layer=0, dst_layer=0, num_layers=src.num_layers,
            gpu_backend="kernel", extra_gpu=g1 or g2)


def transfer_kv_all_layer_lf_pf(src_k_layers, dst_k, src_v_layers, dst_v, src_indices,
                                dst_indices, item_size, dst_layout_dim, num_layers, block_quota=2,
                                num_warps_per_block=32):
    """Every layer, per-layer pointer tables to a page_first pool [tokens, L, item_size]."""
    item_size = _item_size(item_size)
    dst_layout_dim = _layout_dim(dst_layout_dim, "dst_layout_dim", item_size)
    num_layers = ops._int(num_layers, "num_layers", 1)
    _check_layers(num_layers, dst_layout_dim // item_size, "dst_layout_dim")
    si, di = _indices(src_indices, dst_indices)
    src, g = _table_region(src_k_layers, src_v_layers, "src", num_layers, item_size)
    dst = _region_kv(dst_k, dst_v, "dst", layout="page_first",
                     num_layers=dst_layout_dim // item_size, item_size=item_size,
                     unit=dst_layout_dim)
    _launch(src, dst, si, di, src_layer=0, dst_layer=0, num_layers=num_layers,
            gpu_backend="kernel", extra_gpu=g)


def transfer_kv_all_layer_lf_ph(src_k_layers, dst_k, src_v_layers, dst_v, src_indices,
                                dst_indices, item_size, dst_layout_dim, num_layers, page_size,
                                head_num, block_quota=2, num_warps_per_block=32):
    """Every layer, per-layer pointer tables to a page_head pool [pages, H, P, L, item_size/H]."""
    item_size = _item_size(item_size)
    dst_layout_dim = _layout_dim(dst_layout_dim, "dst_layout_dim", item_size)
    num_layers = ops._int(num_layers, "num_layers", 1)
    page_size = ops._int(page_size, "page_size", 1)
    head_num = ops._int(head_num, "head_num", 1)
    _check_layers(num_layers, dst_layout_dim // item_size, "dst_layout_dim")
    si, di = _indices(src_indices, dst_indices)
    src, g = _table_region(src_k_layers, src_v_layers, "src", num_layers, item_size)
    dst = _region_kv(dst_k, dst_v, "dst", layout="page_head",
                     num_layers=dst_layout_dim // item_size, item_size=item_size,
                     unit=dst_layout_dim, page_size=page_size, head_num=head_num)
    _launch(src, dst, si, di, src_layer=0, dst_layer=0, num_layers=num_layers,
            gpu_backend="kernel", extra_gpu=g)


# The MLA functions are the MHA ones with one buffer (v = None: MLA; argument names in messages
# follow, e.g. "src_layers" instead of "src_k_layers").

def transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size, block_quota=2,
                              num_warps_per_block=32):
    """MLA, one layer, layer_first to layer_first."""
    transfer_kv_per_layer(src, dst, None, None, src_indices, dst_indices, item_size)


def transfer_kv_per_layer_mla_pf_lf(src, dst, src_indices, dst_indices, layer_id, item_size,
                                    src_layout_dim, block_quota=2, num_warps_per_block=32):
    """MLA, layer layer_id of a page_first pool to one layer_first layer."""
    transfer_kv_per_layer_pf_lf(src, dst, None, None, src_indices, dst_indices, layer_id,
                                item_size, src_layout_dim)


def transfer_kv_all_layer_mla(src_layers, dst_layers, src_indices, dst_indices, item_size,
                              num_layers, block_quota=2, num_warps_per_block=32):
    """MLA, every layer, per-layer pointer tables on both sides."""
    transfer_kv_all_layer(src_layers, dst_layers, None, None, src_indices, dst_indices, item_size,
                          num_layers)


def transfer_kv_all_layer_mla_lf_pf(src_layers, dst, src_indices, dst_indices, item_size,
                                    dst_layout_dim, num_layers, block_quota=2,
                                    num_warps_per_block=32):
    """MLA, every layer, per-layer pointer tables to a page_first pool."""
    transfer_kv_all_layer_lf_pf(src_layers, dst, None, None, src_indices, dst_indices, item_size,
                                dst_layout_dim, num_layers)


def _check_layers(num_layers: int, pool_layers: int, dim_name: str) -> None:
    if num_layers > pool_layers:
        raise ValueError(f"num_layers = {num_layers} exceeds the {pool_layers} layers that "
                         f"{dim_name} describes")


# ---- direct functions (copy engines) ----------------------------------------------------------

def _rows(buf, name: str) -> Tuple[int, int]:
    """(rows, row bytes) of a per-layer tensor whose first dimension is the token."""
    if not buf.shape or buf.shape[0] <= 0:
        raise ValueError(f"{name} has shape {buf.shape}; expected [tokens, ...]")
    return buf.shape[0], buf.nbytes // buf.shape[0]


def _direct_indices(src_indices, dst_indices, page_size):
    page_size = ops._int(page_size, "page_size", 1)
    si, di = _indices(src_indices, dst_indices)
    if si.count % page_size != 0:
        raise ValueError(f"src_indices has {si.count} entries, not a multiple of "
                         f"page_size = {page_size}")
    # The copy engines are driven from the host: bring device indices over (as SGLang does).
    return _host_indices(si, "src_indices"), _host_indices(di, "dst_indices"), page_size


def _as_list(value: Any, name: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of tensors, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} is empty")
    return list(value)


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """Copy token rows between lists of per-layer tensors: src_layers[j] -> dst_layers[j]."""
    src_layers = _as_list(src_layers, "src_layers")
    dst_layers = _as_list(dst_layers, "dst_layers")
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"src_layers has {len(src_layers)} tensors but dst_layers has "
                         f"{len(dst_layers)}")
    si, di, _ = _direct_indices(src_indices, dst_indices, page_size)
    sb = [describe_buffer(t, f"src_layers[{j}]") for j, t in enumerate(src_layers)]
    db = [describe_buffer(t, f"dst_layers[{j}]") for j, t in enumerate(dst_layers)]
    row_bytes = []
    for j in range(len(sb)):
        _, s_row = _rows(sb[j], f"src_layers[{j}]")
        _, d_row = _rows(db[j], f"dst_layers[{j}]")
        if s_row != d_row:
            raise ValueError(f"src_layers[{j}] has {s_row}-byte rows but dst_layers[{j}] has "
                             f"{d_row}-byte rows")
        row_bytes.append(s_row)
    # Consecutive tensors with equal row sizes form one request (one region, one layer each).
    start = 0
    while start < len(sb):
        end = start + 1
        while end < len(sb) and row_bytes[end] == row_bytes[start]:
            end += 1
        group = range(start, end)
        src = ops.KvRegion(layout="layer_first", num_layers=len(group), slot_bytes=row_bytes[start],
                           k=[src_layers[j] for j in group], mla=True, name="src_layers")
        dst = ops.KvRegion(layout="layer_first", num_layers=len(group), slot_bytes=row_bytes[start],
                           k=[dst_layers[j] for j in group], mla=True, name="dst_layers")
        _launch(src, dst, si, di, src_layer=0, dst_layer=0, num_layers=len(group),
                gpu_backend="dma")
        start = end


def _page_first_direct(bufs: list, name: str, page_size: int) -> ops.KvRegion:
    """A page_first_direct region over [K, V] (or [buffer]) of shape [pages, L, P, ...]."""
    infos = [describe_buffer(b, f"{name}[{i}]") for i, b in enumerate(bufs)]
    first = infos[0]
    if len(first.shape) < 3:
        raise ValueError(f"{name}[0] has shape {first.shape}; a page_first_direct pool is "
                         "[pages, layers, page_size, ...]")
    pages, layers, p = first.shape[0], first.shape[1], first.shape[2]
    if p != page_size:
        raise ValueError(f"page_size = {page_size} does not match {name}[0].shape[2] = {p}")
    for i, b in enumerate(infos[1:], 1):
        if b.shape[:3] != first.shape[:3] or b.nbytes != first.nbytes:
            raise ValueError(f"{name}[{i}] has shape {b.shape} but {name}[0] has {first.shape}")
    if pages * layers * p == 0 or first.nbytes % (pages * layers * p) != 0:
        raise ValueError(f"{name}[0] of shape {first.shape} does not split into whole tokens")
    slot_bytes = first.nbytes // (pages * layers * p)
    return ops.KvRegion(layout="page_first_direct", num_layers=layers, slot_bytes=slot_bytes,
                        num_slots=pages * p, page_size=p, k=bufs[0],
                        v=bufs[1] if len(bufs) == 2 else None, mla=len(bufs) == 1, name=name)


def _per_layer(bufs: list, name: str, mla: bool) -> ops.KvRegion:
    if not mla and len(bufs) % 2 != 0:
        raise ValueError(f"{name} has {len(bufs)} tensors; an MHA pool passes K layers then V "
                         "layers (an even count)")
    n = len(bufs) if mla else len(bufs) // 2
    first = describe_buffer(bufs[0], f"{name}[0]")
    _, row = _rows(first, f"{name}[0]")
    return ops.KvRegion(layout="layer_first", num_layers=n, slot_bytes=row, k=bufs[:n],
                        v=None if mla else bufs[n:], mla=mla, name=name)


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id,
                                       page_size):
    """Layers [layer_id, layer_id + n) of a host page_first_direct pool ([K, V] or [buffer],
    each [pages, L, page_size, ...]) into per-layer tensors (n K layers then n V layers)."""
    src_ptrs = _as_list(src_ptrs, "src_ptrs")
    dst_ptrs = _as_list(dst_ptrs, "dst_ptrs")
    if len(src_ptrs) not in (1, 2):
        raise ValueError(f"src_ptrs has {len(src_ptrs)} tensors; expected [K, V] or [buffer] (MLA)")
    layer_id = ops._int(layer_id, "layer_id", 0)
    si, di, page_size = _direct_indices(src_indices, dst_indices, page_size)
    mla = len(src_ptrs) == 1
    src = _page_first_direct(src_ptrs, "src_ptrs", page_size)
    dst = _per_layer(dst_ptrs, "dst_ptrs", mla)
    _launch(src, dst, si, di, src_layer=layer_id, dst_layer=0, num_layers=dst.num_layers,
            gpu_backend="dma")


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size):
    """Every layer of per-layer tensors (L K layers then L V layers, or L MLA layers) into a host
    page_first_direct pool ([K, V] or [buffer], each [pages, L, page_size, ...])."""
    src_ptrs = _as_list(src_ptrs, "src_ptrs")
    dst_ptrs = _as_list(dst_ptrs, "dst_ptrs")
    if len(dst_ptrs) not in (1, 2):
        raise ValueError(f"dst_ptrs has {len(dst_ptrs)} tensors; expected [K, V] or [buffer] (MLA)")
    si, di, page_size = _direct_indices(src_indices, dst_indices, page_size)
    mla = len(dst_ptrs) == 1
    src = _per_layer(src_ptrs, "src_ptrs", mla)
    dst = _page_first_direct(dst_ptrs, "dst_ptrs", page_size)
    _launch(src, dst, si, di, src_layer=0, dst_layer=0, num_layers=src.num_layers,
            gpu_backend="dma")
