"""SGLang's HiCache cache controller (managers/cache_controller.py) on kvtier's storage backend.

The controller is SGLang's own, built as SGLang's HiRadixCache builds it, with the storage
backend attached from the launch line's extra_config ("dynamic", interface_v1): its backup
thread writes host pages to kvtier (write_storage -> batch_set_v1) and its prefetch threads
query and read them (prefetch -> batch_exists -> batch_get_v1) into poisoned host pages, checked
byte for byte. On a GPU the whole way is taken: device pages backed up to host by the
controller's kernel io backend (SGLang's sgl_kernel.kvcacheio calls, answered by kvtier through
its import hook), stored, prefetched into other host pages and loaded back into other device
slots, every byte compared.

Needs SGLang's source (KVTIER_SGLANG_SRC); see sglang_harness for what stands in for what.
"""

import threading
import time

import numpy as np
import pytest

import sglang_harness as harness
from test_sglang_storage import (
    POISON,
    assert_only_pages_written,
    assert_pages,
    fill_random,
    poison,
    snapshot,
)

pytestmark = pytest.mark.skipif(harness.skip_reason() is not None,
                                reason=harness.skip_reason() or "")

DEADLINE_S = 120  # bounded waits for the controller's threads (never a timing assertion)


@pytest.fixture(scope="module")
def sgl():
    env = harness.load()
    harness.set_tp(0, 1)
    return env


class _AllocatorOfPool:
    """Stands for SGLang's device-slot allocator where there is no GPU: the controller's
    storage paths ask it only for the device pool."""

    def __init__(self, pool):
        self.pool = pool

    def get_kvcache(self):
        return self.pool


def make_controller(sgl, url, mla, layout="page_first", page_size=16, layer_num=4,
                    io_backend="kernel"):
    import torch

    from sglang.srt.managers.cache_controller import HiCacheController

    dev, host = harness.make_pools(mla, layout, page_size, device_tokens=512, layer_num=layer_num)
    if dev.device == "cuda":
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator

        allocator = PagedTokenToKVPoolAllocator(dev.size, page_size, dev.dtype, "cuda", dev,
                                                need_sort=False)
    else:
        allocator = _AllocatorOfPool(dev)
    ctrl = HiCacheController(
        allocator, host, page_size, tp_group=None, load_cache_event=threading.Event(),
        write_policy="write_through", io_backend=io_backend, storage_backend="dynamic",
        prefetch_threshold=page_size, model_name="test/model",
        storage_backend_extra_config=harness.kvtier_extra_config(url))
    return ctrl, dev, host, allocator, torch


def chain_keys(ctrl, tokens):
    keys, last = [], None
    p = ctrl.page_size
    for i in range(0, len(tokens), p):
        last = ctrl.get_hash_str(tokens[i:i + p], last)
        keys.append(last)
    return keys


def wait_for(pred, what):
    deadline = time.monotonic() + DEADLINE_S
    while not pred():
        assert time.monotonic() < deadline, f"{what} did not happen within {DEADLINE_S} s"
        time.sleep(0.01)


def backup(ctrl, host_idx, tokens):
    keys = chain_keys(ctrl, tokens)
    op_id = ctrl.write_storage(host_idx, tokens, hash_value=keys)
    op = ctrl.ack_backup_queue.get(timeout=DEADLINE_S)
    assert op.id == op_id
    return op, keys


@pytest.mark.parametrize("mla,layout", [(False, "layer_first"), (False, "page_first"),
                                        (False, "page_first_direct"), (True, "layer_first"),
                                        (True, "page_first")])
