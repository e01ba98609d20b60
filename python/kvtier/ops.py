"""kvtier.ops — the transfer API over torch tensors, CUDA arrays and numpy arrays.

A copy moves the KV of a list of slots (token indices) between two regions. A region is a KV pool
described by its geometry (docs/architecture.md §2) over buffers you own:

    src = ops.KvRegion(layout="page_first", num_layers=L, slot_bytes=S, k=host_k, v=host_v)
    dst = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, k=dev_k, v=dev_v)
    ops.transfer_layer(src, dst, host_slots, dev_slots, layer=3)        # one layer
    ops.transfer_all_layers(dst, src, dev_slots, host_slots)            # every layer

Buffers are anything with ``data_ptr()`` (torch), ``__cuda_array_interface__`` or
``__array_interface__`` (numpy), contiguous, at least as large as the geometry says (checked: a
too-small buffer is never written past its end). A ``layer_first`` region may instead take lists of
per-layer buffers (``k=[layer0, layer1, ...]``). MLA pools have one buffer: ``mla=True`` and no
``v``. Indices are 1-D int32/int64 numpy arrays, torch tensors (host or CUDA) or lists of ints.

Backends: ``cpu`` (host memory only, synchronous), ``kernel`` (CUDA kernels, zero-copy over pinned
host memory), ``dma`` (copy engines), ``auto`` (cpu when every buffer and index is in host memory,
otherwise the C++ auto backend). GPU backends enqueue on ``stream`` when given, else on PyTorch's
current stream of the device when torch is imported, else on the legacy default stream, and return
once the copy is enqueued.

Errors: a bad argument raises ValueError (kvtier.InvalidArgumentError for those found by the C++
core) whose message names the argument; other failures raise subclasses of kvtier.KvtierError.

Thread safety: functions may be called from several threads; a request's buffers and indices must
not change while it runs.
"""

from __future__ import annotations

import numbers
import sys
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

from . import _kvtier
from ._buffers import HOST, BufferInfo, describe_buffer, resolve_stream

__all__ = [
    "LAYOUTS",
    "BACKENDS",
    "KvRegion",
    "transfer",
    "transfer_layer",
    "transfer_all_layers",
    "synchronize",
    "configure",
    "config_fields",
    "engine_config",
    "scatter_dense",
    "gather_dense",
    "DensePagedPlan",
    "dense_paged_errors",
]

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
BACKENDS = ("cpu", "kernel", "dma", "auto")


_INT64_MAX = (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1


def _int(value: Any, name: str, minimum: Optional[int] = None, maximum: int = _INT64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} = {value!r} must be an integer")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} = {value} must be >= {minimum}")
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise ValueError(f"{name} = {value} does not fit in a 64-bit signed integer")
    if value > maximum:
        raise ValueError(f"{name} = {value} must be <= {maximum}")
    return value


def _float(value: Any, name: str) -> float:
    # A number, never text: float("2") and float(b"1") would parse it (issue 36).
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} = {value!r} must be a number")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} = {value!r} must be a number") from None


def _check_field(field: dict, value: Any) -> Any:
    """`value` checked against a field of a C++ config schema (its kind, bounds and choices, as
    the binding's *_config_fields() tables give them); a ValueError naming the field otherwise,
    worded as the C++ Validate words it."""
    name, kind = field["name"], field["kind"]
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{name} = {value!r} must be True or False")
        return value
    if kind == "str":
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} = {value!r} must be a string")
        if value is not None and "\0" in value:
            # C++ would see the text cut at the NUL (a storage URL: another path or server)
            raise ValueError(f"{name} holds a NUL byte")
        return value or ""
    if kind == "choice":
        return _check_choice(value, name, field["choices"])
    value = _int(value, name) if kind == "int" else _float(value, name)
    lo, hi = field["min"], field["max"]
    low_ok = value > lo if field["min_exclusive"] else value >= lo
    if not (low_ok and value <= hi):  # NaN fails both
        low = "(" if field["min_exclusive"] else "["
        raise ValueError(f"{name} = {value} must be in {low}{lo}, {hi}]")
    return value


