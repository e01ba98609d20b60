"""kvtier.HierarchicalCache — the engine-facing hierarchical KV cache (device + host tiers).

The engine brings its device KV pool as a layer_first kvtier.ops.KvRegion; the cache owns the
allocation of that pool's pages, a pinned host tier, the radix tree over both, and the copies:

    cache = kvtier.HierarchicalCache(device_pool, transfer_backend="kernel")
    with cache.match(tokens) as m:               # cached prefix; pinned until the block ends
        loaded = cache.load_back(m)              # host hits -> fresh device slots
        for layer in range(L):
            cache.wait_layer(m, layer)           # current stream waits for that layer (GPU)
            ...                                  # attention over loaded.device_slots
        new = cache.allocate_device_slots(len(tokens) - m.device_tokens - loaded.loaded_tokens)
        ...                                      # prefill writes the KV of the new tokens
        cache.insert(tokens, slots)              # the cache owns the slots from now on

Tokens are int32 (lists, numpy arrays, torch tensors); slot lists come back as int64 torch tensors
(CPU) when torch is imported, else numpy arrays (or array.array without numpy). Streams default to
PyTorch's current stream of the pool's device, else the legacy default stream. The C++
HierarchicalCache has no storage tier or Prefetch yet, so neither has this class.

Thread safety: every method may be called from any thread (the C++ cache serialises its
bookkeeping and copies run with the GIL released).
"""

from __future__ import annotations

import array
import sys
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from . import _kvtier
from ._buffers import HOST, resolve_stream
from .ops import KvRegion, _int

__all__ = ["HierarchicalCache", "Match", "LoadBack"]


def _slots_from_bytes(data: bytes) -> Any:
    """int64 slots as a torch tensor (torch imported), a numpy array, or an array.array."""
    values = array.array("q")
    values.frombytes(data)
    torch = sys.modules.get("torch")
    if torch is not None:
        if len(values) == 0:
            return torch.empty(0, dtype=torch.int64)
        return torch.frombuffer(values, dtype=torch.int64).clone()
    try:
        import numpy as np
    except ImportError:
        return values
    return np.frombuffer(values, dtype=np.int64).copy()


def _host_array(obj: Any, name: str, typecode: str) -> Tuple[int, int, Any]:
    """(address, count, keepalive) of `obj` as contiguous host int32 ('i') / int64 ('q')."""
    if obj is None:
        raise ValueError(f"{name} is None")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(obj.shape)}")
        if obj.is_floating_point() or obj.is_complex() or obj.dtype == torch.bool:
            raise ValueError(f"{name} has dtype {obj.dtype}; expected integers")
        want = torch.int32 if typecode == "i" else torch.int64
        t = obj.detach().to(device="cpu", dtype=want).contiguous()
        return t.data_ptr(), t.numel(), t
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__cuda_array_interface__"):
        import numpy as np

        a = np.asarray(obj)
        if a.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
        if a.dtype.kind not in "iu":
            raise ValueError(f"{name} has dtype {a.dtype}; expected integers")
        want = np.int32 if typecode == "i" else np.int64
        if a.size and (a.min() < np.iinfo(want).min or a.max() > np.iinfo(want).max):
            raise ValueError(f"{name} has values outside {np.dtype(want).name}")
        a = np.ascontiguousarray(a, dtype=want)
        return a.ctypes.data, a.size, a
    try:
        values = array.array(typecode, obj)
    except (TypeError, OverflowError) as e:
        raise ValueError(f"{name} must be a sequence of {'int32' if typecode == 'i' else 'int64'} "
                         f"values ({e})") from None
    address, count = values.buffer_info()
    return address, count, values