def test_write_back_then_prefetch_every_byte(sgl, tmp_path, mla, layout):
    from kvtier.integrations.sglang import KvtierHiCacheStorage

    ctrl, dev, host, _, torch = make_controller(sgl, f"file://{tmp_path}/s", mla, layout)
    try:
        assert isinstance(ctrl.storage_backend, KvtierHiCacheStorage)
        assert ctrl.page_get_func == ctrl._page_get_zero_copy  # interface_v1 taken
        p, n = ctrl.page_size, 6
        tokens = list(range(1000, 1000 + n * p))
        src = host.alloc(n * p)
        fill_random(host, seed=21)
        src_pages = (src[::p] // p).tolist()
        written = snapshot(host, src_pages)
        op, keys = backup(ctrl, src, tokens)
        assert op.completed_tokens == n * p
        assert ctrl.storage_backend.batch_exists(keys) == n

        dst = host.alloc(n * p)
        poison(host)
        pre = ctrl.prefetch("req-1", dst, tokens, last_hash=None)
        wait_for(lambda: pre.completed_tokens == n * p, "the prefetch")
        assert pre.hash_value == keys
        dst_pages = (dst[::p] // p).tolist()
        assert_pages(host, dst_pages, written)
        assert_only_pages_written(host, dst_pages)
    finally:
        ctrl.detach_storage_backend()


def test_prefetch_stops_at_the_first_missing_page(sgl, tmp_path):
    ctrl, dev, host, _, torch = make_controller(sgl, f"file://{tmp_path}/s", mla=False)
    try:
        p = ctrl.page_size
        tokens = list(range(7, 7 + 5 * p))
        src = host.alloc(3 * p)
        fill_random(host, seed=4)
        written = snapshot(host, (src[::p] // p).tolist())
        backup(ctrl, src, tokens[:3 * p])  # the first three pages of five
        dst = host.alloc(5 * p)
        poison(host)
        pre = ctrl.prefetch("req-2", dst, tokens, last_hash=None)
        wait_for(lambda: pre.completed_tokens == 3 * p, "the prefetch of the stored prefix")
        released = []
        wait_for(lambda: released.extend(_drain(ctrl.host_mem_release_queue)) or
                 sum(len(x) for x in released) >= 2 * p, "the release of the missing pages")
        assert_pages(host, (dst[:3 * p:p] // p).tolist(), written)
        assert_only_pages_written(host, (dst[:3 * p:p] // p).tolist())

        short = list(range(99999, 99999 + 2 * p))  # nothing stored: below the threshold
        dst2 = host.alloc(2 * p)
        ctrl.prefetch("req-3", dst2, short, last_hash=None)
        assert ctrl.prefetch_revoke_queue.get(timeout=DEADLINE_S) == "req-3"
    finally:
        ctrl.detach_storage_backend()


def _drain(q):
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


def test_device_to_storage_and_back_on_gpu(sgl, tmp_path):
    """GPU: device -> host (controller.write, kernel io backend = kvtier's sgl_kernel drop-in)
    -> storage -> host (prefetch) -> device (controller.load), every byte."""
    import torch

    if not (torch.cuda.is_available() and sgl.real_device_pools):
        pytest.skip("needs a CUDA device and SGLang's device pools (torch >= 2.4)")
    import sgl_kernel.kvcacheio as kvcacheio

    assert kvcacheio.__kvtier__  # the host pools' transfers are kvtier's
    ctrl, dev, host, allocator, _ = make_controller(sgl, f"file://{tmp_path}/s", mla=False,
                                                    layout="page_first", layer_num=4)
    try:
        p, n = ctrl.page_size, 8
        src_dev = allocator.alloc(n * p)
        g = torch.Generator(device="cuda").manual_seed(5)
        for layer in range(dev.layer_num):
            for buf in (dev.k_buffer[layer], dev.v_buffer[layer]):
                bits = buf.view(torch.int16)
                bits.copy_(torch.randint(-2**15, 2**15, bits.shape, device="cuda",
                                         dtype=torch.int16, generator=g))
        want = [(dev.k_buffer[l][src_dev].clone(), dev.v_buffer[l][src_dev].clone())
                for l in range(dev.layer_num)]
        host_src = ctrl.write(src_dev, node_id=1)
        ctrl.start_writing()
        ack = ctrl.ack_write_queue.pop(0)
        ack.finish_event.synchronize()
        tokens = list(range(50, 50 + n * p))
        op, keys = backup(ctrl, host_src, tokens)
        assert op.completed_tokens == n * p

        host_dst = host.alloc(n * p)
        poison(host)
        pre = ctrl.prefetch("req-gpu", host_dst, tokens, last_hash=None)
        wait_for(lambda: pre.completed_tokens == n * p, "the prefetch")
        dst_dev = ctrl.load(host_dst, node_id=2)
        for l in range(dev.layer_num):
            dev.k_buffer[l][dst_dev] = 0
            dev.v_buffer[l][dst_dev] = 0
        ctrl.start_loading()
        ctrl.ack_load_queue.pop(0).finish_event.synchronize()
        for l, (k, v) in enumerate(want):
            assert torch.equal(dev.k_buffer[l][dst_dev].view(torch.int16), k.view(torch.int16))
            assert torch.equal(dev.v_buffer[l][dst_dev].view(torch.int16), v.view(torch.int16))
    finally:
        ctrl.detach_storage_backend()
