"""kvtier.HierarchicalCache — the engine-facing hierarchical KV cache: device, host and storage.

The engine brings its device KV pool as a layer_first kvtier.ops.KvRegion; the cache owns the
allocation of that pool's pages, a pinned host tier, optionally a storage tier (a URL), the radix
tree over all three, and the copies between them:

    cache = kvtier.HierarchicalCache(device_pool, transfer_backend="kernel",
                                     storage="file:///var/cache/kvtier", prefetch_policy="timeout")
    with cache.match(tokens) as m:               # cached prefix; pinned until the block ends
        cache.query_storage(m)                   # pages other processes or earlier runs stored
        cache.prefetch(m)                        # storage -> host, in the background
        loaded = cache.load_back(m)              # ends the prefetch; host hits -> device slots
        for layer in range(L):
            cache.wait_layer(m, layer)           # current stream waits for that layer (GPU)
            ...                                  # attention over loaded.device_slots
        new = cache.allocate_device_slots(len(tokens) - len(loaded.device_slots))
        ...                                      # prefill writes the KV of the new tokens
        cache.insert(tokens, slots)              # the cache owns the slots from now on
    print(cache.metrics())                       # Prometheus text (SGLang's names, "kvtier:")

Tokens are int32 (lists, numpy arrays, torch tensors); slot lists come back as int64 torch tensors
when torch is imported, else numpy arrays (or array.array without numpy). Device slot lists of a
pool on a GPU are on that GPU, copied there through pinned memory on the current stream of that
GPU without waiting for it (`slots_on_device=False` keeps them in host memory); host slot lists
are in host memory. A Match makes its slot lists on first use of device_slots / host_slots.
Streams default to PyTorch's current stream of the pool's device, else the legacy default stream.

Engine streams: cache.release(m, stream=s) and cache.free_device_slots(slots, stream=s) hand the
slots back only after the work queued on `s` so far has completed (the engine may still read
them there): the release is parked behind a CUDA event and carried out by a later call once the
event has completed (or waited for when the device would otherwise run out of pages).
load_back(m, stream=s, after=[a, b]) enqueues the copies on `s` after the work queued on `s` and
on `a`, `b` (streams where the engine wrote into slots the load may reuse).

Settings: every field of the C++ HierarchicalCacheConfig is a keyword argument of the same name
(storage fields prefixed "storage_" where needed), default and bounds read from the C++ struct:
kvtier.HierarchicalCache.config_fields() lists them.

Retention: cache.pin(tokens, tiers=("device", "host", "storage"), ttl=3600) keeps the longest
cached prefix of `tokens` (what is cached now; pin again to cover more) from being evicted from
those tiers until cache.unpin(pin) or the TTL ends (None: until unpin). Each tier has a budget of
pinned tokens (pin_device_budget_tokens, pin_host_budget_tokens, pin_storage_budget_tokens;
0: no pins there): a pin beyond it raises ValueError and changes nothing.

Match handles cannot leak: a Match releases its handle when it is garbage collected, when its
`with` block ends, or through cache.release(m); a Match of another cache is refused.

Thread safety: every method may be called from any thread; every call that can block releases
the GIL. close() refuses new calls, waits for the calls in flight to return and then frees the
cache; calls after it raise kvtier.FailedPreconditionError.
"""

from __future__ import annotations

import array
import ctypes
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Tuple

from . import _kvtier
from ._buffers import HOST, resolve_stream
from ._cache_fields import CONFIG_FIELDS, FIELDS_BY_NAME
from .ops import KvRegion, _check_settings, _int
from .tp import TpGroup

__all__ = ["HierarchicalCache", "Match", "LoadBack", "Prefetch", "StorageQuery", "Pin",
           "PREFETCH_POLICIES", "CACHE_TIERS"]

PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
CACHE_TIERS = ("device", "host", "storage")

_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1


def _int64(value: Any, name: str, minimum: Optional[int] = None) -> int:
    """An int that fits int64_t (ValueError naming `name` otherwise)."""
    value = _int(value, name, minimum)
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise ValueError(f"{name} = {value} does not fit in a 64-bit signed integer")
    return value


