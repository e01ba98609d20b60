"""kvtier.integrations.vllm — kvtier's stores as a secondary tier behind vLLM's CPU offload tier.

vLLM's `OffloadingConnector` with `"spec_name": "TieringOffloadingSpec"` keeps offloaded KV blocks
in a pinned CPU pool (the primary tier) and cascades every block it stores there to each
*secondary tier*, promoting secondary hits back into the pool when a request needs them. A
secondary tier outside vLLM is named by class and module path in vLLM's own config, no fork:

    vllm serve <model> --kv-transfer-config '{
      "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 16000000000,
        "secondary_tiers": [{"type": "KvtierTier", "module_path": "kvtier.integrations.vllm",
                             "url": "file:///mnt/nvme/kvtier"}]}}'

`KvtierTier` (a vLLM `SecondaryTierManager`) moves whole blocks between vLLM's CPU pool (the
memoryview vLLM hands the tier: one row of `row_bytes` per block) and a `kvtier.PageStore`
(file://, redis://, redis+cluster://, memory://), in C++ on the store's I/O threads: the
scheduler thread only submits (`PageStore.submit_set` / `submit_get` return at once) and polls
(`PageStoreJob.done()` never blocks).

Keys: vLLM's offload key of a block (its block hash and KV-cache group index, 36 bytes for
sha256 block hashes) becomes a kvtier PageKey by `page_key_of`: the offload key's bytes
rearranged so that the page key ends in the last 8 bytes of vLLM's block hash. kvtier's KV
events name a page by the last 8 bytes of its key read big-endian (kvtier/kv_events.h,
BlockHashOf), which is vLLM's own 64-bit form of a block hash (`maybe_convert_block_hash` with
vLLM's default `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`): so the tier's events carry the hash
vLLM's own events carry for the block, also for the evictions the store makes by itself, after a
restart, or of another engine's blocks (the key encodes it: nothing to remember). The store's
namespace (kvtier::StorageNamespace) holds the model,
the KV dtype, the layout ("page_first_direct": a block row is every layer of the block's tokens),
MLA or not, the layer count, the tokens per block, the bytes per token and layer, and the world
size whose ranks share a row; a page of another namespace is a miss, never wrong bytes.

Contract with vLLM (the interface at the pinned commit, docs/vllm.md):
- lookup(key) answers True (present), False (absent) or None (the answer is in flight: vLLM
  retries next step). A block this tier stored, or saw present, is answered from memory; any
  other block starts one `PageStore.exists` on a small thread pool and answers None until it
  returns. An absent verdict holds for the request that asked, until it finishes.
- submit_store / submit_load return at once; get_finished() reports each job once every page
  has its outcome: success only when every page was written / read. A failed load marks its
  blocks absent; vLLM then frees the slots and recomputes (a failed page's bytes are undefined
  but the block is never marked loaded).
- Config: every key of the tier's dict but "type" and "module_path" is either a field of
  `TIER_FIELDS` below or a kvtier.PageStore option (the storage options and the KV-events options,
  by their schema names: `kvtier.PageStore.storage_option_fields()`): an unknown key or a bad
  value is a ValueError naming it, raised when vLLM builds the tier.
- KV events: with `kv_events_endpoint` the store publishes, from C++, BlockStored for the blocks
  a store job wrote and BlockRemoved for the blocks the store evicted by itself, in vLLM's wire
  format on kvtier's own ZeroMQ socket, with the medium vLLM's own storage tiers use
  (`VLLM_TIER_MEDIUM`, "STORAGE") unless `kv_events_medium` says otherwise, each block named by
  vLLM's 64-bit block hash (above). vLLM's other form, raw bytes
  (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`), is refused with events on: kvtier's events carry
  64-bit hashes only.

Thread safety: vLLM calls a tier from its scheduler thread only; the lookup pool's threads touch
nothing but the PageStore (thread-safe) and their own futures.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import kvtier

try:
    from vllm.v1.kv_offload.tiering.base import JobMetadata, JobResult, SecondaryTierManager
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "kvtier.integrations.vllm needs vLLM's KV offloading tiers "
        "(vllm.v1.kv_offload.tiering, vLLM with TieringOffloadingSpec): " + str(e)
    ) from e

logger = logging.getLogger(__name__)

# The layout name in the store's namespace: a vLLM block row holds every layer's KV of the
# block's tokens, page after page ([pages, layers, tokens, bytes]).
VLLM_ROW_LAYOUT = "page_first_direct"

# The medium of the tier's KV events: what vLLM's own secondary storage tiers (file system, object
# store) tag their events with since vLLM's tier-owned events (docs/vllm.md says why).
VLLM_TIER_MEDIUM = "STORAGE"


# The bytes of vLLM's offload key after the block hash: the KV-cache group index (vLLM's
# make_offload_key: block_hash + group_idx as 4 bytes big-endian).
_OFFLOAD_KEY_GROUP_BYTES = 4
# The bytes of a kvtier page key (32) that name it in kvtier's KV events (BlockHashOf: the last 8,
# big-endian), and those before the group index.
_EVENT_HASH_BYTES = 8
_LEADING_BYTES = 32 - _EVENT_HASH_BYTES - _OFFLOAD_KEY_GROUP_BYTES


def page_key_of(offload_key: bytes) -> bytes:
    """The kvtier page key (32 bytes, which kvtier.PageStore takes as is) of vLLM's offload key
    (block hash + group index): the block hash's bytes before its last 8 (at most 20 of them,
    zero-padded to 20), the 4-byte group index, then the block hash's last 8 bytes (left-padded
    with zeros if the hash is shorter). Rearranging, not hashing: every byte of a 16-byte (xxhash)
    block hash and 28 of a 32-byte (sha256) one are kept, so distinct blocks and groups get
    distinct page keys, at slicing's cost on the scheduler thread. kvtier's event hash of the page,
    BlockHashOf(key) = int.from_bytes(key[-8:], "big"), is vLLM's int block hash
    int.from_bytes(block_hash, "big") & (2**64 - 1)."""
    block_hash = offload_key[:-_OFFLOAD_KEY_GROUP_BYTES]
    if not block_hash:
        raise ValueError(f"KvtierTier: {offload_key!r} is not a vLLM offload key (hash + group)")
    return (block_hash[:-_EVENT_HASH_BYTES][:_LEADING_BYTES].ljust(_LEADING_BYTES, b"\0")
            + offload_key[-_OFFLOAD_KEY_GROUP_BYTES:]
            + block_hash[-_EVENT_HASH_BYTES:].rjust(_EVENT_HASH_BYTES, b"\0"))


def vllm_event_hashes_are_ints() -> bool:
    """vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES as vllm.envs reads it (default 1)."""
    return bool(int(os.getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")))


@dataclass(frozen=True)
class TierField:
    """One setting of KvtierTier's config dict (not a storage option)."""

    name: str
    kind: type
    doc: str
    # The value when the config omits it, from vLLM's OffloadingSpec and the tier's config dict
    # merged with the settings resolved before it in TIER_FIELDS and the storage options with the
    # tier's defaults (None: required).
    default: Callable[[Any, dict], Any] | None = None


