"""SGLang's own source, loaded unmodified for kvtier's SGLang tests and the side-by-side bench.

``KVTIER_SGLANG_SRC`` (or ``load(src)``) names a SGLang checkout or its ``python/`` folder, e.g.
``.engines/sglang`` (docs/sglang.md: the pinned commit). CI cannot fetch SGLang, so without it
the tests that need it skip, saying so. ``load()`` puts the source first on ``sys.path`` and
supplies, for what cannot exist in a test process, the smallest stand-in, each saying below what
it stands for. SGLang's classes under test (``hicache_storage``, ``storage.backend_factory``,
``memory_pool_host``, ``managers.cache_controller``) are always SGLang's own files.

Always:
  * ``sglang`` is loaded as a package without running its ``__init__.py`` (SGLang's frontend
    language: tens of third-party packages); its submodules are SGLang's own files.
  * ``sgl_kernel.kvcacheio`` (SGLang's compiled transfer kernels) is kvtier's drop-in,
    through kvtier's import hook (``kvtier.compat.sgl_kernel_hook``, issue 37 item 4).
  * a third-party package that SGLang's modules import unconditionally at module level but
    that is not installed (``ABSENT_OK``: server, tokenizer, quantisation and vision packages,
    none on the paths under test) is a placeholder module; calling into it returns nothing
    useful, so a test that used one would fail. ``triton``, when absent, is SGLang's own stub
    (``sglang/_triton_stub.py``). ``psutil``, when absent, is ``_PsutilStandIn``; ``dill`` is
    the stdlib pickle (SGLang pickles a class at import).

With torch older than 2.4 (Debian's python3-torch 1.13 on the CPU box; SGLang needs 2.4, its
``layers/attention/fla/utils.py`` asserts it), or where SGLang's ``memory_pool`` does not import
(its closure reaches attention layers, server args and model configs; ``SglangEnv.
stand_in_reason`` says why), also:
  * torch 2.x names SGLang reads: ``torch.dtype.itemsize`` and ``torch.uint64`` (as int64,
    for the pools' pointer tables);
  * ``sglang.jit_kernel`` (JIT-compiled CUDA kernels): ``can_use_hicache_jit_kernel`` is False;
  * ``sglang.srt.mem_cache.memory_pool``: SGLang's GPU device pools, as classes with SGLang's
    constructor arguments holding only the geometry the host pools and the controller read
    (no device memory);
  * ``sglang.srt.utils``: the platform queries (all False) and ``get_device_module`` (CUDA
    streams and events: no-ops on the CPU);
  * ``sglang.srt.distributed`` and ``sglang.srt.layers.dp_attention``: the TP / attention-DP
    rank queries of an initialised torch.distributed group (rank 0 of 1).

Tests set a TP rank with ``set_tp(rank, size)``: it stands for torch.distributed's TP group in
the cache controller's module (where the controller reads it), in both cases.

``load()`` returns an ``SglangEnv`` saying which stand-ins are in use.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Optional

SRC_ENV = "KVTIER_SGLANG_SRC"

# Third-party top-level packages that modules in the import closure of SGLang's mem_cache and
# cache controller import unconditionally at module level (not inside a try or an if: SGLang
# probes optional packages that way, and a placeholder would make a probe say yes), none of them
# used by the paths under test; and sgl_kernel, SGLang's compiled CUDA kernels, imported under
# `if is_cuda()`. Each is a placeholder only where it is not installed.
ABSENT_OK = (
    "IPython", "PIL", "compressed_tensors", "dill", "einops", "gguf", "huggingface_hub", "openai",
    "orjson", "packaging", "partial_json_parser", "psutil", "pybase64", "pydantic", "regex",
    "requests", "safetensors", "sentencepiece", "sgl_kernel", "starlette", "torchvision", "tqdm",
    "transformers", "typing_extensions", "zmq",
)
SHELL_PACKAGES = ("sglang",)


@dataclasses.dataclass
class SglangEnv:
    src: str  # the folder holding the `sglang` package
    commit: Optional[str]
    torch_version: str
    real_device_pools: bool  # SGLang's memory_pool (False: the geometry stand-ins)
    placeholders: list  # third-party packages stood in for (absent here)
    stand_in_reason: Optional[str] = None  # why the torch < 2.4 stand-ins are in use


_env: Optional[SglangEnv] = None


def sglang_python_dir(src: Optional[str] = None) -> Optional[str]:
    """The folder that holds the `sglang` package, from a checkout or its python/ folder."""
    src = src or os.environ.get(SRC_ENV)
    if not src:
        return None
    for cand in (os.path.join(src, "python"), src):
        if os.path.isfile(os.path.join(cand, "sglang", "srt", "mem_cache", "hicache_storage.py")):
            return os.path.abspath(cand)
    raise FileNotFoundError(f"{SRC_ENV}={src} holds no SGLang source (no "
                            f"python/sglang/srt/mem_cache/hicache_storage.py)")


def skip_reason() -> Optional[str]:
    """Why SGLang tests cannot run here (None when they can)."""
    try:
        if sglang_python_dir() is None:
            return (f"SGLang's source is not here: set {SRC_ENV} to a SGLang checkout at the "
                    f"commit docs/sglang.md names (CI cannot fetch it; "
                    f"scripts/sglang_check.sh runs these tests on the GPU machine)")
    except FileNotFoundError as e:
        return str(e)
    return None


def torch_is_recent() -> bool:
    import torch

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 4)


# ---- placeholders for absent third-party packages ---------------------------------------------


class _Nothing:
    """What a placeholder's attribute or call gives: accepts anything, holds nothing, is false."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __setitem__(self, key, value):
        pass

    def __getitem__(self, key):
        return self

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())