def _check_settings(fields: dict, settings: dict, what: str) -> dict:
    """Every setting checked against its field of `fields` (name -> field); a ValueError naming an
    unknown one."""
    out = {}
    for name, value in settings.items():
        field = fields.get(name)
        if field is None:
            raise ValueError(f"{name!r} is not a {what} setting; known: {', '.join(sorted(fields))}")
        out[name] = _check_field(field, value)
    return out


def _check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} = {value!r} is not one of {', '.join(choices)}")
    return value


class KvRegion:
    """A KV region over caller-owned buffers (the region keeps references to them).

    Args:
      layout: "layer_first", "page_first", "page_first_direct" or "page_head".
      num_layers: L.  slot_bytes: S, bytes of one token in one layer (of K, or of the MLA buffer).
      k, v: the K and V buffers (v omitted for MLA), each at least L*N*S bytes; for layer_first,
        alternatively lists of L per-layer buffers of at least N*S bytes each.
      num_slots: N; by default the most the buffers hold (a multiple of page_size).
      page_size: P.  head_num: H (page_head only depends on it).  mla: one buffer, no v.
      name: prefix of error messages ("src", "dst", ...).
      labels: names of the k and v buffers in error messages (default "<name>.k", "<name>.v").
    """

    def __init__(self, *, layout: str, num_layers: int, slot_bytes: int, k: Any, v: Any = None,
                 num_slots: Optional[int] = None, page_size: int = 1, head_num: int = 1,
                 mla: bool = False, name: str = "region",
                 labels: Optional[Sequence[str]] = None) -> None:
        _check_choice(layout, f"{name}.layout", LAYOUTS)
        num_layers = _int(num_layers, f"{name}.num_layers", 1)
        slot_bytes = _int(slot_bytes, f"{name}.slot_bytes", 1)
        page_size = _int(page_size, f"{name}.page_size", 1)
        head_num = _int(head_num, f"{name}.head_num", 1, _INT32_MAX)
        mla = bool(mla)
        if mla and v is not None:
            raise ValueError(f"{name}.v must be None for an MLA region (mla=True has one buffer)")
        if not mla and v is None:
            raise ValueError(f"{name}.v is required for an MHA region (pass mla=True for MLA)")

        per_layer = isinstance(k, (list, tuple))
        if not mla and per_layer != isinstance(v, (list, tuple)):
            raise ValueError(f"{name}.k and {name}.v must both be buffers or both be lists of "
                             "per-layer buffers")
        buffers: List[BufferInfo] = []
        if per_layer:
            if layout != "layer_first":
                raise ValueError(f"{name}.k is a list of per-layer buffers, which needs "
                                 f"layout='layer_first', not {layout!r}")
            for label, seq in (("k", k), ("v", v)) if not mla else (("k", k),):
                if len(seq) != num_layers:
                    raise ValueError(f"{name}.{label} has {len(seq)} per-layer buffers, expected "
                                     f"num_layers = {num_layers}")
                buffers += [describe_buffer(b, f"{name}.{label}[{i}]") for i, b in enumerate(seq)]
            unit = slot_bytes  # bytes per slot in one per-layer buffer
        else:
            k_label, v_label = (tuple(labels) + (None,))[:2] if labels else (f"{name}.k", f"{name}.v")
            buffers.append(describe_buffer(k, k_label))
            if not mla:
                buffers.append(describe_buffer(v, v_label))
            unit = num_layers * slot_bytes
        names = self._buffer_names(name, per_layer, mla, num_layers)
        if labels is not None and not per_layer:
            names = list(labels)

        capacity = min(b.nbytes for b in buffers) // unit  # slots every buffer can hold
        if num_slots is None:
            num_slots = capacity - capacity % page_size
            if num_slots <= 0:
                smallest = min(range(len(buffers)), key=lambda i: buffers[i].nbytes)
                raise ValueError(
                    f"{names[smallest]} holds {buffers[smallest].nbytes} bytes, less than one page "
                    f"of {page_size} slot(s) x {unit} bytes")
        else:
            num_slots = _int(num_slots, f"{name}.num_slots", 1)
            for b, label in zip(buffers, names):
                if b.nbytes < num_slots * unit:
                    raise ValueError(
                        f"{label} holds {b.nbytes} bytes but num_slots = {num_slots} needs "
                        f"{num_slots * unit} ({num_slots} slots x {unit} bytes)")

        devices = {b.device for b in buffers}
        if len(devices) != 1:
            where = ", ".join(f"{label} in {b.where()}" for b, label in zip(buffers, names))
            raise ValueError(f"{name} mixes memories: {where}")
        device = devices.pop()

        kwargs = dict(layout=layout, num_layers=num_layers, num_slots=num_slots,
                      slot_bytes=slot_bytes, page_size=page_size, head_num=head_num, mla=mla,
                      memory="host" if device == HOST else "device", device=device, name=name)
        if per_layer:
            kwargs["k_layers"] = [b.address for b in buffers[:num_layers]]
            kwargs["v_layers"] = [] if mla else [b.address for b in buffers[num_layers:]]
        else:
            kwargs["k"] = buffers[0].address
            kwargs["v"] = 0 if mla else buffers[1].address
        self._init(kwargs, keepalive=[b.obj for b in buffers], labels=names)

    @staticmethod
    def _buffer_names(name: str, per_layer: bool, mla: bool, num_layers: int) -> List[str]:
        if not per_layer:
            return [f"{name}.k"] if mla else [f"{name}.k", f"{name}.v"]
        labels = ("k",) if mla else ("k", "v")
        return [f"{name}.{label}[{i}]" for label in labels for i in range(num_layers)]

    def _init(self, kwargs: dict, keepalive: list, labels: Optional[List[str]]) -> None:
        self.name = kwargs.pop("name")
        self._native = _kvtier.Region(**kwargs, name=self.name)
        self.device = kwargs["device"] if kwargs["memory"] == "device" else HOST
        self._keepalive = keepalive
        if labels is not None:
            # A copy into this region checks that these buffers are still writable.
            self._native._watch(keepalive, list(labels))

    @classmethod
    def from_addresses(cls, *, layout: str, num_layers: int, num_slots: int, slot_bytes: int,
                       page_size: int = 1, head_num: int = 1, mla: bool = False,
                       device: int = HOST, k: int = 0, v: int = 0,
                       k_layers: Sequence[int] = (), v_layers: Sequence[int] = (),
                       keepalive: Any = None, name: str = "region") -> "KvRegion":
        """A region over raw addresses (host memory when device is -1, else CUDA device `device`).

        Nothing checks that the addresses hold num_slots slots: the caller vouches for it. Used by
        kvtier.compat.sgl_kernel for SGLang's per-layer pointer tables.
        """
        self = cls.__new__(cls)
        _check_choice(layout, f"{name}.layout", LAYOUTS)
        kwargs = dict(layout=layout, num_layers=num_layers, num_slots=num_slots,
                      slot_bytes=slot_bytes, page_size=page_size, head_num=head_num, mla=mla,
                      memory="host" if device == HOST else "device", device=device, k=k, v=v,
                      k_layers=list(k_layers), v_layers=list(v_layers), name=name)
        self._init(kwargs, keepalive=[keepalive], labels=None)
        return self

    # Geometry, read from the C++ region.
    layout = property(lambda self: self._native.layout)
    num_layers = property(lambda self: self._native.num_layers)
    num_slots = property(lambda self: self._native.num_slots)
    slot_bytes = property(lambda self: self._native.slot_bytes)
    page_size = property(lambda self: self._native.page_size)
    head_num = property(lambda self: self._native.head_num)
    mla = property(lambda self: self._native.mla)

    @property
    def on_device(self) -> bool:
        return self.device != HOST

    def __repr__(self) -> str:
        where = "host" if self.device == HOST else f"cuda:{self.device}"
        return f"KvRegion({self.name}: {self._native!r} on {where})"


