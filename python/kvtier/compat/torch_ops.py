"""kvtier.compat.sgl_kernel's functions as PyTorch custom ops: ``torch.ops.kvtier.<name>``.

The schemas are sgl_kernel's (``torch.ops.sgl_kernel.transfer_kv_*``), with the destinations
marked as written (``Tensor(a!)``), so ``torch.compile`` can trace through a call: the op is opaque
to the compiler, its Meta kernel does nothing (the ops return nothing and write in place), and at
run time the CPU and CUDA kernels call the compat functions, which read their arguments in C++.

Registered when this module is imported; ``kvtier.compat.sgl_kernel`` imports it itself when
PyTorch was already imported (importing kvtier never imports torch).

Thread safety: registration runs once, at import.
"""

from __future__ import annotations

import torch

from . import sgl_kernel as _kv

_KERNEL = "int block_quota=2, int num_warps_per_block=32"
_SCHEMAS = {
    "transfer_kv_per_layer":
        "Tensor src_k, Tensor(a!) dst_k, Tensor src_v, Tensor(b!) dst_v, Tensor src_indices, "
        f"Tensor dst_indices, int item_size, {_KERNEL}",
    "transfer_kv_per_layer_pf_lf":
        "Tensor src_k, Tensor(a!) dst_k, Tensor src_v, Tensor(b!) dst_v, Tensor src_indices, "
        f"Tensor dst_indices, int layer_id, int item_size, int src_layout_dim, {_KERNEL}",
    "transfer_kv_per_layer_ph_lf":
        "Tensor src_k, Tensor(a!) dst_k, Tensor src_v, Tensor(b!) dst_v, Tensor src_indices, "
        "Tensor dst_indices, int layer_id, int item_size, int src_layout_dim, int page_size, "
        f"int head_num, {_KERNEL}",
    # The all-layer tables hold addresses: what they point to is written, not the tables.
    "transfer_kv_all_layer":
        "Tensor src_k_layers, Tensor dst_k_layers, Tensor src_v_layers, Tensor dst_v_layers, "
        f"Tensor src_indices, Tensor dst_indices, int item_size, int num_layers, {_KERNEL}",
    "transfer_kv_all_layer_lf_pf":
        "Tensor src_k_layers, Tensor(a!) dst_k, Tensor src_v_layers, Tensor(b!) dst_v, "
        "Tensor src_indices, Tensor dst_indices, int item_size, int dst_layout_dim, "
        f"int num_layers, {_KERNEL}",
    "transfer_kv_all_layer_lf_ph":
        "Tensor src_k_layers, Tensor(a!) dst_k, Tensor src_v_layers, Tensor(b!) dst_v, "
        "Tensor src_indices, Tensor dst_indices, int item_size, int dst_layout_dim, "
        f"int num_layers, int page_size, int head_num, {_KERNEL}",
    "transfer_kv_per_layer_mla":
        "Tensor src, Tensor(a!) dst, Tensor src_indices, Tensor dst_indices, int item_size, "
        f"{_KERNEL}",
    "transfer_kv_per_layer_mla_pf_lf":
        "Tensor src, Tensor(a!) dst, Tensor src_indices, Tensor dst_indices, int layer_id, "
        f"int item_size, int src_layout_dim, {_KERNEL}",
    "transfer_kv_all_layer_mla":
        "Tensor src_layers, Tensor dst_layers, Tensor src_indices, Tensor dst_indices, "
        f"int item_size, int num_layers, {_KERNEL}",
    "transfer_kv_all_layer_mla_lf_pf":
        "Tensor src_layers, Tensor(a!) dst, Tensor src_indices, Tensor dst_indices, "
        f"int item_size, int dst_layout_dim, int num_layers, {_KERNEL}",
    "transfer_kv_direct":
        "Tensor[] src_layers, Tensor(a!)[] dst_layers, Tensor src_indices, Tensor dst_indices, "
        "int page_size",
    "transfer_kv_per_layer_direct_pf_lf":
        "Tensor[] src_ptrs, Tensor(a!)[] dst_ptrs, Tensor src_indices, Tensor dst_indices, "
        "int layer_id, int page_size",
    "transfer_kv_all_layer_direct_lf_pf":
        "Tensor[] src_ptrs, Tensor(a!)[] dst_ptrs, Tensor src_indices, Tensor dst_indices, "
        "int page_size",
}


def _meta(*args, **kwargs) -> None:
    """Shape-only execution (torch.compile tracing): the ops write in place and return nothing."""


def _register() -> torch.library.Library:
    lib = torch.library.Library("kvtier", "DEF")
    for name, arguments in _SCHEMAS.items():
        lib.define(f"{name}({arguments}) -> ()")
        fn = getattr(_kv, name)
        lib.impl(name, fn, "CPU")
        lib.impl(name, fn, "CUDA")
        lib.impl(name, _meta, "Meta")
    return lib


_lib = _register()
