"""kvtier tensor parallelism: one cache decision per TP group (docs/tp.md).

Each rank process (one per GPU, or per cpu "device") brings its device pool — its share of the KV
heads, or the full latent for MLA — as a kvtier.ops.KvRegion of the same number of slots on every
rank. Rank 0, the leader, runs the group's only HierarchicalCache; it alone decides hit lengths,
prefetches, load-backs, evictions and backups. Every other rank is a TpFollower that applies each
decision to its own pools (device, host pages, its heads of the per-head store). The decisions
travel on a ring in shared memory (one host); nothing on the cache's path is a collective, so
torch.distributed (gloo or nccl) is only needed to start the ranks and agree on a group name:

    group = kvtier.TpGroup.from_torch_distributed("my-model")   # rank, size from torch.distributed
    if group.rank == 0:
        cache = kvtier.HierarchicalCache(pool, tp_group=group, host_layout="page_head",
                                         storage="file:///var/cache/kvtier")
        ...                               # the engine drives `cache` as usual; per step:
        seq = cache.tp_publish(step)      # the step (tokens, slots) for the followers, in order
        ...                               # rank 0's share of the step
        cache.tp_wait_applied(seq)        # every rank applied it (point to point, not a collective)
    else:
        with kvtier.TpFollower(pool, group, host_layout="page_head",
                               storage="file:///var/cache/kvtier") as f:
            f.serve_until_closed(on_message=run_my_share_of_the_step)

Every rank passes the same cache settings. A storage tier needs host_layout="page_head": the store
holds one object per KV head, so what TP=1 stored serves TP=2 and the reverse.

Failure: a follower that dies or does not answer within ack_timeout_s makes the leader's call that
waits for it (load_back, a backup, tp_wait_applied) raise kvtier.UnavailableError naming the rank;
the group is broken from then on. A follower whose leader died or closed its cache sees serve()
raise UnavailableError or return "closed".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import _kvtier
from ._buffers import HOST
from ._cache_fields import FIELDS_BY_NAME
from .ops import KvRegion, _check_settings, _int

__all__ = ["TpGroup", "TpFollower"]

_SERVE_RESULTS = ("idle", "applied", "closed")

# The C++ TpGroupConfig's fields (TpGroupConfigSchema): defaults and bounds are declared there once.
_GROUP_FIELDS = {f["name"]: f for f in _kvtier.tp_group_fields()}


def _group_default(name: str) -> Any:
    return _GROUP_FIELDS[name]["default"]


@dataclass(frozen=True)
class TpGroup:
    """Who this process is in a TP group.

    name: the group's shared-memory ring (1-200 of [A-Za-z0-9._-]); every rank passes the same.
    size: ranks in the group, leader included.  rank: this process's rank (0 = the leader).
    ack_timeout_s: how long the leader waits for a rank to apply a decision.
    attach_timeout_s: how long the leader waits for every follower to attach (and a follower for
      the leader's ring to exist).
    liveness_poll_s: how often a waiting rank checks that its peers' processes are alive.
    follower_poll_s: how long a follower polls the ring after each record before it sleeps (0:
      sleep at once; the default keeps one core per follower busy while requests arrive).
    follower_doze_s: how long after its last record a follower, its poll over, keeps looking at
      the ring every 50 us (no wake call for the leader's publish) before it sleeps (0: at once).
    leader_poll_s: how long the leader polls for acknowledgements before it sleeps.
    ack_each_copy: the leader's every copy also waits for every rank (False: the next wait does;
      tp_publish'ed steps come after the copies anyway; call cache.tp_fence() before sending a
      follower anything by another channel).
    Bounds and defaults are the C++ TpGroupConfig's (docs/tp.md); a bad value is a ValueError.
    """

    name: str
    size: int
    rank: int
    ring_bytes: int = _group_default("ring_bytes")
    ack_timeout_s: float = _group_default("ack_timeout_s")
    attach_timeout_s: float = _group_default("attach_timeout_s")
    liveness_poll_s: float = _group_default("liveness_poll_s")
    follower_poll_s: float = _group_default("follower_poll_s")
    follower_doze_s: float = _group_default("follower_doze_s")
    leader_poll_s: float = _group_default("leader_poll_s")
    ack_each_copy: bool = _group_default("ack_each_copy")

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TpGroup.name = {self.name!r} must be a non-empty string")
        size = _int(self.size, "TpGroup.size", 1)
        rank = _int(self.rank, "TpGroup.rank", 0)
        if rank >= size:
            raise ValueError(f"TpGroup.rank = {rank} is not in [0, size = {size})")

    @classmethod
    def from_env(cls, name: str, **options: Any) -> "TpGroup":
        """rank and size from torchrun's RANK and WORLD_SIZE (LOCAL_RANK/LOCAL_WORLD_SIZE first:
        a group lives on one host)."""
        env = os.environ
        rank = env.get("LOCAL_RANK", env.get("RANK"))
        size = env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE"))
        if rank is None or size is None:
            raise ValueError("TpGroup.from_env: RANK and WORLD_SIZE (or LOCAL_RANK and "
                             "LOCAL_WORLD_SIZE) are not set")
        return cls(name, int(size), int(rank), **options)

    @classmethod
    def from_torch_distributed(cls, name: str, process_group: Any = None,
                               **options: Any) -> "TpGroup":
        """rank and size of an initialised torch.distributed process group. Rank 0's `name` wins:
        it is broadcast once (setup only; the cache's path has no collective)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ValueError("TpGroup.from_torch_distributed: torch.distributed is not initialised")
        names = [name]
        dist.broadcast_object_list(names, src=0, group=process_group)
        return cls(names[0], dist.get_world_size(process_group), dist.get_rank(process_group),
                   **options)

    def _native(self) -> dict:
        """The C++ TpGroupConfig's fields by their schema names (types and bounds checked there),
        and this process's rank."""
        fields = {name: getattr(self, name) for name in _GROUP_FIELDS if name != "tp_size"}
        return {**fields, "tp_size": self.size, "rank": self.rank}


class TpFollower:
    """A follower rank (rank > 0) of a TP group: applies the leader's decisions to its own pools.

    Args:
      device_region: this rank's device pool (a layer_first kvtier.ops.KvRegion): its heads (MLA:
        the full latent), as many slots as the leader's.
      group: a TpGroup with rank > 0.
      transfer_backend, **settings: the same cache settings every rank passes (host_layout,
        host_ratio or host_capacity_bytes, storage, storage_model_id, ...); the host pool has the
        leader's number of slots in this rank's geometry.

    Waits up to group.attach_timeout_s for the leader's ring. A follower is driven by one thread.
    """

    def __init__(self, device_region: KvRegion, group: TpGroup, *,
                 transfer_backend: Optional[str] = None, **settings: Any) -> None:
        if not isinstance(device_region, KvRegion):
            raise ValueError("device_region must be a kvtier.ops.KvRegion, not "
                             f"{type(device_region).__name__}")
        if not isinstance(group, TpGroup):
            raise ValueError(f"group must be a kvtier.TpGroup, not {type(group).__name__}")
        if group.rank == 0:
            raise ValueError("rank 0 is the leader: create kvtier.HierarchicalCache(region, "
                             "tp_group=group) there")
        if transfer_backend is None:
            transfer_backend = "cpu" if device_region.device == HOST else "kernel"
        settings["transfer_backend"] = transfer_backend
        config = _check_settings(FIELDS_BY_NAME, settings, "TpFollower")
        self.group = group
        self._native = _kvtier._TpFollower(device_region, device_region._native, config,
                                           group._native())

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def shape(self) -> dict:
        """{device_slots, host_slots, num_layers, page_size, mla}: what the leader announced."""
        return self._native.shape()

    def serve(self, wait_s: float = 1.0,
              on_message: Optional[Callable[[bytes], Optional[int]]] = None) -> str:
        """Applies, in order, every decision published so far (waiting up to wait_s for the first):
        "idle" (nothing came), "applied" or "closed" (the leader closed its cache). Each engine
        message (the leader's tp_publish) goes to on_message(bytes), whose int (or None: 0) the
        leader reads with tp_result; an exception there fails this rank (the leader's wait raises
        naming it) and is raised here as kvtier.InternalError."""
        return self._native.serve(float(wait_s), on_message)

    def serve_until_closed(self, on_message: Optional[Callable[[bytes], Optional[int]]] = None,
                           wait_s: float = 1.0) -> None:
        """serve() until the leader closes the group; raises what serve() raises."""
        while self.serve(wait_s, on_message) != "closed":
            pass

    def stats(self) -> dict:
        """{records, slots, applied_seq}: decisions this rank applied."""
        return self._native.stats()

    @property
    def closed(self) -> bool:
        return self._native.closed

    def close(self) -> None:
        """Releases the rank and frees this rank's host pages. Closing twice is fine."""
        self._native.close()

    def __enter__(self) -> "TpFollower":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
