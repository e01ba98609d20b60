#!/usr/bin/env python3
"""A tensor-parallel group of torch.distributed ranks sharing one kvtier cache decision.

Each rank process holds its half of the KV heads in a device pool of its own (cuda:rank, or the
cpu device). Rank 0 runs the group's only kvtier.HierarchicalCache; the other ranks are
kvtier.TpFollowers that apply its decisions (load-backs, backups, prefetches) to their own pools
through a ring in shared memory. torch.distributed (gloo) is used for setup only — to agree on the
group's name — and nothing on the cache's path is a collective.

A shared prefix is reused through every tier, and every rank checks the bytes it holds for every
hit against its heads' pattern:
  1. cold: the prefix and a suffix are computed (a deterministic pattern per token, position,
     layer and head) and inserted; write-through backs them up to host memory and the store;
  2. device hit: the prefix is on the device;
  3. host hit: after the device is emptied, load_back copies it from host memory on every rank;
  4. storage hit: after device and host are emptied, query_storage + prefetch + load_back read
     every rank's heads from the per-head file store;
  5. TP=1 (rank 0 alone, after the group closed): a pool of all heads reads the store the TP=2
     group filled — the stored bytes do not depend on the TP size.

Run:  PYTHONPATH=<build>/python python3 examples/tp_torch_distributed.py [--device gpu|cpu|auto]
      (or under torchrun --nproc-per-node 2; RANK / WORLD_SIZE / MASTER_* are then taken as given)
Exit status 0 when every rank's bytes were right, 1 otherwise, 2 when it cannot run here.
"""

import argparse
import array
import datetime
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kvtier
from kvtier import ops

WRITE, VERIFY = 1, 2


def pattern(tokens, rank, tp, args, device):
    """KV values [L, T, H/tp, D] (k, v) of rank `rank`'s heads: small integers (exact in bf16)
    that depend on the token, its position, the layer and the global head and dimension."""
    hr = args.heads // tp
    t = torch.tensor(tokens, dtype=torch.int64, device=device)[None, :, None, None]
    pos = torch.arange(len(tokens), device=device)[None, :, None, None]
    layer = torch.arange(args.layers, device=device)[:, None, None, None]
    head = (rank * hr + torch.arange(hr, device=device))[None, None, :, None]
    dim = torch.arange(args.head_dim, device=device)[None, None, None, :]
    k = (t * 7 + pos * 13 + layer * 29 + head * 31 + dim * 3) % 251
    return k.to(torch.bfloat16), ((k + 101) % 251).to(torch.bfloat16)