@dataclass
class Match:
    """The cached prefix of a token sequence. Pinned until released (or the `with` block ends)."""

    handle: int
    device_tokens: int  # leading tokens whose KV is on the device ...
    device_slots: Any   # ... at these device slots
    host_tokens: int    # the next tokens, cached in host memory only ...
    host_slots: Any     # ... at these host slots
    _cache: Any = None

    def release(self) -> None:
        if self._cache is not None:
            cache, self._cache = self._cache, None
            cache.release(self)

    def __enter__(self) -> "Match":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


@dataclass
class LoadBack:
    loaded_tokens: int   # copied from host memory by this call
    skipped_tokens: int  # host hits left alone (below load_back_min_tokens)
    device_slots: Any    # the whole matched prefix now on the device


class HierarchicalCache:
    """The hierarchical KV cache over an engine's device pool (see the module docstring).

    Args (keyword-only, defaults as in the C++ HierarchicalCacheConfig):
      device_region: a layer_first kvtier.ops.KvRegion (device memory with the kernel/dma/auto
        backends; host memory with cpu, e.g. for tests).
      page_size: 0 = the region's.  host_capacity_bytes / host_ratio: host tier size.
      host_layout: "page_first" | "page_first_direct" | "page_head" | "layer_first".
      write_policy: "write_through" | "write_through_selective" | "write_back".
      device_eviction / host_eviction: "lru" | "lfu" | "fifo" | "priority".
      transfer_backend: "cpu" | "kernel" | "dma" | "auto" (default: cpu for a host region, kernel
        for a device region).
      max_sms / max_sms_to_host: the kernel backend's SMs for loads / for backups (write-backs);
        max_sms_to_host 0 = max_sms.
      max_sms_beside_backup: the SMs for a load while a write-back is still running (0 = off).
    """

    def __init__(self, device_region: KvRegion, *, page_size: int = 0,
                 host_capacity_bytes: int = 0, host_ratio: float = 2.0,
                 host_layout: str = "page_first", host_head_num: int = 0,
                 host_huge_pages: bool = False, write_policy: str = "write_through_selective",
                 write_through_threshold: int = 2, device_eviction: str = "lru",
                 host_eviction: str = "lru", transfer_backend: Optional[str] = None,
                 max_sms: int = 4, max_sms_to_host: int = 3, max_sms_beside_backup: int = 8,
                 cpu_threads: int = 0,
                 backup_threads: int = 1,
                 load_back_min_tokens: int = 0) -> None:
        if not isinstance(device_region, KvRegion):
            raise ValueError("device_region must be a kvtier.ops.KvRegion, not "
                             f"{type(device_region).__name__}")
        if transfer_backend is None:
            transfer_backend = "cpu" if device_region.device == HOST else "kernel"
        self._region = device_region  # the C++ cache refers to its buffers and tables
        self._device = device_region.device
        self._native = _kvtier._HierarchicalCache(
            device_region._native, page_size=_int(page_size, "page_size", 0),
            host_capacity_bytes=_int(host_capacity_bytes, "host_capacity_bytes", 0),
            host_ratio=float(host_ratio), host_layout=host_layout,
            host_head_num=_int(host_head_num, "host_head_num", 0),
            host_huge_pages=bool(host_huge_pages), write_policy=write_policy,
            write_through_threshold=_int(write_through_threshold, "write_through_threshold", 0),
            device_eviction=device_eviction, host_eviction=host_eviction,
            transfer_backend=transfer_backend, max_sms=_int(max_sms, "max_sms", 1),
            max_sms_to_host=_int(max_sms_to_host, "max_sms_to_host", 0),
            max_sms_beside_backup=_int(max_sms_beside_backup, "max_sms_beside_backup", 0),
            cpu_threads=_int(cpu_threads, "cpu_threads", 0),
            backup_threads=_int(backup_threads, "backup_threads", 0),
            load_back_min_tokens=_int(load_back_min_tokens, "load_back_min_tokens", 0))

    # ---- the request path ------------------------------------------------------------------

    def match(self, tokens: Any, namespace: str = "") -> Match:
        """The longest cached page-aligned prefix of `tokens`; always a live handle to release."""
        address, count, keep = _host_array(tokens, "tokens", "i")
        handle, dev_tokens, dev_slots, host_tokens, host_slots = self._native.match(
            address, count, namespace)
        del keep
        return Match(handle, dev_tokens, _slots_from_bytes(dev_slots), host_tokens,
                     _slots_from_bytes(host_slots), self)

    def load_back(self, match: Match, stream: Any = None) -> LoadBack:
        """Copies the host part of `match` into fresh device slots (all or nothing; MemoryError
        when the device cannot make room). GPU: enqueued on `stream`; wait per layer."""
        loaded, skipped, slots = self._native.load_back(self._handle(match),
                                                        self._stream(stream))
        return LoadBack(loaded, skipped, _slots_from_bytes(slots))

    def wait_layer(self, match: Match, layer: int, stream: Any = None) -> None:
        """Makes `stream` wait (on the device) until `layer` of the match's last load_back is in
        place. Returns at once on the cpu backend."""
        self._native.wait_layer(self._handle(match), _int(layer, "layer", 0),
                                self._stream(stream))

    def release(self, match: Any) -> None:
        """Unpins a match (a Match or its handle id)."""
        if isinstance(match, Match):
            match._cache = None
        self._native.release(self._handle(match))

    def allocate_device_slots(self, num_tokens: int) -> Any:
        """Slots for num_tokens new tokens (rounded up to whole pages), evicting if needed."""
        return _slots_from_bytes(self._native.allocate_device_slots(
            _int(num_tokens, "num_tokens")))

    def free_device_slots(self, slots: Any) -> None:
        """Returns engine-held pages (whole pages)."""
        address, count, keep = _host_array(slots, "slots", "q")
        self._native.free_device_slots(address, count)
        del keep

    def insert(self, tokens: Any, device_slots: Any, namespace: str = "",
               priority: int = 0, stream: Any = None) -> dict:
        """Caches `tokens` whose KV the engine wrote into `device_slots` (one per token, whole
        pages); the cache owns the slots afterwards. GPU: backups of these slots are ordered
        after the work queued so far on `stream` (default: the current stream), where the engine
        wrote the KV. Returns the token counts by kind."""
        t_addr, t_count, t_keep = _host_array(tokens, "tokens", "i")
        s_addr, s_count, s_keep = _host_array(device_slots, "device_slots", "q")
        result = self._native.insert(t_addr, t_count, s_addr, s_count, namespace,
                                     _int(priority, "priority"), self._stream(stream))
        del t_keep, s_keep
        return result

    # ---- maintenance -----------------------------------------------------------------------

    def evict_device(self, num_tokens: int) -> int:
        return self._native.evict_device(_int(num_tokens, "num_tokens"))

    def evict_host(self, num_tokens: int) -> int:
        return self._native.evict_host(_int(num_tokens, "num_tokens"))

    def wait_for_backups(self) -> None:
        self._native.wait_for_backups()

    def stats(self) -> dict:
        return self._native.stats()

    def check_consistency(self) -> None:
        """Raises kvtier.InternalError naming the first broken invariant."""
        self._native.check_consistency()

    @property
    def page_size(self) -> int:
        return self._native.page_size()

    @property
    def backend(self) -> str:
        return self._native.backend()

    @property
    def host_geometry(self) -> dict:
        return self._native.host_geometry()

    def close(self) -> None:
        """Waits for copies in flight and frees the host tier. Later calls raise."""
        self._native.close()

    def __enter__(self) -> "HierarchicalCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _handle(match: Any) -> int:
        if isinstance(match, Match):
            return match.handle
        return _int(match, "match", 0)

    def _stream(self, stream: Any) -> int:
        if self._device == HOST:
            return 0 if stream is None else resolve_stream(stream, HOST)
        return resolve_stream(stream, self._device)