def _int32(value: Any, name: str, minimum: Optional[int] = None) -> int:
    """An int that fits int32_t (ValueError naming `name` otherwise)."""
    value = _int(value, name, minimum)
    if not -_INT32_MAX - 1 <= value <= _INT32_MAX:
        raise ValueError(f"{name} = {value} does not fit in a 32-bit signed integer")
    return value


# The cache's settings, read from the C++ HierarchicalCacheConfig schema (_cache_fields.py).
_CONFIG_FIELDS = CONFIG_FIELDS
_FIELDS_BY_NAME = FIELDS_BY_NAME


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
    # Only ordered sequences of ints: array.array would take a set or dict (unordered: their
    # iteration is no token list) and reinterpret bytes as raw machine integers.
    if isinstance(obj, (str, bytes, bytearray, memoryview, set, frozenset, dict)) or \
            not isinstance(obj, (list, tuple, range, array.array)):
        raise ValueError(f"{name} must be a list, tuple or range of integers, or a 1-D integer "
                         f"array or tensor, not {type(obj).__name__}")
    if typecode == "i" and isinstance(obj, (list, tuple)):
        values = array.array("i")  # one C pass (array.array(list) is several times slower)
        values.frombytes(_kvtier.int32_tokens(obj, name))
        address, count = values.buffer_info()
        return address, count, values
    try:
        values = array.array(typecode, obj)
    except (TypeError, OverflowError) as e:
        raise ValueError(f"{name} must be a sequence of {'int32' if typecode == 'i' else 'int64'} "
                         f"values ({e})") from None
    address, count = values.buffer_info()
    return address, count, values


class Match:
    """The cached prefix of a token sequence, pinned until released.

    Released by cache.release(m), m.release(), the end of its `with` block, or when the object is
    garbage collected (so a forgotten match never pins the prefix for ever). Releasing twice
    through m.release() is a no-op.
    """

    def __init__(self, owner: "HierarchicalCache", handle: int, device_tokens: int,
                 device_slots: bytes, host_tokens: int, host_slots: bytes,
                 storage_tokens: int) -> None:
        self.handle = handle
        self.device_tokens = device_tokens    # leading tokens whose KV is on the device ...
        self.host_tokens = host_tokens        # the next tokens, cached in host memory ...
        self.storage_tokens = storage_tokens  # the next tokens, known to be in storage only
        self._owner = owner
        # The slot lists as the native call returned them (int64 bytes), made into tensors /
        # arrays on first use: a request that goes on to load_back never pays for them.
        self._device_data = device_slots
        self._host_data = host_slots
        self._pinned = True

    @property
    def device_slots(self) -> Any:
        """The device slots of the device_tokens (on the pool's GPU, see the module docstring)."""
        slots = self.__dict__.get("_device_slots")
        if slots is None:
            slots = self._device_slots = self._owner._device_slots(self._device_data)
        return slots

    @property
    def host_slots(self) -> Any:
        """The host slots of the host_tokens (host memory)."""
        slots = self.__dict__.get("_host_slots")
        if slots is None:
            slots = self._host_slots = _slots_from_bytes(self._host_data)
        return slots

    @property
    def released(self) -> bool:
        return not self.__dict__.get("_pinned", False)

    def _unpin(self) -> bool:
        """True for the one caller that unpins it (dict.pop is atomic under the GIL)."""
        return self.__dict__.pop("_pinned", False)

    def release(self) -> None:
        if self._unpin():
            self._owner._release_handle(self.handle)

    def __enter__(self) -> "Match":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            if self._unpin():
                self._owner._release_handle(self.handle)
        except Exception:  # the cache is closed (handles dropped) or the interpreter is exiting
            pass

    def __repr__(self) -> str:
        return (f"Match(handle={self.handle}, device_tokens={self.device_tokens}, "
                f"host_tokens={self.host_tokens}, storage_tokens={self.storage_tokens}, "
                f"released={self.released})")


@dataclass
class Prefetch:
    """A prefetch's progress or outcome (storage -> host)."""

    state: str             # "none", "running", "complete", "partial", "timed_out"
    policy: str            # "best_effort", "wait_complete", "timeout"
    requested_tokens: int  # storage tokens the prefetch asked for
    arrived_tokens: int    # leading tokens in host memory so far / at the end
    host_tokens: int       # after it ended: the match's host part (host hits incl. arrived)


@dataclass
class StorageQuery:
    storage_tokens: int  # tokens after the host part found in storage (tree + backend)
    queried_tokens: int  # of those, found by asking the backend in this call