class _PlaceholderMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Nothing()


class _PlaceholderBase(metaclass=_PlaceholderMeta):
    """A class of an absent package (SGLang subclasses some at import: pydantic's BaseModel)."""

    def __init__(self, *a, **k):
        pass

    def __init_subclass__(cls, **k):
        pass

    def __class_getitem__(cls, item):
        return cls


class _Placeholder(types.ModuleType):
    """A module of a third-party package that is not installed here (see ABSENT_OK)."""

    def __init__(self, name: str):
        super().__init__(name, f"kvtier test placeholder: {name} is not installed here")
        self.__path__ = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        if full in sys.modules:
            return sys.modules[full]
        if name[:1].isupper():
            value = _PlaceholderMeta(name, (_PlaceholderBase,), {"__module__": self.__name__})
        else:
            value = _Placeholder(full)
            sys.modules[full] = value
        setattr(self, name, value)
        return value

    def __call__(self, *args, **kwargs):  # used as a decorator, or called for nothing
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn


class _PsutilStandIn(types.ModuleType):
    """psutil (absent): virtual_memory() from /proc/meminfo, which HostKVCache checks."""

    def __init__(self):
        super().__init__("psutil", "kvtier test stand-in for psutil.virtual_memory")

    @staticmethod
    def virtual_memory():
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                info[key] = int(value.split()[0]) * 1024
        return types.SimpleNamespace(total=info["MemTotal"], available=info["MemAvailable"])


# ---- stand-ins for torch < 2.4 ---------------------------------------------------------------


def _torch_shims() -> None:
    """torch 2.x names SGLang's pools read, on torch 1.13: dtype.itemsize, torch.uint64."""
    import ctypes
    import gc

    import torch

    if not hasattr(torch.dtype, "itemsize"):
        type_dict = gc.get_referents(torch.dtype.__dict__)[0]
        type_dict["itemsize"] = property(lambda d: torch.empty((), dtype=d).element_size())
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(torch.dtype))
    if not hasattr(torch, "uint64"):
        torch.uint64 = torch.int64  # SGLang keeps data_ptr tables in it; pointers < 2**63


