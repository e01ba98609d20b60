"""Buffer introspection for building regions: raw addresses and sizes from torch, CUDA-array and
numpy objects. (Per-call arguments, such as index lists, are read in C++: python/src/py_args.cc.)

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