def _rename_slots(message: str) -> str:
    # The C++ request calls the index lists src_slots/dst_slots; Python callers pass
    # src_indices/dst_indices.
    return message.replace("src_slots", "src_indices").replace("dst_slots", "dst_indices")


def transfer(src: KvRegion, dst: KvRegion, src_indices: Any, dst_indices: Any, *,
             src_layer: int = 0, dst_layer: int = 0, num_layers: int = 1, backend: str = "auto",
             stream: Any = None, layer_events: Any = None, max_sms: int = 0) -> None:
    """Copy layers [src_layer, src_layer + num_layers) of slots src_indices of `src` to layers
    [dst_layer, ...) of slots dst_indices of `dst` (slot k of one list goes to slot k of the other).

    layer_events: a kvtier.LayerEvents (CUDA builds); GPU backends record one event per layer.
    max_sms: at most this many SMs for the kernel backend, for this call (0 = the engine's
    default, 4), e.g. fewer for a backup that runs beside per-layer loads.

    The arguments are read and checked in C++ (``_kvtier.transfer_objects``); a destination buffer
    made read-only after the region was built is refused.
    """
    if not isinstance(src, KvRegion):
        raise ValueError(f"src must be a kvtier.ops.KvRegion, not {type(src).__name__}")
    if not isinstance(dst, KvRegion):
        raise ValueError(f"dst must be a kvtier.ops.KvRegion, not {type(dst).__name__}")
    _transfer_objects(src._native, dst._native, src_indices, dst_indices, src_layer, dst_layer,
                      num_layers, backend, stream, layer_events, max_sms)