def _device_pools_module(name: str) -> types.ModuleType:
    """sglang.srt.mem_cache.memory_pool on torch < 2.4: SGLang's GPU device pools as their
    geometry only (the attributes the host pools and the cache controller read)."""
    import torch

    m = types.ModuleType(name, "kvtier test stand-in: SGLang's device KV pools, geometry only")

    class KVCache:
        def __init__(self, size, page_size, dtype, layer_num, device, enable_memory_saver,
                     start_layer=None, end_layer=None):
            self.size, self.page_size, self.dtype, self.device = size, page_size, dtype, device
            self.store_dtype = dtype
            self.layer_num = layer_num
            self.start_layer = start_layer or 0
            self.end_layer = end_layer or layer_num - 1
            self.layer_transfer_counter = None

        def register_layer_transfer_counter(self, counter):
            self.layer_transfer_counter = counter

    class MHATokenToKVPool(KVCache):
        def __init__(self, size, page_size, dtype, head_num, head_dim, layer_num, device,
                     enable_memory_saver, v_head_dim=None, swa_head_num=None, swa_head_dim=None,
                     swa_v_head_dim=None, start_layer=None, end_layer=None, **_):
            super().__init__(size, page_size, dtype, layer_num, device, enable_memory_saver,
                             start_layer, end_layer)
            self.head_num, self.head_dim = head_num, head_dim
            self.v_head_dim = v_head_dim or head_dim

    class MLATokenToKVPool(KVCache):
        def __init__(self, size, page_size, dtype, kv_lora_rank, qk_rope_head_dim, layer_num,
                     device, enable_memory_saver, start_layer=None, end_layer=None,
                     use_dsa=False, override_kv_cache_dim=None):
            super().__init__(size, page_size, dtype, layer_num, device, enable_memory_saver,
                             start_layer, end_layer)
            self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
            self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
            self.index_head_dim = None

    class DSATokenToKVPool(MLATokenToKVPool):
        pass

    class MambaPool:
        pass

    class HybridLinearKVPool(KVCache):
        pass

    for cls in (KVCache, MHATokenToKVPool, MLATokenToKVPool, DSATokenToKVPool, MambaPool,
                HybridLinearKVPool):
        cls.__module__ = name
        setattr(m, cls.__name__, cls)
    del torch
    return m


class _CpuDeviceModule:
    """SGLang's get_device_module() on the CPU: CUDA streams and events as no-ops."""

    class Event:
        def record(self, stream=None):
            pass

        def query(self):
            return True

        def wait(self, stream=None):
            pass

        def synchronize(self):
            pass

    class Stream:
        def wait_event(self, event):
            pass

        def synchronize(self):
            pass

    @staticmethod
    def current_stream():
        return _CpuDeviceModule.Stream()

    @staticmethod
    def stream(stream):
        import contextlib

        return contextlib.nullcontext()


def _old_torch_modules(src: str) -> dict:
    """The SGLang modules that cannot import on torch < 2.4, as stand-ins (see the top)."""
    false = lambda *a, **k: False  # noqa: E731
    mods = {}
    jk = types.ModuleType("sglang.jit_kernel", "kvtier test stand-in: SGLang's JIT CUDA kernels")
    jk.__path__ = []
    mods["sglang.jit_kernel"] = jk
    hicache = types.ModuleType("sglang.jit_kernel.hicache", jk.__doc__)
    hicache.can_use_hicache_jit_kernel = false
    for n in ("transfer_hicache_all_layer", "transfer_hicache_all_layer_mla",
              "transfer_hicache_one_layer", "transfer_hicache_one_layer_mla"):
        setattr(hicache, n, None)
    mods["sglang.jit_kernel.hicache"] = hicache
    jk_utils = types.ModuleType("sglang.jit_kernel.utils", jk.__doc__)
    jk_utils.is_arch_support_pdl = false
    mods["sglang.jit_kernel.utils"] = jk_utils
    mods["sglang.srt.mem_cache.memory_pool"] = _device_pools_module(
        "sglang.srt.mem_cache.memory_pool")
    utils = types.ModuleType("sglang.srt.utils", "kvtier test stand-in: SGLang's platform queries")
    utils.__path__ = [os.path.join(src, "sglang", "srt", "utils")]
    for n in ("is_cuda", "is_hip", "is_mps", "is_npu", "is_xpu", "is_musa", "is_cpu"):
        setattr(utils, n, false)
    utils.get_device_module = lambda: _CpuDeviceModule
    mods["sglang.srt.utils"] = utils
    dist = types.ModuleType("sglang.srt.distributed", "kvtier test stand-in: TP rank queries")
    dist.__path__ = []
    dist.get_tensor_model_parallel_rank = lambda: 0
    dist.get_tensor_model_parallel_world_size = lambda: 1
    mods["sglang.srt.distributed"] = dist
    ps = types.ModuleType("sglang.srt.distributed.parallel_state", dist.__doc__)

    def create_custom_parallel_group(group_ranks, backend):
        raise RuntimeError("kvtier test stand-in: no torch.distributed groups on this machine")

    ps.create_custom_parallel_group = create_custom_parallel_group
    mods["sglang.srt.distributed.parallel_state"] = ps
    dp = types.ModuleType("sglang.srt.layers.dp_attention",
                          "kvtier test stand-in: attention-DP rank queries")
    dp.is_dp_attention_enabled = false
    dp.get_attention_dp_rank = lambda: 0
    dp.get_attention_tp_rank = lambda: 0
    dp.get_attention_tp_size = lambda: 1
    mods["sglang.srt.layers.dp_attention"] = dp
    return mods