@dataclass
class LoadBack:
    loaded_tokens: int   # copied from host memory by this call
    skipped_tokens: int  # host hits left alone (below load_back_min_tokens)
    device_slots: Any    # the whole matched prefix now on the device
    prefetch: Optional[Prefetch] = field(default=None)  # the prefetch this call ended, if any


@dataclass
class Pin:
    """A pin made by HierarchicalCache.pin; end it with cache.unpin(pin) (or let its TTL run
    out). id 0: nothing of the tokens was cached, nothing is pinned."""

    id: int             # the pin's handle (0: none)
    pinned_tokens: int  # the leading tokens it covers: the longest prefix cached when pinned
    # "storage" named: the store also keeps the pages from its own eviction (file://, memory://;
    # False for Redis, whose maxmemory policy decides).
    store_pinned: bool


def _prefetch(d: dict) -> Prefetch:
    return Prefetch(d["state"], d["policy"], d["requested_tokens"], d["arrived_tokens"],
                    d["host_tokens"])


class HierarchicalCache:
    """The hierarchical KV cache over an engine's device pool (see the module docstring).

    Args:
      device_region: a layer_first kvtier.ops.KvRegion (device memory with the kernel/dma/auto
        backends; host memory with cpu, e.g. for tests).
      transfer_backend: "cpu" | "kernel" | "dma" | "auto"; default cpu for a host region, kernel
        for a device region.
      shared_host: the name of a shared host segment (`kvtier shm create NAME`) to use as the host
        tier, shared with other processes; not with `storage`. None = the cache's own host pool.
      slots_on_device: device slot lists of a GPU pool come back on its GPU (default); False keeps
        them in host memory.
      **settings: any field of config_fields() (the C++ HierarchicalCacheConfig, same names,
        defaults and bounds), e.g. host_ratio=2.0, write_policy="write_through",
        storage="file:///var/cache/kvtier", max_backup_batch_pages=256. An unknown name or a
        value out of bounds is a ValueError naming it.
    """

    def __init__(self, device_region: KvRegion, *, transfer_backend: Optional[str] = None,
                 shared_host: Optional[str] = None, slots_on_device: bool = True,
                 tp_group: Any = None, **settings: Any) -> None:
        if not isinstance(device_region, KvRegion):
            raise ValueError("device_region must be a kvtier.ops.KvRegion, not "
                             f"{type(device_region).__name__}")
        if transfer_backend is None:
            transfer_backend = "cpu" if device_region.device == HOST else "kernel"
        settings["transfer_backend"] = transfer_backend
        if shared_host is not None and (not isinstance(shared_host, str) or not shared_host):
            raise ValueError(f"shared_host = {shared_host!r} must be a segment name or None")
        tp = None
        if tp_group is not None:
            if not isinstance(tp_group, TpGroup):
                raise ValueError(f"tp_group must be a kvtier.TpGroup, not {type(tp_group).__name__}")
            if tp_group.rank != 0:
                raise ValueError(f"tp_group.rank = {tp_group.rank}: only rank 0 (the leader) runs "
                                 "the cache; other ranks create a kvtier.TpFollower")
            if shared_host is not None:
                raise ValueError("shared_host is not supported in a TP group")
            tp = tp_group._native()
        config = _check_settings(_FIELDS_BY_NAME, settings, "HierarchicalCache")
        self._device = device_region.device
        self._slots_device = None
        if slots_on_device and self._device != HOST and "torch" in sys.modules:
            self._slots_device = sys.modules["torch"].device("cuda", self._device)
        # The native object keeps the region (its buffers) alive until the C++ cache is gone.
        self._native = _kvtier._HierarchicalCache(device_region, device_region._native, config,
                                                   shared_host or "", tp)
        self.tp_group = tp_group

    @staticmethod
    def create_shared_host(name: str, *, num_layers: int, slot_bytes: int, page_size: int,
                           pages: int, layout: str = "page_first", head_num: int = 1,
                           mla: bool = False, max_processes: int = 64) -> dict:
        """Creates the shared host segment `name` (as `kvtier shm create`): `pages` pages of
        `page_size` tokens, each token `slot_bytes` per layer and buffer (K and V, or one buffer
        with mla). Caches in any process of this machine then attach it with shared_host=name; a
        cache's device pool must have the same num_layers, slot_bytes, page_size and mla.
        FailedPreconditionError when it exists; returns {name, path, num_pages, page_bytes,
        segment_bytes}. The segment stays until destroy_shared_host(name) (or a reboot)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name = {name!r} must be a segment name")
        if layout not in ("layer_first", "page_first", "page_first_direct", "page_head"):
            raise ValueError(f"layout = {layout!r} is not a kvtier layout")
        return dict(_kvtier.shm_create(
            name, layout, _int64(num_layers, "num_layers", 1), _int64(slot_bytes, "slot_bytes", 1),
            _int64(page_size, "page_size", 1), _int64(head_num, "head_num", 1),
            _int64(pages, "pages", 1), bool(mla), _int32(max_processes, "max_processes", 1)))

    @staticmethod
    def destroy_shared_host(name: str) -> None:
        """Removes the shared host segment `name` (processes attached keep their mapping).
        kvtier.NotFoundError when there is none."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name = {name!r} must be a segment name")
        _kvtier.shm_destroy(name)

    @staticmethod
    def config_fields() -> list:
        """[{name, kind, default, min, max, min_exclusive, choices, help}] of every setting, read
        from the C++ HierarchicalCacheConfig."""
        return [dict(f) for f in _CONFIG_FIELDS]

    # ---- the request path ------------------------------------------------------------------

    def match(self, tokens: Any, namespace: str = "") -> Match:
        """The longest cached page-aligned prefix of `tokens` (device, then host, then storage
        pages the cache knows); always a live handle, released with the Match."""
        address, count, keep = _host_array(tokens, "tokens", "i")
        handle, dev_tokens, dev_slots, host_tokens, host_slots, storage_tokens = \
            self._native.match(address, count, namespace)
        del keep
        return Match(self, handle, dev_tokens, dev_slots, host_tokens, host_slots, storage_tokens)

    def query_storage(self, match: Match) -> StorageQuery:
        """Asks the storage backend for further pages of the match's tokens than the cache knows
        (stored by another process or an earlier run) and extends the match by them. No storage
        tier: nothing found. Updates match.storage_tokens when given a Match."""
        storage_tokens, queried = self._native.query_storage(self._handle(match))
        if isinstance(match, Match):
            match.storage_tokens = storage_tokens
        return StorageQuery(storage_tokens, queried)

    def prefetch(self, match: Match, policy: Optional[str] = None) -> Prefetch:
        """Starts copying the match's storage part into host memory and returns at once.
        `policy` (default: the cache's prefetch_policy) decides how finish_prefetch / load_back
        end it. State "none" when there is nothing to do (below prefetch_threshold_tokens, no
        storage part or no host room)."""
        if policy is not None and policy not in PREFETCH_POLICIES:
            raise ValueError(f"policy = {policy!r} is not one of {', '.join(PREFETCH_POLICIES)}")
        return _prefetch(self._native.prefetch(self._handle(match), policy or ""))

    def poll_prefetch(self, match: Match) -> Prefetch:
        """The prefetch's progress, without waiting or ending it."""
        return _prefetch(self._native.poll_prefetch(self._handle(match)))

    def finish_prefetch(self, match: Match) -> Prefetch:
        """Ends the match's prefetch by its policy (waiting as the policy says): the arrived
        prefix becomes host hits of the match, the rest is cancelled."""
        return _prefetch(self._native.finish_prefetch(self._handle(match)))

    def load_back(self, match: Match, stream: Any = None, after: Any = None) -> LoadBack:
        """Ends a running prefetch, then copies the host part of `match` into fresh device slots
        (MemoryError when the device cannot make room). A wait_complete or timeout prefetch is
        streamed (stream_load_back, the default): its pages are copied in pieces as they arrive,
        in prefix order, while the rest is read; the result is the unstreamed one. GPU: enqueued
        on `stream`, so after the work queued on it so far, and after the work queued on each
        stream of `after` (a stream or a list of streams where the engine wrote into slots the
        load may reuse); wait per layer with wait_layer (it covers every piece)."""
        stream = self._stream(stream)
        if after is not None and self._device != HOST:
            others = after if isinstance(after, (list, tuple)) else [after]
            _kvtier.stream_wait_streams(self._device, stream,
                                        [resolve_stream(o, self._device) for o in others])
        loaded, skipped, slots, prefetch = self._native.load_back(self._handle(match), stream)
        return LoadBack(loaded, skipped, self._device_slots(slots),
                        None if prefetch["state"] == "none" else _prefetch(prefetch))

    def wait_layer(self, match: Match, layer: int, stream: Any = None) -> None:
        """Makes `stream` wait (on the device) until `layer` of the match's last load_back is in
        place. Returns at once on the cpu backend."""
        self._native.wait_layer(self._handle(match), _int64(layer, "layer", 0),
                                self._stream(stream))

    def release(self, match: Any, stream: Any = None) -> None:
        """Unpins a match (a Match or its handle id) and cancels its prefetch. With `stream` (GPU
        pools): only once the work queued on that stream so far has completed; until then the
        match stays pinned (see the module docstring)."""
        if isinstance(match, Match):
            handle = self._handle(match)  # refuses another cache's Match
            if not match._unpin():
                raise ValueError(f"match handle {handle} is already released")
        else:
            handle = self._handle(match)
        if stream is None or self._device == HOST:
            self._release_handle(handle)
        else:
            self._native.release(handle, resolve_stream(stream, self._device), self._device)

    def _release_handle(self, handle: int) -> None:
        self._native.release(handle)

    def pin(self, tokens: Any, tiers: Any = ("device",), ttl: Optional[float] = None,
            namespace: str = "") -> Pin:
        """Keeps the longest cached prefix of `tokens` in `tiers` (any of "device", "host",
        "storage", each once; the cache must have those tiers) for `ttl` seconds (None: until
        unpin). A pinned page is not evicted from a named tier while it is there (a pin copies
        nothing into a tier); pages cached after the call are not covered (pin again). Tokens
        covered by several pins count once against each tier's budget
        (pin_<tier>_budget_tokens); a pin beyond a budget raises ValueError (kvtier.
        InvalidArgumentError) naming it, and changes nothing. Expired pins are released by the
        cache's next call."""
        if isinstance(tiers, str):
            tiers = (tiers,)
        try:
            names = list(tiers)
        except TypeError:  # None, a number: not TypeError from list() but the argument named
            raise ValueError(f"tiers = {tiers!r} must be a tier name or a list of them "
                             f"({', '.join(CACHE_TIERS)})") from None
        for t in names:
            if t not in CACHE_TIERS:
                raise ValueError(f"tiers: {t!r} is not one of {', '.join(CACHE_TIERS)}")
        if ttl is None:
            seconds = float("inf")
        else:
            if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
                raise ValueError(f"ttl = {ttl!r} must be a number of seconds or None")
            seconds = float(ttl)
            if not seconds > 0 or seconds == float("inf"):
                raise ValueError(f"ttl = {ttl!r} must be a positive finite number of seconds "
                                 "(None: until unpin)")
        address, count, keep = _host_array(tokens, "tokens", "i")
        pin_id, pinned, store_pinned = self._native.pin(address, count, names, seconds, namespace)
        del keep
        return Pin(pin_id, pinned, store_pinned)

    def unpin(self, pin: Any) -> None:
        """Ends a pin (a Pin or its id) now. ValueError for a pin that is not live: ended
        already (unpin or its TTL), never issued, or another cache's."""
        pin_id = pin.id if isinstance(pin, Pin) else _int(pin, "pin", 0)
        if pin_id >= 2**64:
            raise ValueError(f"pin = {pin_id} is not a pin id (an unsigned 64-bit integer)")
        self._native.unpin(pin_id)

    def allocate_device_slots(self, num_tokens: int, allow_fewer: bool = False) -> Any:
        """Slots for num_tokens new tokens (rounded up to whole pages), evicting if needed.
        MemoryError when eviction cannot make room, or with allow_fewer as many whole pages as
        it could."""
        return self._device_slots(self._native.allocate_device_slots(
            _int64(num_tokens, "num_tokens"), bool(allow_fewer)))

    def free_device_slots(self, slots: Any, stream: Any = None) -> None:
        """Returns engine-held pages (whole pages). With `stream` (GPU pools): only once the work
        queued on that stream so far has completed."""
        address, count, keep = _host_array(slots, "slots", "q")
        if stream is None or self._device == HOST:
            self._native.free_device_slots(address, count)
        else:
            self._native.free_device_slots(address, count, resolve_stream(stream, self._device),
                                           self._device)
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
                                     _int32(priority, "priority"), self._stream(stream))
        del t_keep, s_keep
        return result

    # ---- a TP group's leader (kvtier.tp) ---------------------------------------------------

    def tp_publish(self, message: bytes) -> int:
        """Publishes an engine message (the step: tokens, slots) to every follower, ordered after
        the copies decided so far; its sequence number. Followers get it in serve()'s
        on_message. FailedPreconditionError when this cache leads no TP group."""
        if not isinstance(message, (bytes, bytearray, memoryview)):
            raise ValueError(f"message must be bytes, not {type(message).__name__}")
        return self._native.tp_publish(bytes(message))

    def tp_wait_applied(self, seq: int) -> None:
        """Waits until every follower applied the decisions up to `seq`; UnavailableError naming
        the rank that died, failed or did not answer within the group's ack_timeout_s."""
        self._native.tp_wait_applied(_int(seq, "seq", 1))

    def tp_fence(self) -> None:
        """Waits until every follower applied every decision published so far (the cache's copies
        included): call it before sending a follower anything by another channel than
        tp_publish (a step broadcast with torch.distributed). Errors as tp_wait_applied."""
        self._native.tp_fence()

    def tp_result(self, rank: int, seq: int) -> int:
        """What rank `rank`'s on_message returned for message `seq` (after tp_wait_applied)."""
        return self._native.tp_result(_int32(rank, "rank", 1), _int(seq, "seq", 1))

    def tp_stats(self) -> dict:
        """{size, records, record_bytes, slots, waits, ack_wait_seconds, health}: the decisions
        published and the leader's point-to-point waits for its followers."""
        return self._native.tp_stats()

    # ---- maintenance -----------------------------------------------------------------------

    def evict_device(self, num_tokens: int) -> int:
        return self._native.evict_device(_int64(num_tokens, "num_tokens"))

    def evict_host(self, num_tokens: int) -> int:
        return self._native.evict_host(_int64(num_tokens, "num_tokens"))

    def wait_for_backups(self) -> None:
        self._native.wait_for_backups()

    def stats(self) -> dict:
        return self._native.stats()

    def metrics(self) -> str:
        """Prometheus text exposition of the cache's counters and gauges (SGLang HiCache's metric
        names where SGLang has them, prefixed "kvtier:")."""
        return self._native.metrics()

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
    def has_storage(self) -> bool:
        return self._native.has_storage()

    @property
    def host_geometry(self) -> dict:
        return self._native.host_geometry()

    @property
    def closed(self) -> bool:
        return self._native.closed

    def close(self) -> None:
        """Refuses new calls, waits for the calls in flight (other threads) and the copies, and
        frees the cache. Later calls raise kvtier.FailedPreconditionError; live matches are
        dropped. Closing twice is fine."""
        self._native.close()

    def __enter__(self) -> "HierarchicalCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- helpers ---------------------------------------------------------------------------

    def _handle(self, match: Any) -> int:
        if isinstance(match, Match):
            if match._owner is not self:
                raise ValueError(f"match handle {match.handle} belongs to another "
                                 "HierarchicalCache")
            return match.handle
        handle = _int(match, "match", 0)
        if handle >= 2**64:
            raise ValueError(f"match = {handle} is not a handle id (an unsigned 64-bit integer)")
        return handle

    def _device_slots(self, data: bytes) -> Any:
        if self._slots_device is None:
            return _slots_from_bytes(data)
        # Through pinned memory, asynchronously on the current stream of the pool's GPU: a
        # pageable .to() would wait for everything queued on that stream (torch synchronises
        # after a blocking copy). torch's host allocator keeps the pinned block until the copy
        # has run.
        torch = sys.modules["torch"]
        n = len(data) // 8
        if n == 0:
            return torch.empty(0, dtype=torch.int64, device=self._slots_device)
        host = torch.empty(n, dtype=torch.int64, pin_memory=True)
        ctypes.memmove(host.data_ptr(), data, len(data))
        return host.to(self._slots_device, non_blocking=True)

    def _stream(self, stream: Any) -> int:
        if self._device == HOST:
            return 0 if stream is None else resolve_stream(stream, HOST)
        return resolve_stream(stream, self._device)