_transfer_objects = _kvtier.transfer_objects


def transfer_layer(src: KvRegion, dst: KvRegion, src_indices: Any, dst_indices: Any, layer: int,
                   **kwargs: Any) -> None:
    """One layer, the same index on both sides (a per-layer load). kwargs as for transfer()."""
    layer = _int(layer, "layer")
    transfer(src, dst, src_indices, dst_indices, src_layer=layer, dst_layer=layer, num_layers=1,
             **kwargs)


def transfer_all_layers(src: KvRegion, dst: KvRegion, src_indices: Any, dst_indices: Any,
                        **kwargs: Any) -> None:
    """Every layer of `src` (an all-layer backup). kwargs as for transfer()."""
    if not isinstance(src, KvRegion):
        raise ValueError(f"src must be a kvtier.ops.KvRegion, not {type(src).__name__}")
    transfer(src, dst, src_indices, dst_indices, src_layer=0, dst_layer=0,
             num_layers=src.num_layers, **kwargs)


def synchronize(backend: str = "kernel", stream: Any = None, device: int = 0) -> None:
    """Wait for `backend`'s copies on `stream` (default: as transfer() picks it) and raise the first
    error found on the device since the last call (e.g. an out-of-range device index a kernel
    skipped). A no-op for cpu."""
    _check_choice(backend, "backend", BACKENDS)
    device = _int(device, "device", 0, _INT32_MAX)
    if backend == "cpu":
        return
    try:
        _kvtier.synchronize(backend, resolve_stream(stream, device), device)
    except _kvtier.InvalidArgumentError as e:
        raise _kvtier.InvalidArgumentError(_rename_slots(str(e))) from None


# The engines' settings, read from the C++ TransferEngineConfig schema: names, kinds, defaults,
# bounds and help are never typed here.
_ENGINE_FIELDS = {f["name"]: f for f in _kvtier.transfer_config_fields()}


def config_fields() -> list:
    """[{name, kind, default, min, max, min_exclusive, choices, help}] of every setting configure()
    takes, read from the C++ TransferEngineConfig (same names, defaults and bounds)."""
    return [dict(f) for f in _ENGINE_FIELDS.values()]


def configure(**settings: Any) -> None:
    """Reconfigure the engines kvtier.ops uses; unset settings keep their current value, None
    counts as unset. Any field of config_fields() (TransferEngineConfig's, include/kvtier/
    transfer.h), e.g. cpu_threads=8, max_sms=4, dma_lanes=4, dma_ops_per_lane=256. An unknown
    name or a value out of bounds is a ValueError naming it.
    """
    settings = {k: v for k, v in settings.items() if v is not None}
    _kvtier.configure(**_check_settings(_ENGINE_FIELDS, settings, "kvtier.ops engine"))


