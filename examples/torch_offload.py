#!/usr/bin/env python3
"""Offload a KV cache to host memory with kvtier, evict it from the GPU, and load it back layer by
layer while a toy attention step consumes each layer as soon as it has arrived.

  1. A request's KV (L layers, `tokens` slots of a layer_first device pool) is computed
     (random here) and a reference attention output is taken per layer.
  2. Offload: every layer is copied into a pinned host pool (page_first: one token's layers are
     contiguous, the layout a storage tier wants) with one all-layer transfer.
  3. Evict: the device slots are overwritten (another request reuses them).
  4. Load back into fresh device slots on a copy stream, recording one CUDA event per layer
     (kvtier.LayerEvents). The compute stream waits for layer l's event on the device — the host
     never blocks — and runs attention on layer l while layers l+1.. are still in flight.
  5. Check: the reloaded KV equals the original bit for bit, and so does every layer's attention
     output.

Run:  PYTHONPATH=<build>/python python3 examples/torch_offload.py [--backend kernel|dma|auto]
"""

import argparse
import sys
import time

import torch

import kvtier
from kvtier import ops


def attention(q, k, v):
    """Single-query attention over one layer: q [H, D], k/v [T, H, D] -> [H, D]."""
    scores = torch.einsum("hd,thd->ht", q.float(), k.float()) / k.shape[-1] ** 0.5
    return torch.einsum("ht,thd->hd", scores.softmax(dim=-1), v.float())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="kernel", choices=["kernel", "dma", "auto"])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--pool-slots", type=int, default=16384)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("torch_offload: needs a CUDA GPU", file=sys.stderr)
        return 2
    if not kvtier.built_with_cuda():
        print("torch_offload: kvtier was built without CUDA (KVTIER_CUDA=OFF)", file=sys.stderr)
        return 2

    L, N, H, D, T = args.layers, args.pool_slots, args.heads, args.head_dim, args.tokens
    dtype = torch.bfloat16
    dev = torch.device("cuda")
    slot_bytes = H * D * dtype.itemsize
    gen = torch.Generator(device="cpu").manual_seed(0)

    # L1: the engine's device pool (layer_first [L, N, H, D]); L2: a pinned host pool (page_first).
    dev_k = torch.randn((L, N, H, D), dtype=dtype, device=dev)
    dev_v = torch.randn((L, N, H, D), dtype=dtype, device=dev)
    host_k = torch.empty((N, L, H, D), dtype=dtype, pin_memory=True)
    host_v = torch.empty((N, L, H, D), dtype=dtype, pin_memory=True)
    device_pool = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=slot_bytes,
                               k=dev_k, v=dev_v, name="device_pool")
    host_pool = ops.KvRegion(layout="page_first", num_layers=L, slot_bytes=slot_bytes,
                             k=host_k, v=host_v, name="host_pool")

    # 1. The request's KV and the reference attention of every layer.
    slots = torch.randperm(N, generator=gen)[:T].to(dev)
    q = torch.randn((H, D), dtype=dtype, device=dev)
    original_k = dev_k[:, slots].clone()
    original_v = dev_v[:, slots].clone()
    reference = [attention(q, dev_k[l, slots], dev_v[l, slots]) for l in range(L)]

    # 2. Offload every layer to the host pool (device indices; kvtier enqueues on torch's stream).
    host_slots = torch.randperm(N, generator=gen)[:T].to(dev)
    ops.transfer_all_layers(device_pool, host_pool, slots, host_slots, backend=args.backend)
    torch.cuda.synchronize()

    # 3. Evict: another request overwrites the slots.
    dev_k[:, slots] = float("nan")
    dev_v[:, slots] = float("nan")

    # 4. Load back into fresh slots, layer by layer, overlapped with attention.
    new_slots = torch.randperm(N, generator=gen)[:T].to(dev)
    events = kvtier.LayerEvents(L, device=dev.index or 0)
    copy_stream = torch.cuda.Stream()
    copy_stream.wait_stream(torch.cuda.current_stream())  # after the eviction writes
    start = time.perf_counter()
    ops.transfer(host_pool, device_pool, host_slots, new_slots, src_layer=0, dst_layer=0,
                 num_layers=L, backend=args.backend, stream=copy_stream, layer_events=events)
    enqueued = time.perf_counter()
    outputs = []
    for layer in range(L):
        events.wait(layer)  # the current (compute) stream waits on the device for this layer
        outputs.append(attention(q, dev_k[layer, new_slots], dev_v[layer, new_slots]))
    torch.cuda.synchronize()
    done = time.perf_counter()
    ops.synchronize(args.backend, stream=copy_stream)  # raises any deferred device error

    # 5. Check.
    kv_equal = (torch.equal(dev_k[:, new_slots].view(torch.int16), original_k.view(torch.int16))
                and torch.equal(dev_v[:, new_slots].view(torch.int16),
                                original_v.view(torch.int16)))
    out_equal = all(torch.equal(o, r) for o, r in zip(outputs, reference))
    moved = 2 * L * T * slot_bytes
    print(f"torch_offload: backend={args.backend} layers={L} tokens={T} "
          f"slot_bytes={slot_bytes} moved={moved / 2**20:.1f} MiB each way")
    print(f"  load-back + attention: {(done - start) * 1e3:.2f} ms "
          f"(enqueue {(enqueued - start) * 1e6:.0f} us, {moved / (done - start) / 1e9:.2f} GB/s "
          "incl. attention)")
    print(f"  reloaded KV equals original: {kv_equal}; attention outputs equal: {out_equal}")
    if not (kv_equal and out_equal):
        print("torch_offload: MISMATCH", file=sys.stderr)
        return 1
    print("torch_offload: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