# ---- the finder -------------------------------------------------------------------------------


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, src: str, provided: dict):
        self.src = src
        self.provided = provided
        self.placeholders = []

    def find_spec(self, name, path, target=None):
        if name in SHELL_PACKAGES:
            spec = importlib.machinery.ModuleSpec(name, self, is_package=True)
            spec.submodule_search_locations = [os.path.join(self.src, *name.split("."))]
            return spec
        if name in self.provided:
            return importlib.machinery.ModuleSpec(name, self, is_package=hasattr(
                self.provided[name], "__path__"))
        top = name.split(".")[0]
        if name == "sgl_kernel.kvcacheio":
            return None  # kvtier's import hook answers it
        if top in ABSENT_OK:
            parent = sys.modules.get(top)
            if isinstance(parent, _Placeholder) or (
                    name == top and importlib.machinery.PathFinder.find_spec(top) is None):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        name = spec.name
        if name in SHELL_PACKAGES:
            return None  # a plain module; exec_module runs nothing
        if name in self.provided:
            return self.provided[name]
        if name == "psutil":
            mod = _PsutilStandIn()
        elif name == "dill":  # SGLang pickles a logit processor class at import (dill.dumps)
            import pickle

            mod = types.ModuleType("dill", "kvtier test stand-in for dill: the stdlib pickle")
            mod.dumps, mod.loads = pickle.dumps, pickle.loads
        else:
            mod = _Placeholder(name)
        if "." not in name:
            self.placeholders.append(name)
        return mod

    def exec_module(self, module):
        if module.__name__ in SHELL_PACKAGES:
            module.__path__ = [os.path.join(self.src, *module.__name__.split("."))]
            module.__file__ = os.path.join(module.__path__[0], "__init__.py")


def _install_sglang_triton_stub(src: str) -> bool:
    """SGLang's own triton stub (sglang/_triton_stub.py) where triton is not installed."""
    if importlib.util.find_spec("triton") is not None:
        return False
    path = os.path.join(src, "sglang", "_triton_stub.py")
    spec = importlib.util.spec_from_file_location("kvtier_tests_sglang_triton_stub", path)
    stub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stub)
    stub.install()  # its finder and modules answer every `import triton...`
    return True


def load(src: Optional[str] = None) -> SglangEnv:
    """Makes SGLang's source importable (idempotent). Raises FileNotFoundError without it."""
    global _env
    python_dir = sglang_python_dir(src)
    if python_dir is None:
        raise FileNotFoundError(skip_reason())
    if _env is not None:
        if _env.src != python_dir:
            raise RuntimeError(f"SGLang already loaded from {_env.src}, not {python_dir}")
        return _env
    import torch

    import kvtier.compat.sgl_kernel_hook as hook

    recent = torch_is_recent()
    provided = {}
    if not recent:
        _torch_shims()
        provided = _old_torch_modules(python_dir)
    sys.path.insert(0, python_dir)
    finder = _Finder(python_dir, provided)
    sys.meta_path.insert(0, finder)
    if _install_sglang_triton_stub(python_dir):
        finder.placeholders.append("triton (SGLang's _triton_stub)")
    hook.install()
    reason = None if recent else f"torch {torch.__version__} < 2.4"
    if recent:
        # SGLang's device pools import much of SGLang (attention layers, server args, model
        # configs); where that fails on this machine (a package version SGLang does not expect),
        # the host pools, the storage API and the controller still run on the stand-ins, and
        # the environment says why.
        try:
            importlib.import_module("sglang.srt.mem_cache.memory_pool")
        except Exception as e:  # noqa: BLE001 - any import failure, reported
            import traceback

            where = traceback.extract_tb(e.__traceback__)[-3:]
            reason = (f"SGLang's memory_pool does not import here: {type(e).__name__}: {e} (at "
                      + " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}"
                                    for f in reversed(where)) + ")")
            for name in [n for n in sys.modules if n.startswith("sglang.")]:
                del sys.modules[name]
            finder.provided.update(_old_torch_modules(python_dir))
            recent = False
    commit = None
    commit_file = os.path.join(os.path.dirname(python_dir), "COMMIT")
    if os.path.isfile(commit_file):
        commit = open(commit_file).readline().strip()
    _env = SglangEnv(src=python_dir, commit=commit, torch_version=torch.__version__,
                     real_device_pools=recent, placeholders=finder.placeholders,
                     stand_in_reason=reason)
    return _env


