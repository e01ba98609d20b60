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

Keys: vLLM's offload key of a block (its block hash and KV-cache group index, 36 bytes) is
hashed into a kvtier PageKey. The store's namespace (kvtier::StorageNamespace) holds the model,
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
  `TIER_FIELDS` below or a kvtier storage option (kvtier's storage-options schema, by name; see
  `kvtier.HierarchicalCache.config_fields()` under `storage_`): an unknown key or a bad value is
  a ValueError naming it, raised when vLLM builds the tier.

Thread safety: vLLM calls a tier from its scheduler thread only; the lookup pool's threads touch
nothing but the PageStore (thread-safe) and their own futures.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections import OrderedDict
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


@dataclass(frozen=True)
class TierField:
    """One setting of KvtierTier's config dict (not a storage option)."""

    name: str
    kind: type
    doc: str
    # The value when the config omits it, from vLLM's OffloadingSpec and the tier's config dict
    # (None: required).
    default: Callable[[Any, dict], Any] | None = None


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
    TierField("pages_per_call", int, "blocks per store call a vLLM job is cut into (default: 1 "
              "for file://, so the blocks of one job spread over the store's I/O threads; 64 "
              "otherwise, so a network store gets few round trips)",
              lambda s, c: 1 if str(c.get("url", "")).startswith("file:") else 64),
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
                value = field.default(offloading_spec, config)
            except (AttributeError, TypeError) as e:
                raise ValueError(
                    f"KvtierTier: {field.name} is not in the tier config and vLLM's offloading "
                    f"spec does not give it ({e}); set {field.name} ({field.doc})"
                ) from e
        settings[field.name] = value
    storage_options = {k: v for k, v in config.items() if k not in _FIELDS_BY_NAME}
    return settings, storage_options


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
        # vLLM job id -> (its store calls' jobs, or None when a submit failed; keys; is_store)
        self._jobs: dict[int, tuple[list | None, list[bytes], bool]] = {}
        logger.info(
            "KvtierTier %s: %s, namespace %s, %d blocks of %d bytes",
            tier_type, self._store.url, self._store.namespace_name, self._num_blocks,
            self._row_bytes,
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
            self._lookups_in_flight[key] = self._lookup_pool.submit(self._store.exists, [key])
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
        submit = self._store.submit_set if is_store else self._store.submit_get
        addrs = self._row_addrs(job.block_ids)
        if is_store:  # blocks the store already holds (as far as the tier knows) are not rewritten
            todo = [i for i, k in enumerate(keys) if k not in self._known_present]
            keys, addrs = [keys[i] for i in todo], addrs[todo]
        step = self._pages_per_call
        store_jobs: list | None = []
        try:
            for start in range(0, len(keys), step):
                store_jobs.append(submit(keys[start:start + step], addrs[start:start + step]))
        except kvtier.KvtierError:  # e.g. the store was closed: the job fails, vLLM goes on
            logger.exception("KvtierTier: job %d could not be submitted", job.job_id)
            for submitted in store_jobs:
                submitted.wait()  # its pages' memory is vLLM's again only once it is done
            store_jobs = None
        self._jobs[job.job_id] = (store_jobs, keys, is_store)

    def submit_store(self, job_metadata: JobMetadata) -> None:
        self._submit(job_metadata, is_store=True)

    def submit_load(self, job_metadata: JobMetadata) -> None:
        self._submit(job_metadata, is_store=False)

    def get_finished(self) -> Iterable[JobResult]:
        finished: list[JobResult] = []
        for job_id, (store_jobs, keys, is_store) in list(self._jobs.items()):
            if store_jobs is None:
                outcome = [False] * len(keys)
            elif all(j.done() for j in store_jobs):
                outcome = [ok for j in store_jobs for ok in j.wait(0)]
            else:
                continue
            del self._jobs[job_id]
            for key, ok in zip(keys, outcome):
                if ok:
                    self._remember_present(key)
                elif not is_store:
                    self._known_present.pop(key, None)
            finished.append(JobResult(job_id=job_id, success=all(outcome)))
        return finished

    def shutdown(self) -> None:
        """Waits for the jobs in flight (each ends within the store's timeout), then closes the
        store and the lookup threads."""
        for store_jobs, _, _ in self._jobs.values():
            for store_job in store_jobs or ():
                store_job.wait()
        self._jobs.clear()
        self._lookup_pool.shutdown(wait=True, cancel_futures=True)
        self._store.close()