def make_pool(rank, tp, args, device):
    shape = (args.layers, args.pool_slots, args.heads // tp, args.head_dim)
    k = torch.zeros(shape, dtype=torch.bfloat16, device=device)
    v = torch.zeros(shape, dtype=torch.bfloat16, device=device)
    region = ops.KvRegion(layout="layer_first", num_layers=args.layers,
                          slot_bytes=(args.heads // tp) * args.head_dim * 2, k=k, v=v,
                          page_size=args.page_size, head_num=args.heads // tp,
                          name=f"rank{rank}_pool")
    return region, k, v


def encode(kind, tokens, slots):
    head = array.array("q", [kind, len(tokens)])
    return head.tobytes() + array.array("q", tokens).tobytes() + array.array("q", slots).tobytes()


def decode(message):
    values = array.array("q")
    values.frombytes(message)
    kind, n = values[0], values[1]
    return kind, list(values[2:2 + n]), list(values[2 + n:2 + 2 * n])


def apply_step(message, k, v, rank, tp, args):
    """Writes (WRITE) or checks (VERIFY) this rank's heads of the step's slots; the bytes checked.
    RuntimeError naming the first wrong token. Returns after the device work completed."""
    kind, tokens, slots = decode(message)
    if not slots:
        return 0
    idx = torch.tensor(slots, dtype=torch.int64, device=k.device)
    want_k, want_v = pattern(tokens, rank, tp, args, k.device)
    if kind == WRITE:
        k[:, idx], v[:, idx] = want_k, want_v
        if k.is_cuda:
            torch.cuda.synchronize(k.device)  # the next decision may back these slots up
        return 0
    for name, have, want in (("k", k[:, idx], want_k), ("v", v[:, idx], want_v)):
        bad = (have != want).flatten(2).any(dim=2).any(dim=0).nonzero()
        if len(bad):
            i = int(bad[0])
            raise RuntimeError(f"rank {rank}: {name} of token {i} (slot {slots[i]}) is wrong "
                               f"({len(bad)} tokens)")
    return 2 * want_k.numel() * want_k.element_size()


def settings(args, storage):
    return dict(host_layout="page_head", write_policy="write_through", backup_threads=0,
                storage=storage, storage_model_id="tp-torch-distributed-example",
                prefetch_threshold_tokens=0, prefetch_policy="wait_complete")


class Leader:
    def __init__(self, cache, k, v, tp, args):
        self.cache, self.k, self.v, self.tp, self.args = cache, k, v, tp, args
        self.checked = [0] * tp  # bytes each rank checked

    def step(self, kind, tokens, slots):
        msg = encode(kind, tokens, slots)
        seq = self.cache.tp_publish(msg)  # to every follower, after the copies decided so far
        self.checked[0] += apply_step(msg, self.k, self.v, 0, self.tp, self.args)
        self.cache.tp_wait_applied(seq)  # point to point: each follower's acknowledgement
        for r in range(1, self.tp):
            self.checked[r] += self.cache.tp_result(r, seq)

    def serve(self, tokens):
        with self.cache.match(tokens) as m:
            self.cache.query_storage(m)
            self.cache.prefetch(m)
            loaded = self.cache.load_back(m)
            hit = [int(s) for s in loaded.device_slots]
            if hit:
                self.step(VERIFY, tokens[:len(hit)], hit)
            new = [int(s) for s in self.cache.allocate_device_slots(len(tokens) - len(hit))]
            self.step(WRITE, tokens[len(hit):], new)
            self.cache.insert(tokens, hit + new)
        self.cache.wait_for_backups()
        return m, loaded


def run_leader(group, device, args, store):
    region, k, v = make_pool(0, group.size, args, device)
    cache = kvtier.HierarchicalCache(region, tp_group=group, slots_on_device=False,
                                     **settings(args, store))
    leader = Leader(cache, k, v, group.size, args)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 50000, (args.prefix_tokens,), generator=gen).tolist()
    requests = [prefix + torch.randint(0, 50000, (args.page_size * 4,), generator=gen).tolist()
                for _ in range(4)]
    P = args.prefix_tokens
    failures = []

    def expect(what, ok):
        print(f"  {what}: {'ok' if ok else 'WRONG'}")
        if not ok:
            failures.append(what)

    t0 = time.perf_counter()
    m, _ = leader.serve(requests[0])
    expect("cold request: no hit", m.device_tokens == 0)
    m, _ = leader.serve(requests[1])
    expect(f"device hit of the {P}-token prefix", m.device_tokens == P)
    cache.evict_device(args.pool_slots)
    m, loaded = leader.serve(requests[2])
    expect("host hit, loaded back on every rank",
           (m.device_tokens, m.host_tokens, loaded.loaded_tokens) == (0, P, P))
    cache.evict_device(args.pool_slots)
    cache.evict_host(1 << 40)
    m, loaded = leader.serve(requests[3])
    expect("storage hit, prefetched and loaded on every rank",
           m.storage_tokens == P and loaded.loaded_tokens == P)
    elapsed = time.perf_counter() - t0
    per_rank = 3 * P * args.layers * 2 * (args.heads // group.size) * args.head_dim * 2
    for r, n in enumerate(leader.checked):
        expect(f"rank {r}: {n} bytes of hits checked (3 hits x {P} tokens = {per_rank})",
               n == per_rank)
    stats = cache.tp_stats()
    print(f"  decisions: {stats['records']} records, {stats['record_bytes']} bytes; the leader "
          f"waited for its followers {stats['waits']} times (point to point; collectives on the "
          f"cache path: 0), {stats['ack_wait_seconds'] * 1e3:.1f} ms in all; {elapsed:.2f} s")
    cache.close()  # closes the ring: the followers' serve_until_closed returns

    # TP=1 over the store the TP=2 group filled: every head of the prefix.
    region1, k1, v1 = make_pool(0, 1, args, device)
    alone = kvtier.TpGroup(group.name + ".tp1", 1, 0)
    with kvtier.HierarchicalCache(region1, tp_group=alone, slots_on_device=False,
                                  **settings(args, store)) as one:
        with one.match(prefix + [1, 2, 3]) as m:  # a new suffix: the prefix's pages match
            one.query_storage(m)
            one.prefetch(m)
            slots = [int(s) for s in one.load_back(m).device_slots]
        n = apply_step(encode(VERIFY, prefix[:len(slots)], slots), k1, v1, 0, 1, args)
        expect(f"TP=1 reads the store TP={group.size} filled: {len(slots)} tokens, every head",
               len(slots) == P and n > 0)
    return failures


def run_follower(group, device, args, store):
    region, k, v = make_pool(group.rank, group.size, args, device)
    with kvtier.TpFollower(region, group, **settings(args, store)) as f:
        f.serve_until_closed(
            lambda msg: apply_step(msg, k, v, group.rank, group.size, args))
        print(f"  rank {group.rank}: applied {f.stats()['records']} decisions")


def worker(rank, world, args, store, port):
    if port is not None:  # started by this script (not torchrun): one host, over loopback
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(world))
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # Setup only (the group's name); a rank that never comes fails the others within a minute.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    device = torch.device("cuda", rank) if args.gpu else torch.device("cpu")
    if args.gpu:
        torch.cuda.set_device(device)
    group = kvtier.TpGroup.from_torch_distributed(f"kvtier-tp-example.{os.getpid()}",
                                                  ack_timeout_s=args.timeout)
    try:
        if rank == 0:
            print(f"tp_torch_distributed: TP={group.size}, device pools on "
                  f"{'cuda:0..' + str(group.size - 1) if args.gpu else 'the cpu device'}, "
                  f"{args.layers} layers, {args.heads} KV heads ({args.heads // group.size} a "
                  f"rank), store {store}")
            failures = run_leader(group, device, args, store)
            if failures:
                raise SystemExit(f"tp_torch_distributed: FAIL ({', '.join(failures)})")
            print("tp_torch_distributed: PASS")
        else:
            run_follower(group, device, args, store)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=["auto", "gpu", "cpu"])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--pool-slots", type=int, default=4096)
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=30.0, help="ack_timeout_s of the group")
    parser.add_argument("--storage", default=None, help="file store directory (default: a temp dir)")
    args = parser.parse_args()
    gpus = torch.cuda.device_count() if kvtier.built_with_cuda() else 0
    if args.device == "gpu" and gpus < args.tp:
        print(f"tp_torch_distributed: --device gpu needs {args.tp} GPUs and a CUDA build of "
              f"kvtier; found {gpus}", file=sys.stderr)
        return 2
    args.gpu = args.device == "gpu" or (args.device == "auto" and gpus >= args.tp)
    if args.heads % args.tp or args.prefix_tokens % args.page_size:
        print("tp_torch_distributed: --heads must split over --tp ranks and --prefix-tokens be "
              "whole pages", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kvtier-tp-example-") as tmp:
        store = f"file://{os.path.abspath(args.storage or tmp)}"
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun started this rank
            if args.storage is None:
                print("tp_torch_distributed: under torchrun every rank needs the same --storage "
                      "DIR", file=sys.stderr)
                return 2
            worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, store, None)
            return 0
        try:
            mp.spawn(worker, args=(args.tp, args, store, free_port()), nprocs=args.tp, join=True)
        except Exception as e:  # a rank failed: its message is above
            print(f"tp_torch_distributed: FAIL ({e.__class__.__name__}: {str(e).strip()[-400:]})",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
