"""kvtier as SGLang HiCache's storage tier (L3): a subclass of SGLang's own ``HiCacheStorage``.

Loaded by SGLang's ``StorageBackendFactory`` at run time (no fork of SGLang)::

    --enable-hierarchical-cache \\
    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
    '{"backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
      "class_name": "KvtierHiCacheStorage", "interface_v1": 1, "url": "file:///mnt/kv"}'

SGLang builds it as ``KvtierHiCacheStorage(storage_config, kwargs)``, then calls
``register_mem_pool_host(host_pool)``, which opens the store: a ``kvtier.PageStore`` whose
namespace is the host pool's geometry (model, KV dtype, layout, layers, bytes per token, page
size, heads, TP rank and size), so pages of another deployment are never read.

The zero-copy interface (``"interface_v1": 1``, SGLang's ``_page_get_zero_copy`` /
``_page_set_zero_copy``): ``batch_get_v1`` / ``batch_set_v1`` take SGLang's page keys and host
token indices; the page addresses come from the pool (``pages.HostPoolPages``: SGLang's
``get_page_buffer_meta``, vectorised) and kvtier's I/O threads move the bytes straight between
the host pool and the store in C++, with the GIL released: no per-page Python, no torch copy.
``batch_exists`` is one kvtier Exists of the leading run. The copying interface (``get``,
``set``, ``batch_get``, ``batch_set``, ``exists``: flat page tensors) is served too, in place
from the tensors' memory.

Failures: a page the store cannot give or take (absent, corrupt, another namespace, timed out,
I/O error, no space, a store that is down) is ``False`` (a miss); ``batch_exists`` counts the
leading pages present. After construction no method raises and none returns None: SGLang calls
them on its prefetch and backup threads, which an exception kills for the life of the process.
A bad argument (host indices outside the pool, a tensor of the wrong size) is logged at error
level, naming the problem, and its pages are False.

Tensor parallelism (SGLang's conventions): an MHA rank holds its own heads, so each rank has its
own namespace (tp_rank, tp_size): a store written at one TP size is a clean miss at another. An
MLA rank holds the whole latent KV, so the namespace has no rank (any TP size reads it) and only
TP rank 0 writes (SGLang's controller skips the others' backups; a direct ``batch_set_v1`` on
another rank writes nothing and reports success, the pages being rank 0's to write). Pipeline
and context parallel ranks hold different pages: their rank and size are part of the model's
name in the namespace.

Host layouts: every one of SGLang's (page_first, page_first_direct, page_head, and its default
layer_first, whose page is one piece per layer and buffer: kvtier.PageStore gathers / scatters
the pieces in C++ through reusable staging memory). Pages written by ``batch_set_v1`` carry their
parents (the page before each one), so file:// and memory:// evict a prefix's tail first.

Not supported (a clear error at start): heads split across TP sizes
(``tp_lcm_size``, SGLang's page_head split), and SGLang's v2 hybrid-pool interface
(``batch_get_v2`` / ``batch_set_v2`` / ``batch_exists_v2``: Mamba, SWA, DSA side pools), which
stays SGLang's NotImplementedError.

Thread safety: SGLang calls the methods from its scheduler, prefetch and backup threads at once;
the store (kvtier.PageStore) is thread-safe and the object is immutable after
``register_mem_pool_host``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, List, Optional

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

import kvtier

from .config import BackendConfig, parse_extra_config
from .pages import HostPoolPages

logger = logging.getLogger(__name__)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


class KvtierHiCacheStorage(HiCacheStorage):
    """SGLang HiCache storage backend on a kvtier store (file://, redis://, redis+cluster://)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        if getattr(storage_config, "should_split_heads", False):
            raise NotImplementedError(
                "kvtier SGLang backend: heads split across TP sizes (tp_lcm_size with the "
                "page_head layout) is not supported; drop tp_lcm_size")
        self.storage_config = storage_config
        self.config: BackendConfig = parse_extra_config(storage_config.extra_config,
                                                        storage_config.model_name)
        self.is_mla = bool(storage_config.is_mla_model)
        # SGLang's rule: for MLA only TP rank 0 backs pages up (cache_controller.backup_skip).
        self.writes = not (self.is_mla and storage_config.tp_rank != 0)
        self.store: Optional[kvtier.PageStore] = None
        self.pages: Optional[HostPoolPages] = None
        self._metrics_lock = threading.Lock()
        self._metrics = ([], [], [], [])  # prefetch pages, backup pages, prefetch GB/s, backup GB/s

    # ---- opening ------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Opens the store for this host pool's geometry. Raises (at SGLang's start) for a host
        pool kvtier cannot serve or a storage option out of bounds, naming it."""
        super().register_mem_pool_host(mem_pool_host)
        cfg, sc = self.config, self.storage_config
        mla = self.is_mla
        if hasattr(mem_pool_host, "kv_cache_dim") != mla:
            raise ValueError(f"kvtier SGLang backend: storage_config.is_mla_model is {mla} but "
                             f"the host pool is {type(mem_pool_host).__name__}")
        if mla:
            slot_bytes = int(mem_pool_host.kv_cache_dim) * mem_pool_host.dtype.itemsize
            head_num, tp_rank, tp_size = 1, 0, 1
        else:
            head_num = int(mem_pool_host.head_num)
            slot_bytes = head_num * int(mem_pool_host.head_dim) * mem_pool_host.dtype.itemsize
            tp_rank, tp_size = int(sc.tp_rank), int(sc.tp_size)
        model_id = cfg.model_id
        if getattr(sc, "pp_size", 1) > 1:
            model_id += f"|pp{sc.pp_rank}/{sc.pp_size}"
        if getattr(sc, "attn_cp_size", 1) > 1:
            model_id += f"|cp{sc.attn_cp_rank}/{sc.attn_cp_size}"
        device_pool = getattr(mem_pool_host, "device_pool", None)
        kv_dtype = _dtype_name(getattr(device_pool, "dtype", mem_pool_host.dtype))
        store = kvtier.PageStore(
            cfg.url, model_id=model_id, kv_dtype=kv_dtype, layout=mem_pool_host.layout, mla=mla,
            num_layers=int(mem_pool_host.layer_num), slot_bytes=int(slot_bytes),
            page_size=int(mem_pool_host.page_size), head_num=head_num, tp_rank=tp_rank,
            tp_size=tp_size, **cfg.storage_options)
        try:
            pages = HostPoolPages(mem_pool_host, store.page_bytes, store.num_buffers)
        except Exception:
            store.close()
            raise
        if self.store is not None:
            self.store.close()
        self.store, self.pages = store, pages
        logger.info("kvtier SGLang backend: %s, namespace %s, %d-byte pages%s", store.url,
                    store.namespace_name, store.page_bytes,
                    "" if self.writes else " (MLA: TP rank 0 writes, this rank reads)")

    def close(self) -> None:
        """Waits for calls in flight and closes the store (SGLang calls it at detach)."""
        if self.store is not None:
            self.store.close()

    # ---- the zero-copy interface ----------------------------------------------------------------

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """The number of leading keys the store holds (0 on any failure)."""
        if not keys:
            return 0
        try:
            return int(self._open_store().exists_prefix(keys))
        except Exception as e:  # never out of SGLang's prefetch thread
            logger.error("kvtier SGLang backend: batch_exists of %d keys failed: %s", len(keys), e)
            return 0

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Reads each key's page into the host pool at its indices; False where it failed."""
        return self._page_io("get", keys, host_indices)

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Writes the host pool's pages at the indices under the keys; False where it failed."""
        if not self.writes:
            return [True] * len(keys)
        return self._page_io("set", keys, host_indices, _parents(keys, extra_info))

    def _page_io(self, op: str, keys: List[str], host_indices, parents=None) -> List[bool]:
        n = len(keys)
        if n == 0:
            return []
        start = time.perf_counter()
        try:
            store = self._open_store()
            addrs = self.pages.addresses(host_indices, n)
            stride = self.pages.layer_stride
            ok = (store.get(keys, addrs, layer_stride=stride) if op == "get" else
                  store.set(keys, addrs, parents, layer_stride=stride))
        except Exception as e:  # never out of SGLang's prefetch / backup thread
            logger.error("kvtier SGLang backend: batch_%s_v1 of %d pages failed: %s", op, n, e)
            return [False] * n
        if self.storage_config.enable_storage_metrics:
            self._record(op, sum(ok), time.perf_counter() - start)
        return ok

    # ---- the copying interface (flat page tensors) ---------------------------------------------

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        """Reads the page into target_location (a flat CPU page tensor); None when absent."""
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        if not keys:
            return []
        try:
            addrs = self._tensor_addrs(keys, target_locations)
            ok = self._open_store().get(keys, addrs)
        except Exception as e:
            logger.error("kvtier SGLang backend: batch_get of %d pages failed: %s", len(keys), e)
            return [None] * len(keys)
        return [t if good else None for t, good in zip(target_locations, ok)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        """Writes the flat page tensor `value` under key."""
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """True when every page was written."""
        if not keys:
            return True
        if not self.writes:
            return True
        try:
            addrs = self._tensor_addrs(keys, values)
            return all(self._open_store().set(keys, addrs))
        except Exception as e:
            logger.error("kvtier SGLang backend: batch_set of %d pages failed: %s", len(keys), e)
            return False

    def exists(self, key: str) -> bool:
        try:
            return bool(self._open_store().exists([key])[0])
        except Exception as e:
            logger.error("kvtier SGLang backend: exists failed: %s", e)
            return False

    def _tensor_addrs(self, keys, tensors) -> np.ndarray:
        store = self._open_store()
        if tensors is None or len(tensors) != len(keys):
            raise ValueError(f"{len(keys)} keys need as many page tensors, got "
                             f"{'none' if tensors is None else len(tensors)}")
        addrs = np.empty(len(keys), dtype=np.int64)
        for i, t in enumerate(tensors):  # the copying interface: one tensor per page
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu" \
                    or not t.is_contiguous() or t.numel() * t.element_size() != store.page_bytes:
                raise ValueError(f"page tensor {i} must be a contiguous CPU tensor of "
                                 f"{store.page_bytes} bytes, not {_describe(t)}")
            addrs[i] = t.data_ptr()
        return addrs

    # ---- housekeeping -------------------------------------------------------------------------

    def clear(self) -> bool:
        """Removes this deployment's pages (this namespace's: other deployments sharing the store
        keep theirs) from a file:// or memory:// store; True when done. A store that cannot list
        a namespace's pages (redis://) deletes nothing: False, logged. MLA: TP rank 0's pages
        are every rank's, so only rank 0 removes them (the others return True)."""
        if not self.writes:
            return True
        try:
            removed = self._open_store().clear()
        except Exception as e:  # never out of SGLang's threads
            logger.warning("kvtier SGLang backend: clear() deleted nothing: %s (empty a Redis "
                           "store by flushing its database)", e)
            return False
        logger.info("kvtier SGLang backend: clear() removed %d pages of %s", removed,
                    self.store.namespace_name)
        return True

    def get_stats(self):
        """SGLang's StorageMetrics of the calls since the last get_stats (with
        --enable-metrics and a storage backend), else None."""
        if not self.storage_config.enable_storage_metrics:
            return None
        from sglang.srt.observability.metrics_collector import StorageMetrics

        with self._metrics_lock:
            lists, self._metrics = self._metrics, ([], [], [], [])
        m = StorageMetrics()
        m.prefetch_pgs.extend(lists[0])
        m.backup_pgs.extend(lists[1])
        m.prefetch_bandwidth.extend(lists[2])
        m.backup_bandwidth.extend(lists[3])
        return m

    def kvtier_stats(self) -> dict:
        """kvtier's own counters of the store (kvtier::StorageStats)."""
        return self._open_store().stats()

    def _record(self, op: str, pages_ok: int, seconds: float) -> None:
        gbps = pages_ok * self.store.page_bytes / max(seconds, 1e-9) / 1e9
        with self._metrics_lock:
            pgs, bw = (0, 2) if op == "get" else (1, 3)
            self._metrics[pgs].append(pages_ok)
            self._metrics[bw].append(gbps)

    def _open_store(self) -> kvtier.PageStore:
        if self.store is None:
            raise RuntimeError("register_mem_pool_host was not called: no host pool, no store")
        return self.store


def _parents(keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo]) -> list:
    """Each page's parent key for PageStore.set: batch_set_v1 gets consecutive pages of one
    prefix (SGLang's backup walks a node's pages in order), so keys[i]'s parent is keys[i - 1];
    the first page's is the last of extra_info.prefix_keys when SGLang gives them, else unknown."""
    prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
    first = prefix[-1] if prefix else None
    return [first] + list(keys[:-1])


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return (f"a {t.device.type} tensor of {t.numel() * t.element_size()} bytes"
                f"{'' if t.is_contiguous() else ', not contiguous'}")
    return type(t).__name__