def _is_file_url(config: dict) -> bool:
    return str(config.get("url", "")).startswith("file:")


# kvtier.PageStore options (storage options, by their schema names) the tier sets unless its
# config does: (name, the value for a config, or None to leave the store's default; why).
TIER_STORAGE_DEFAULTS: tuple[tuple[str, Callable[[dict], Any], str], ...] = (
    ("max_batch_pages", lambda c: 1 if _is_file_url(c) else None,
     "1 for file://: PageStore cuts each tier call into one store call per block, so no I/O "
     "thread owns a many-block call and waits idle, holding a reader's place, while other "
     "threads finish its last blocks (docs/perf-notes/engines.md); the store's default "
     "otherwise"),
)


def _attr(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _kv_dtype_of(spec: Any, config: dict) -> str:
    cache_dtype = str(_attr(spec, "vllm_config.cache_config.cache_dtype"))
    if cache_dtype != "auto":
        return cache_dtype
    return str(_attr(spec, "vllm_config.model_config.dtype")).removeprefix("torch.")


def _num_layers_of(spec: Any, config: dict) -> int:
    groups = _attr(spec, "kv_cache_config.kv_cache_groups")
    return sum(len(group.layer_names) for group in groups)


def _block_tokens_of(spec: Any, config: dict) -> int:
    sizes = set(spec.gpu_block_size)
    if len(sizes) != 1:
        raise ValueError(
            f"KvtierTier: the KV cache groups have block sizes {sorted(sizes)}; set block_tokens"
        )
    return sizes.pop() * spec.block_size_factor


# The tier's own settings, declared once: validation, defaults from vLLM's config, and the field
# list in docs/vllm.md all come from this table.
TIER_FIELDS: tuple[TierField, ...] = (
    TierField("url", str, "kvtier store URL: file:///dir, redis://host:port, "
              "redis+cluster://host:port, memory://"),
    TierField("model_id", str, "model in the namespace (default: vLLM's model name)",
              lambda s, c: str(_attr(s, "vllm_config.model_config.model"))),
    TierField("kv_dtype", str, "KV dtype in the namespace (default: vLLM's cache dtype, or the "
              "model dtype when that is 'auto')", _kv_dtype_of),
    TierField("mla", bool, "MLA (one latent buffer) or K and V (default: vLLM's model config)",
              lambda s, c: bool(_attr(s, "vllm_config.model_config.use_mla"))),
    TierField("num_layers", int, "attention layers whose KV a block row holds (default: the "
              "layers of vLLM's KV cache groups)", _num_layers_of),
    TierField("block_tokens", int, "tokens per offloaded block (default: vLLM's GPU block size "
              "times the offloaded block_size factor)", _block_tokens_of),
    TierField("world_size", int, "ranks whose KV shares one block row (default: vLLM's "
              "parallel world size)",
              lambda s, c: int(_attr(s, "vllm_config.parallel_config.world_size"))),
    TierField("pages_per_call", int, "blocks per PageStore call (tier call) a vLLM job is cut "
              "into (default: 16 for file://, a tenth of the scheduler thread's time per job of "
              "one call per block, while PageStore still gives each block a store call of its "
              "own: max_batch_pages; 64 otherwise, so a network store gets few round trips)",
              lambda s, c: 16 if _is_file_url(c) else 64),
    TierField("max_calls_in_flight", int, "tier calls (of pages_per_call blocks) per direction "
              "the tier keeps in the store at once; more wait in the tier (default: as many as "
              "make half the store's max_queued_batches in store calls of max_batch_pages "
              "blocks, beyond which it rejects calls; at least 1)",
              lambda s, c: max(1, c["max_queued_batches"] // 2
                               // -(-c["pages_per_call"] // max(1, c["max_batch_pages"])))),
    TierField("lookup_threads", int, "threads answering lookups of blocks the tier has not seen "
              "(default 2)", lambda s, c: 2),
    TierField("max_known_blocks", int, "blocks remembered as present (LRU; default 1048576)",
              lambda s, c: 1 << 20),
)
_FIELDS_BY_NAME = {f.name: f for f in TIER_FIELDS}


def resolve_tier_config(offloading_spec: Any, config: dict[str, Any]) -> tuple[dict, dict]:
    """Splits the tier's config into (tier settings, storage options) and fills the settings the
    config omits from vLLM's OffloadingSpec. A missing required setting, a value of the wrong
    type or one vLLM's config cannot supply is a ValueError naming the field; storage options are
    checked by kvtier.PageStore (an unknown name is a ValueError naming it)."""
    settings: dict[str, Any] = {}
    storage_options = {k: v for k, v in config.items() if k not in _FIELDS_BY_NAME}
    for name, default, _ in TIER_STORAGE_DEFAULTS:
        if name not in storage_options and default(config) is not None:
            storage_options[name] = default(config)
    # What a default may read: the config, the storage options with the store's own defaults
    # where neither the config nor the tier sets them, and the settings resolved so far.
    known = {f["name"]: f["default"] for f in kvtier.PageStore.storage_option_fields()}
    for field in TIER_FIELDS:
        if field.name in config:
            value = config[field.name]
            ok = isinstance(value, field.kind) and not (
                field.kind is int and isinstance(value, bool)
            )
            if not ok:
                raise ValueError(
                    f"KvtierTier: {field.name} = {value!r} must be a {field.kind.__name__} "
                    f"({field.doc})"
                )
            if field.kind is int and value < 1:
                raise ValueError(f"KvtierTier: {field.name} = {value} must be at least 1")
        elif field.default is None:
            raise ValueError(f"KvtierTier: {field.name} is required ({field.doc})")
        else:
            try:
                value = field.default(offloading_spec,
                                      {**known, **config, **storage_options, **settings})
            except (AttributeError, TypeError) as e:
                raise ValueError(
                    f"KvtierTier: {field.name} is not in the tier config and vLLM's offloading "
                    f"spec does not give it ({e}); set {field.name} ({field.doc})"
                ) from e
        settings[field.name] = value
    return settings, storage_options


class _Transfer:
    """One vLLM job: its blocks cut into store calls (chunks), submitted as room allows."""

    def __init__(self, is_store: bool, keys: list[bytes]):
        self.is_store = is_store
        self.keys = keys
        # (indices, page keys, addrs)
        self.chunks: list[tuple[list[int], list[bytes], np.ndarray]] = []
        self.submitted = 0  # chunks submitted, in order
        self.calls: list[tuple[list[int], Any]] = []  # (indices, kvtier.PageStoreJob)
        self.failed = False  # a submit raised: the chunks after it are never submitted


class KvtierTier(SecondaryTierManager):
    """kvtier's stores as a vLLM secondary tier (see the module docstring)."""

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        **config: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        settings, storage_options = resolve_tier_config(offloading_spec, config)
        if storage_options.get("kv_events_endpoint"):
            storage_options.setdefault("kv_events_medium", VLLM_TIER_MEDIUM)
            if not vllm_event_hashes_are_ints():
                raise ValueError(
                    "KvtierTier: kv_events_endpoint is set but VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"
                    "=0 asks for raw-bytes block hashes; kvtier's KV events carry vLLM's 64-bit "
                    "block hashes only (unset it, or drop kv_events_endpoint)"
                )

        pool = np.asarray(primary_kv_view)
        if pool.ndim != 2 or pool.strides[1] != pool.itemsize:
            raise ValueError(
                f"KvtierTier: vLLM's CPU pool view has shape {pool.shape} and strides "
                f"{pool.strides}; expected (num_blocks, row) with contiguous rows"
            )
        self._num_blocks = pool.shape[0]
        self._row_bytes = pool.strides[0]
        self._pool_base = pool.ctypes.data
        self._pool = pool  # keeps the view's buffer referenced while jobs run

        num_buffers = 1 if settings["mla"] else 2
        per_slot = num_buffers * settings["num_layers"] * settings["block_tokens"]
        if self._row_bytes % per_slot != 0:
            raise ValueError(
                f"KvtierTier: a block row of {self._row_bytes} bytes is not "
                f"{num_buffers} buffers x num_layers {settings['num_layers']} x block_tokens "
                f"{settings['block_tokens']} x whole bytes per token: check num_layers, "
                "block_tokens and mla"
            )
        self._store = kvtier.PageStore(
            settings["url"],
            model_id=settings["model_id"],
            kv_dtype=settings["kv_dtype"],
            layout=VLLM_ROW_LAYOUT,
            mla=settings["mla"],
            num_layers=settings["num_layers"],
            slot_bytes=self._row_bytes // per_slot,
            page_size=settings["block_tokens"],
            tp_rank=0,
            tp_size=settings["world_size"],
            **storage_options,
        )
        assert self._store.page_bytes == self._row_bytes
        self._lookup_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings["lookup_threads"], thread_name_prefix="kvtier_vllm_lookup"
        )
        self._pages_per_call = settings["pages_per_call"]
        self._max_known = settings["max_known_blocks"]
        self._known_present: OrderedDict[bytes, None] = OrderedDict()
        self._absent_for_request: dict[str, set[bytes]] = {}
        self._lookups_in_flight: dict[bytes, concurrent.futures.Future] = {}
        # The keys whose exists queries a request started: dropped when it finishes, so a request
        # that never asks again (aborted) leaves nothing behind.
        self._lookups_of_request: dict[str, set[bytes]] = {}
        self._max_calls_in_flight = settings["max_calls_in_flight"]
        self._transfers: dict[int, _Transfer] = {}  # vLLM job id -> its transfer, until reported
        self._waiting = {True: deque(), False: deque()}  # job ids with chunks not yet submitted
        self._calls_in_flight = {True: 0, False: 0}  # submitted, not done (recounted each poll)
        logger.info(
            "KvtierTier %s: %s, namespace %s, %d blocks of %d bytes%s",
            tier_type, self._store.url, self._store.namespace_name, self._num_blocks,
            self._row_bytes,
            f", KV events ({self._store.kv_events_medium}) on {self._store.kv_events_endpoint}"
            if self._store.kv_events_endpoint else "",
        )

    @property
    def store(self) -> "kvtier.PageStore":
        """The kvtier.PageStore behind the tier."""
        return self._store

    # --- lookups ---

    def _remember_present(self, key: bytes) -> None:
        self._known_present[key] = None
        self._known_present.move_to_end(key)
        while len(self._known_present) > self._max_known:
            self._known_present.popitem(last=False)

    def lookup(self, key: bytes, req_context: Any) -> bool | None:
        key = bytes(key)
        if key in self._known_present:
            self._known_present.move_to_end(key)
            return True
        absent = self._absent_for_request.get(req_context.req_id)
        if absent is not None and key in absent:
            return False
        query = self._lookups_in_flight.get(key)
        if query is None:
            self._lookups_in_flight[key] = self._lookup_pool.submit(
                self._store.exists, [page_key_of(key)]
            )
            self._lookups_of_request.setdefault(req_context.req_id, set()).add(key)
            return None
        if not query.done():
            return None
        del self._lookups_in_flight[key]
        try:
            present = bool(query.result()[0])
        except Exception:  # a closed store or an I/O fault: a miss, as for any store fault
            logger.exception("KvtierTier: exists failed; the block counts as absent")
            present = False
        if present:
            self._remember_present(key)
            return True
        self._absent_for_request.setdefault(req_context.req_id, set()).add(key)
        return False

    def request_finished(self, req_context: Any) -> None:
        self._absent_for_request.pop(req_context.req_id, None)
        for key in self._lookups_of_request.pop(req_context.req_id, ()):
            self._lookups_in_flight.pop(key, None)  # a query still running just ends unread

    # --- transfers ---

    def _row_addrs(self, block_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(block_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self._num_blocks):
            raise ValueError(f"KvtierTier: block ids outside [0, {self._num_blocks})")
        return self._pool_base + ids * self._row_bytes

    def _submit(self, job: JobMetadata, is_store: bool) -> None:
        keys = [bytes(k) for k in job.keys]
        if len(keys) != len(job.block_ids):
            raise ValueError(
                f"KvtierTier: job {job.job_id} has {len(keys)} keys and "
                f"{len(job.block_ids)} block ids"
            )
        addrs = self._row_addrs(job.block_ids)
        transfer = _Transfer(is_store, keys)
        # Blocks the store already holds (as far as the tier knows) are not written again.
        todo = [i for i, k in enumerate(keys) if not (is_store and k in self._known_present)]
        for start in range(0, len(todo), self._pages_per_call):
            chunk = todo[start:start + self._pages_per_call]
            transfer.chunks.append((chunk, [page_key_of(keys[i]) for i in chunk], addrs[chunk]))
        self._transfers[job.job_id] = transfer
        if transfer.chunks:
            self._waiting[is_store].append(job.job_id)
            self._pump(is_store)

    def _pump(self, is_store: bool) -> None:
        """Submits waiting chunks while fewer than max_calls_in_flight calls of this direction
        are in the store (the store rejects calls beyond its queue: max_queued_batches)."""
        waiting = self._waiting[is_store]
        submit = self._store.submit_set if is_store else self._store.submit_get
        while waiting and self._calls_in_flight[is_store] < self._max_calls_in_flight:
            transfer = self._transfers[waiting[0]]
            chunk, keys, addrs = transfer.chunks[transfer.submitted]
            try:
                transfer.calls.append((chunk, submit(keys, addrs)))
                self._calls_in_flight[is_store] += 1
                transfer.submitted += 1
            except kvtier.KvtierError:  # e.g. the store was closed: the job fails, vLLM goes on
                logger.exception("KvtierTier: a call of job %d could not be submitted", waiting[0])
                transfer.failed = True
            if transfer.failed or transfer.submitted == len(transfer.chunks):
                waiting.popleft()

    def submit_store(self, job_metadata: JobMetadata) -> None:
        self._submit(job_metadata, is_store=True)

    def submit_load(self, job_metadata: JobMetadata) -> None:
        self._submit(job_metadata, is_store=False)

    def get_finished(self) -> Iterable[JobResult]:
        in_flight = {True: 0, False: 0}
        finished: list[JobResult] = []
        for job_id, transfer in list(self._transfers.items()):
            busy = sum(1 for _, call in transfer.calls if not call.done())
            in_flight[transfer.is_store] += busy
            submitted_all = transfer.failed or transfer.submitted == len(transfer.chunks)
            if busy or not submitted_all:
                continue
            del self._transfers[job_id]
            outcome = [True] * len(transfer.keys)  # a block not in any chunk: a skipped store
            for chunk, _, _ in transfer.chunks:
                for i in chunk:
                    outcome[i] = False  # until its call says otherwise (never submitted: failed)
            for chunk, call in transfer.calls:
                for i, ok in zip(chunk, call.wait(0)):
                    outcome[i] = ok
            for key, ok in zip(transfer.keys, outcome):
                if ok:
                    self._remember_present(key)
                elif not transfer.is_store:
                    self._known_present.pop(key, None)
            finished.append(JobResult(job_id=job_id, success=all(outcome)))
        self._calls_in_flight = in_flight
        self._pump(False)  # loads first: a request waits for them
        self._pump(True)
        return finished

    def shutdown(self) -> None:
        """Waits for the jobs in flight (each ends within the store's timeout), then closes the
        store and the lookup threads."""
        for transfer in self._transfers.values():
            for _, call in transfer.calls:
                call.wait()
        self._transfers.clear()
        self._lookup_pool.shutdown(wait=True, cancel_futures=True)
        self._store.close()