def set_tp(rank: int, size: int) -> None:
    """Stands for an initialised TP group of `size` ranks in which this process is `rank`:
    what SGLang's cache controller asks torch.distributed (through sglang.srt.distributed)."""
    cc = importlib.import_module("sglang.srt.managers.cache_controller")
    cc.get_tensor_model_parallel_rank = lambda: rank
    cc.get_tensor_model_parallel_world_size = lambda: size
    cc.is_dp_attention_enabled = lambda: False


# ---- SGLang's pools and storage config, as SGLang's scheduler builds them ---------------------

# Model shapes (per TP rank 0 of 1): the KV of Llama-3-8B (MHA: 8 KV heads of 128) and of
# DeepSeek-V3 (MLA: a 512 + 64 latent).
LLAMA3_8B = dict(mla=False, layer_num=32, head_num=8, head_dim=128)
DEEPSEEK_V3 = dict(mla=True, layer_num=61, kv_lora_rank=512, qk_rope_head_dim=64)


def make_pools(mla: bool, layout: str, page_size: int, device_tokens: int, layer_num: int,
               head_num: int = 2, head_dim: int = 64, kv_lora_rank: int = 96,
               qk_rope_head_dim: int = 32, host_ratio: float = 2.0, dtype=None):
    """SGLang's device pool and its host pool (MHATokenToKVPoolHost / MLATokenToKVPoolHost).

    The device pool is SGLang's on a CUDA device when there is one and SGLang's memory_pool
    imports (torch >= 2.4), else the geometry stand-in on the CPU. The host pool is pinned
    (cudaHostRegister, SGLang's default) with CUDA, plain memory without.
    """
    import torch

    from sglang.srt.mem_cache import memory_pool as mp
    from sglang.srt.mem_cache import memory_pool_host as mph

    dtype = dtype or torch.bfloat16
    cuda = torch.cuda.is_available() and _env is not None and _env.real_device_pools
    device = "cuda" if cuda else "cpu"
    if mla:
        dev = mp.MLATokenToKVPool(size=device_tokens, page_size=page_size, dtype=dtype,
                                  kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
                                  layer_num=layer_num, device=device, enable_memory_saver=False)
        host = mph.MLATokenToKVPoolHost(dev, host_ratio, 0, page_size, layout, pin_memory=cuda,
                                        device="cpu")
    else:
        dev = mp.MHATokenToKVPool(size=device_tokens, page_size=page_size, dtype=dtype,
                                  head_num=head_num, head_dim=head_dim, layer_num=layer_num,
                                  device=device, enable_memory_saver=False)
        host = mph.MHATokenToKVPoolHost(dev, host_ratio, 0, page_size, layout, pin_memory=cuda,
                                        device="cpu")
    return dev, host


def kvtier_extra_config(url: str, **fields) -> dict:
    """The extra_config of docs/sglang.md's launch line, for `url`."""
    return {"backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
            "class_name": "KvtierHiCacheStorage", "interface_v1": 1, "url": url, **fields}


def storage_config(host, mla: bool, extra_config: Optional[dict], tp_rank: int = 0,
                   tp_size: int = 1, model_name: str = "test/model", metrics: bool = False):
    """HiCacheStorageConfig as SGLang's controller fills it (_generate_storage_config)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=metrics,
        is_page_first_layout=host.layout == "page_first", model_name=model_name,
        extra_config=None if extra_config is None else dict(extra_config))


def host_bytes(host):
    """The host pool's whole KV buffer as a writable numpy uint8 array (no copy)."""
    import ctypes

    import numpy as np

    buf = host.kv_buffer
    nbytes = buf.numel() * buf.element_size()
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(buf.data_ptr()))


def page_bytes(host, first_index: int):
    """One page's bytes as SGLang places them (get_page_buffer_meta), parts concatenated."""
    import ctypes

    import numpy as np
    import torch

    idx = torch.arange(first_index, first_index + host.page_size, dtype=torch.int64)
    ptrs, sizes = host.get_page_buffer_meta(idx)
    return np.concatenate([
        np.ctypeslib.as_array((ctypes.c_uint8 * int(s)).from_address(int(p))).copy()
        for p, s in zip(ptrs, sizes)])
