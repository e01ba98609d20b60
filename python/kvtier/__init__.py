"""kvtier — a hierarchical KV cache for LLM inference (GPU memory, pinned host memory, storage).

    import kvtier
    kvtier.ops                      # KV transfers over torch tensors / CUDA arrays / numpy arrays
    kvtier.compat.sgl_kernel        # drop-in for SGLang's sgl_kernel.kvcacheio
    kvtier.LayerEvents              # per-layer readiness of a GPU copy (CUDA builds)
    kvtier.HierarchicalCache        # the cache manager (when built in)
    kvtier.TpGroup, kvtier.TpFollower  # one cache decision per tensor-parallel group
    kvtier.page_keys(tokens, 16)    # SGLang-compatible chained SHA-256 page keys (hex)
    kvtier.page_keys(tokens, 16, as_int=True)  # the same as the block hashes of KV events
    kvtier.PageStore(url, model_id=..., ...)  # kvtier's stores driven in batches from raw
                                    # host addresses (engine integrations' host pools)

Importing kvtier needs neither a GPU nor PyTorch. Features that need CUDA raise
kvtier.UnavailableError when kvtier was built without it. Errors are exceptions whose message is
the C++ Status message: kvtier.InvalidArgumentError (a ValueError), kvtier.OutOfMemoryError (a
MemoryError), and other kvtier.KvtierError subclasses (RuntimeErrors).
"""

from . import _kvtier
from ._kvtier import (
    CorruptionError,
    CudaError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    KvtierError,
    KvtierIOError,
    NotFoundError,
    OutOfMemoryError,
    UnavailableError,
    built_with_cuda,
)
from . import ops
from .ops import KvRegion

__version__ = "0.1.0"

# Per-layer readiness events and host-memory pinning; creating them without CUDA raises
# UnavailableError.
LayerEvents = _kvtier.LayerEvents
PinnedRegistration = _kvtier.PinnedRegistration
cuda_device_count = _kvtier.cuda_device_count
page_keys = _kvtier.page_keys
PageStore = _kvtier.PageStore
PageStoreJob = _kvtier.PageStoreJob

if getattr(_kvtier, "has_cache", False):
    from .cache import HierarchicalCache  # noqa: F401
    from .tp import TpFollower, TpGroup  # noqa: F401

__all__ = [
    "ops",
    "KvRegion",
    "LayerEvents",
    "PinnedRegistration",
    "built_with_cuda",
    "cuda_device_count",
    "page_keys",
    "PageStore",
    "PageStoreJob",
    "KvtierError",
    "InvalidArgumentError",
    "OutOfMemoryError",
    "NotFoundError",
    "KvtierIOError",
    "CorruptionError",
    "CudaError",
    "UnavailableError",
    "FailedPreconditionError",
    "InternalError",
] + (["HierarchicalCache", "TpGroup", "TpFollower"] if getattr(_kvtier, "has_cache", False)
      else [])
