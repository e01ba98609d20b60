"""Buffer and index introspection: raw addresses and sizes from torch, CUDA-array and numpy objects.

Everything kvtier copies is described by an address, a byte size and where it lives (host memory or
CUDA device N). This module gets those from any object that exposes one of
  * ``data_ptr()`` (a ``torch.Tensor``),
  * ``__cuda_array_interface__`` (CuPy, Numba, torch CUDA tensors, ...),
  * ``__array_interface__`` (numpy and friends),
without importing torch or numpy unless the caller already did. Buffers must be contiguous: the
geometry describes their bytes, not their strides.

Thread safety: pure functions over their arguments.
"""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple, Optional, Sequence, Tuple

HOST = -1  # device ordinal used for host memory


class BufferInfo(NamedTuple):
    address: int
    nbytes: int
    device: int  # CUDA device ordinal, or HOST (-1)
    readonly: bool
    shape: Tuple[int, ...]
    itemsize: int
    obj: Any  # the object itself, kept alive while the info is in use

    @property
    def on_device(self) -> bool:
        return self.device != HOST

    def where(self) -> str:
        return "host memory" if self.device == HOST else f"cuda:{self.device}"


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _c_contiguous(shape: Sequence[int], strides: Optional[Sequence[int]], itemsize: int) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _typestr_itemsize(typestr: str, name: str) -> int:
    try:
        return int(typestr[2:])
    except (TypeError, ValueError):
        raise ValueError(f"{name}: cannot read the element size from typestr {typestr!r}") from None


def _cuda_device_of(address: int) -> int:
    """The CUDA device ordinal of a device address (0 when kvtier cannot ask CUDA)."""
    from . import _kvtier

    if hasattr(_kvtier, "pointer_info"):
        memory, device = _kvtier.pointer_info(address)
        return device if memory == "device" and device >= 0 else 0
    return 0


def describe_buffer(obj: Any, name: str) -> BufferInfo:
    """Address, size and residency of a contiguous buffer; ValueError naming `name` otherwise."""
    if obj is None:
        raise ValueError(f"{name} is None; expected a tensor or array")
    if _is_torch_tensor(obj):
        if obj.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} is on device {obj.device}; kvtier copies cpu and cuda tensors")
        if not obj.is_contiguous():
            raise ValueError(f"{name} must be contiguous (shape {tuple(obj.shape)}, "
                             f"strides {tuple(obj.stride())})")
        device = HOST
        if obj.device.type == "cuda":
            device = obj.device.index if obj.device.index is not None else 0
        return BufferInfo(obj.data_ptr(), obj.numel() * obj.element_size(), device, False,
                          tuple(obj.shape), obj.element_size(), obj)
    for attr, on_device in (("__cuda_array_interface__", True), ("__array_interface__", False)):
        iface = getattr(obj, attr, None)
        if iface is None:
            continue
        shape = tuple(int(d) for d in iface["shape"])
        itemsize = _typestr_itemsize(iface["typestr"], name)
        if not _c_contiguous(shape, iface.get("strides"), itemsize):
            raise ValueError(f"{name} must be C-contiguous (shape {shape}, "
                             f"strides {tuple(iface['strides'])})")
        data = iface.get("data")
        if data is None or not isinstance(data, tuple):
            raise ValueError(f"{name}: {attr} does not give a data pointer")
        address, readonly = int(data[0]), bool(data[1])
        nbytes = math.prod(shape) * itemsize
        device = _cuda_device_of(address) if on_device else HOST
        return BufferInfo(address, nbytes, device, readonly, shape, itemsize, obj)
    raise ValueError(f"{name} of type {type(obj).__name__} exposes no data_ptr(), "
                     "__cuda_array_interface__ or __array_interface__")


class IndexInfo(NamedTuple):
    address: int
    count: int
    int64: bool
    device: int  # CUDA device ordinal, or HOST
    obj: Any  # keeps converted arrays alive

    @property
    def on_device(self) -> bool:
        return self.device != HOST


_INT_TYPESTRS = {"<i4": False, "<i8": True, "=i4": False, "=i8": True}


def describe_indices(obj: Any, name: str) -> IndexInfo:
    """A 1-D int32/int64 index array on host or device; lists become int64 numpy arrays."""
    if obj is None:
        raise ValueError(f"{name} is None; expected an int32/int64 array or tensor")
    if _is_torch_tensor(obj):
        torch = sys.modules["torch"]
        if obj.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} has dtype {obj.dtype}; expected torch.int32 or torch.int64")
        if obj.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(obj.shape)}")
        if not obj.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if obj.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} is on device {obj.device}; expected cpu or cuda")
        device = HOST
        if obj.device.type == "cuda":
            device = obj.device.index if obj.device.index is not None else 0
        return IndexInfo(obj.data_ptr(), obj.numel(), obj.dtype == torch.int64, device, obj)
    if isinstance(obj, (list, tuple, range)):
        import numpy as np

        try:
            obj = np.asarray(obj, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{name} must hold integers") from None
        if obj.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {obj.shape}")
    cuda_iface = getattr(obj, "__cuda_array_interface__", None)
    host_iface = getattr(obj, "__array_interface__", None)
    iface = cuda_iface if cuda_iface is not None else host_iface
    if iface is None:
        raise ValueError(f"{name} of type {type(obj).__name__} is not an index array "
                         "(expected numpy/torch int32 or int64, or a list of ints)")
    typestr = iface["typestr"]
    if sys.byteorder == "little" and typestr in ("|i4", "|i8"):
        typestr = "<" + typestr[1:]
    if typestr not in _INT_TYPESTRS:
        raise ValueError(f"{name} has element type {iface['typestr']!r}; expected int32 or int64")
    int64 = _INT_TYPESTRS[typestr]
    shape = tuple(int(d) for d in iface["shape"])
    if len(shape) != 1:
        raise ValueError(f"{name} must be 1-D, got shape {shape}")
    if not _c_contiguous(shape, iface.get("strides"), 8 if int64 else 4):
        if cuda_iface is not None:
            raise ValueError(f"{name} must be contiguous")
        import numpy as np

        obj = np.ascontiguousarray(obj)
        return describe_indices(obj, name)
    address = int(iface["data"][0] or 0)
    device = _cuda_device_of(address) if cuda_iface is not None else HOST
    return IndexInfo(address, shape[0], int64, device, obj)


def resolve_stream(stream: Any, device: int) -> int:
    """The CUDA stream address to enqueue on.

    `stream` wins when given (an int address, or an object with `cuda_stream` (torch), `ptr` (CuPy)
    or `handle`). Otherwise, when torch is imported and the copy involves CUDA device `device`,
    torch's current stream of that device; otherwise 0, the legacy default stream.
    """
    if stream is not None:
        if isinstance(stream, bool):
            raise ValueError(f"stream = {stream!r} is not a CUDA stream")
        if isinstance(stream, int):
            if stream < 0:
                raise ValueError(f"stream = {stream} must not be negative")
            return stream
        for attr in ("cuda_stream", "ptr", "handle"):
            value = getattr(stream, attr, None)
            if isinstance(value, int):
                return value
        raise ValueError(f"stream of type {type(stream).__name__} is not a CUDA stream "
                         "(pass an int address or a torch.cuda.Stream)")
    torch = sys.modules.get("torch")
    if torch is not None and device != HOST:
        return int(torch.cuda.current_stream(device).cuda_stream)
    return 0