def engine_config() -> dict:
    """The configuration of the engines kvtier.ops uses."""
    return dict(_kvtier.engine_config())


# ---- dense <-> paged ------------------------------------------------------------------------


class _Dense(NamedTuple):
    address: int
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]  # bytes
    itemsize: int
    device: int
    readonly: bool


def _describe_dense(obj: Any, name: str) -> _Dense:
    """Address, shape, byte strides and residency of a strided tensor / array (any strides)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} is on device {obj.device}; kvtier copies cpu and cuda "
                             "tensors")
        itemsize = obj.element_size()
        device = HOST if obj.device.type == "cpu" else (obj.device.index or 0)
        return _Dense(obj.data_ptr(), tuple(obj.shape), tuple(s * itemsize for s in obj.stride()),
                      itemsize, device, False)
    for attr, on_device in (("__cuda_array_interface__", True), ("__array_interface__", False)):
        iface = getattr(obj, attr, None)
        if iface is None:
            continue
        shape = tuple(int(d) for d in iface["shape"])
        typestr = iface["typestr"]
        try:
            itemsize = int(typestr[2:])
        except (TypeError, ValueError):
            raise ValueError(f"{name}: cannot read the element size from {typestr!r}") from None
        strides = iface.get("strides")
        if strides is None:  # C-contiguous
            strides, step = [], itemsize
            for d in reversed(shape):
                strides.insert(0, step)
                step *= d
        data = iface.get("data")
        if data is None or not isinstance(data, tuple):
            raise ValueError(f"{name}: {attr} does not give a data pointer")
        device = HOST
        if on_device:
            from ._buffers import _cuda_device_of
            device = _cuda_device_of(int(data[0]))
        return _Dense(int(data[0]), shape, tuple(int(s) for s in strides), itemsize, device,
                      bool(data[1]))
    raise ValueError(f"{name} of type {type(obj).__name__} is not a tensor or array (no "
                     "data_ptr(), __cuda_array_interface__ or __array_interface__)")


def _dense_layers(obj: Any, name: str, writable: bool) -> List[_Dense]:
    """Per-layer 4-D descriptions of `obj`: a list of [B, H, T, D] tensors, or one
    [layers, B, H, T, D] tensor."""
    if isinstance(obj, (list, tuple)):
        if not obj:
            raise ValueError(f"{name} is an empty list of layers")
        layers = [_describe_dense(t, f"{name}[{i}]") for i, t in enumerate(obj)]
        for i, d in enumerate(layers):
            if len(d.shape) != 4:
                raise ValueError(f"{name}[{i}] has shape {d.shape}; expected [batch, heads, seq, "
                                 "head_dim]")
    else:
        d = _describe_dense(obj, name)
        if len(d.shape) != 5:
            raise ValueError(f"{name} has shape {d.shape}; expected a list of [batch, heads, "
                             "seq, head_dim] tensors or one [layers, batch, heads, seq, head_dim] "
                             "tensor")
        if d.shape[0] == 0:
            raise ValueError(f"{name} has 0 layers")
        # One tensor: its layers share shape, element size and device; check it once.
        shape, strides, step = d.shape[1:], d.strides[1:], d.strides[0]
        if any(st < 0 for st in strides):
            raise ValueError(f"{name}[0] has negative strides {strides}; pass a copy")
        if step < 0:
            raise ValueError(f"{name} has negative strides {d.strides}; pass a copy")
        if writable and d.readonly:
            raise ValueError(f"{name}[0] is read-only")
        return [_Dense(d.address + i * step, shape, strides, d.itemsize, d.device, d.readonly)
                for i in range(d.shape[0])]
    for i, d in enumerate(layers):
        label = f"{name}[{i}]"
        if any(s < 0 for s in d.strides):
            raise ValueError(f"{label} has negative strides {d.strides}; pass a copy")
        if d.shape != layers[0].shape:
            raise ValueError(f"{label} has shape {d.shape}, {name}[0] has {layers[0].shape}")
        if d.itemsize != layers[0].itemsize:
            raise ValueError(f"{label} has {d.itemsize}-byte elements, {name}[0] has "
                             f"{layers[0].itemsize}")
        if d.device != layers[0].device:
            where = "host memory" if d.device == HOST else f"cuda:{d.device}"
            raise ValueError(f"{label} is in {where}, {name}[0] is not")
        if writable and d.readonly:
            raise ValueError(f"{label} is read-only")
    return layers


def _dense_args(pool: KvRegion, slots: Any, k: Any, v: Any, first_layer: int,
                writable: bool) -> tuple:
    """The checked arguments of a dense <-> paged copy, as _kvtier.dense_paged takes them:
    (slots, k rows, v rows, shape, itemsize, device, first_layer). `writable`: the dense side is
    written (a gather), so read-only arrays are refused."""
    if not isinstance(pool, KvRegion):
        raise ValueError(f"pool must be a kvtier.ops.KvRegion, not {type(pool).__name__}")
    first_layer = _int(first_layer, "first_layer", 0)
    if k is None:
        raise ValueError("k is None; expected the dense K tensors (or the MLA tensors)")
    ks = _dense_layers(k, "k", writable=writable)
    if pool.mla:
        if v is not None:
            raise ValueError("v must be None for an MLA pool (one buffer: pass k only)")
        vs: List[_Dense] = []
    else:
        if v is None:
            raise ValueError("v is None; an MHA pool needs both k and v (pass mla=True pools "
                             "k only)")
        vs = _dense_layers(v, "v", writable=writable)
        if len(vs) != len(ks):
            raise ValueError(f"v has {len(vs)} layers, k has {len(ks)}")
        if vs[0].shape != ks[0].shape or vs[0].itemsize != ks[0].itemsize:
            raise ValueError(f"v has shape {vs[0].shape} of {vs[0].itemsize}-byte elements, k has "
                             f"{ks[0].shape} of {ks[0].itemsize}-byte elements")
        if vs[0].device != ks[0].device:
            raise ValueError("k and v are on different devices")
    device = ks[0].device
    if device != pool.device:
        where = "host memory" if device == HOST else f"cuda:{device}"
        pool_where = "host memory" if pool.device == HOST else f"cuda:{pool.device}"
        raise ValueError(f"k is in {where} but the pool is in {pool_where}")
    batch, heads, seq, head_dim = ks[0].shape
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(slots, torch.Tensor) and slots.dim() == 2:
        if tuple(slots.shape) != (batch, seq):
            raise ValueError(f"slots has shape {tuple(slots.shape)}, expected [batch, seq] = "
                             f"[{batch}, {seq}]")
        slots = slots.reshape(-1)
    elif hasattr(slots, "ndim") and getattr(slots, "ndim", 1) == 2 and hasattr(slots, "reshape"):
        if tuple(slots.shape) != (batch, seq):
            raise ValueError(f"slots has shape {tuple(slots.shape)}, expected [batch, seq] = "
                             f"[{batch}, {seq}]")
        slots = slots.reshape(-1)
    return (slots, [(d.address, *d.strides) for d in ks], [(d.address, *d.strides) for d in vs],
            (batch, heads, seq, head_dim), ks[0].itemsize, device, first_layer)


def _dense_paged(pool: KvRegion, slots: Any, k: Any, v: Any, first_layer: int, to_pool: bool,
                 stream: Any) -> None:
    slots, ks, vs, shape, itemsize, device, first_layer = _dense_args(
        pool, slots, k, v, first_layer, writable=not to_pool)
    _kvtier.dense_paged(pool._native, slots, ks, vs, shape, itemsize, device, first_layer,
                        to_pool, 0 if device == HOST else resolve_stream(stream, device))


def scatter_dense(pool: KvRegion, slots: Any, k: Any, v: Any = None, *, first_layer: int = 0,
                  stream: Any = None) -> None:
    """Dense per-layer K/V -> pool slots, every layer in one call.

    k, v: the dense tensors of layers [first_layer, first_layer + n) of `pool`: a list of n
    tensors (torch, numpy, CUDA arrays) shaped [batch, heads, seq, head_dim] with any
    non-negative strides, or one [n, batch, heads, seq, head_dim] tensor; one element type of any
    dtype (the copy moves bytes). heads * head_dim * itemsize must be the pool's slot_bytes. MLA
    pools (one buffer) take k only.
    slots: batch * seq slot indices (1-D, or [batch, seq]); token (b, t) goes to slots[b*seq + t].
      On the pool's device or in host memory.
    stream: GPU pools: enqueued on it (default: PyTorch's current stream of the pool's device);
      returns once enqueued. Host pools: synchronous.
    Bad shapes raise ValueError naming the argument; host slot lists are range-checked, device
    ones are checked by the kernel (see dense_paged_errors()).
    """
    _dense_paged(pool, slots, k, v, first_layer, True, stream)


def gather_dense(pool: KvRegion, slots: Any, k: Any, v: Any = None, *, first_layer: int = 0,
                 stream: Any = None) -> None:
    """Pool slots -> dense per-layer K/V (the inverse of scatter_dense; k and v are written)."""
    _dense_paged(pool, slots, k, v, first_layer, False, stream)


class DensePagedPlan:
    """scatter_dense / gather_dense prepared once for slots and dense tensors that stay put.

    The arguments are those of scatter_dense / gather_dense (k, v: a list of n per-layer
    [batch, heads, seq, head_dim] tensors or one [n, batch, heads, seq, head_dim] tensor, for pool
    layers [first_layer, first_layer + n)); they are read and checked here, once, and each
    gather() / scatter() is then one native call over a range of the plan's layers — what an
    engine that gathers layer by layer (after each layer's wait_layer) wants: a few microseconds a
    call instead of reading every tensor again. The plan holds the pool, the slot list and the
    tensors; they must not be resized or freed while it is used (their bytes may change). The
    dense tensors must be writable (a plan may gather).
    Errors a copy finds (slots outside the pool, shapes the pool refuses) raise at the first run.
    """

    def __init__(self, pool: KvRegion, slots: Any, k: Any, v: Any = None, *,
                 first_layer: int = 0) -> None:
        slots, ks, vs, shape, itemsize, device, first_layer = _dense_args(
            pool, slots, k, v, first_layer, writable=True)
        self.device = device  # CUDA ordinal of the pool, or HOST
        self.num_layers = len(ks)
        self._keep = (pool, slots, k, v)
        self._native = _kvtier.DensePagedPlan(pool._native, slots, ks, vs, shape, itemsize,
                                              device, first_layer)

    def _run(self, layer: int, num_layers: Optional[int], to_pool: bool, stream: Any) -> None:
        if num_layers is None:
            num_layers = self.num_layers - layer if isinstance(layer, int) else 1
        if type(layer) is not int or type(num_layers) is not int:
            layer = _int(layer, "layer", 0)
            num_layers = _int(num_layers, "num_layers", 1)
        if type(stream) is not int:
            stream = 0 if self.device == HOST else resolve_stream(stream, self.device)
        self._native.run(layer, num_layers, to_pool, stream)

    def gather(self, layer: int = 0, num_layers: Optional[int] = None, *,
               stream: Any = None) -> None:
        """Pool slots -> the plan's dense tensors, for the plan's layers [layer, layer +
        num_layers) (default: from `layer` to the last). GPU: enqueued on `stream` (an int
        address is taken as is: the cheapest call; default: PyTorch's current stream)."""
        self._run(layer, num_layers, False, stream)

    def scatter(self, layer: int = 0, num_layers: Optional[int] = None, *,
                stream: Any = None) -> None:
        """The plan's dense tensors -> pool slots, for the plan's layers [layer, layer +
        num_layers)."""
        self._run(layer, num_layers, True, stream)


def dense_paged_errors(device: int = 0) -> int:
    """Device slot indices outside the pool that scatter_dense / gather_dense skipped on CUDA
    device `device` since the last call (waits for the device). 0 without CUDA."""
    return _kvtier.dense_paged_errors(_int(device, "device", 0, _INT32_MAX))
