"""kvtier.integrations.transformers — Hugging Face transformers models on a kvtier cache.

    from kvtier.integrations.transformers import KvtierPool
    pool = KvtierPool(model.config, device="cuda", num_tokens=65536, host_ratio=4.0,
                      storage="file:///var/cache/kvtier")
    cache = pool.cache_for(input_ids)      # the cached prefix of input_ids, from the fastest tier
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=64)
    cache.save(input_ids)                  # the prompt's KV into kvtier (device, host, storage)

`KvtierPool` owns a device KV pool shaped for the model (one slot per token: every layer's K and V
of its key/value heads) and a `kvtier.HierarchicalCache` over it (host tier, optional storage tier:
any setting of kvtier.HierarchicalCache.config_fields()). `cache_for(input_ids)` matches the
prompt against every tier (asking the storage backend for pages other processes or earlier runs
stored), prefetches storage hits into host memory, loads host hits into device slots, and returns
a `KvtierCache`: a transformers `Cache` whose layers already hold the matched prefix, so that an
unmodified `model(...)` / `model.generate(...)` computes only the rest. The prefix is gathered
from the pool into the layers' dense K/V (kvtier.ops.DensePagedPlan, prepared once per request)
when the model first updates a layer: when host hits were loaded, layer by layer after
`wait_layer` made the stream wait for that layer's load (layer l's attention overlaps the loads of
layers > l); on a device hit, every layer in one kernel at the first layer. `KvtierCache.save(
token_ids)` scatters the KV the model computed for the prompt into freshly allocated pool slots
(kvtier.ops.scatter_dense, one call for every layer) and inserts the prefix into the cache (the
write policy then backs it up to host memory and storage), and releases the match once the
stream's reads are done.

Several processes on one machine share a host tier through a segment
(`KvtierPool.create_shared_host(name, model.config, num_tokens=...)` once, then
`KvtierPool(..., shared_host=name)` in each process): a prefix one process computed and saved is a
host hit for the others (the shared tier replaces a storage tier; a cache has one or the other).

Streams: the loads, the gathers and the save's scatter run on the stream given to `cache_for` /
`save` (default: the current stream of the pool's device when cache_for is called); run the model
on that stream (or on one ordered after it).

With model(...) the caller passes only the tokens the cache does not hold:
`model(input_ids[:, cache.get_seq_length():], past_key_values=cache)`.

Supported: transformers versions with the layered Cache API (`Cache(layers=[...])`,
`transformers.cache_utils.DynamicLayer`), i.e. 4.56 and later, 5.x included (tested with 5.x on
an H100); older versions raise ImportError naming the version found. Batch size 1 (one prompt
per cache), full-attention decoder layers (no sliding windows), MHA/GQA K/V of one dtype.

Thread safety: a KvtierPool may be used from several threads (the HierarchicalCache is
thread-safe); a KvtierCache belongs to one request.
"""

from __future__ import annotations

import array
import re
from typing import Any, Dict, Optional

from .. import _kvtier, ops
from ..cache import HierarchicalCache

try:
    import torch
    import transformers
    from transformers.cache_utils import Cache, DynamicLayer
except ImportError as e:  # transformers absent, or too old for the layered Cache API
    try:
        import transformers as _t
        found = f"transformers {_t.__version__}"
    except ImportError:
        found = "no transformers"
    raise ImportError(
        "kvtier.integrations.transformers needs torch and transformers >= 4.56 (the layered "
        f"Cache API: transformers.cache_utils.DynamicLayer; tested with 5.x); found {found} "
        f"({e})") from None

__all__ = ["KvtierPool", "KvtierCache", "SUPPORTED_TRANSFORMERS", "MIN_TRANSFORMERS"]

MIN_TRANSFORMERS = (4, 56)
SUPPORTED_TRANSFORMERS = ">= 4.56 (layered Cache API), tested with 5.x"


def _version_tuple(text: str) -> tuple:
    numbers = re.findall(r"\d+", text)[:2]
    return tuple(int(n) for n in numbers) if len(numbers) == 2 else (0, 0)


if _version_tuple(transformers.__version__) < MIN_TRANSFORMERS:
    raise ImportError(f"kvtier.integrations.transformers supports transformers "
                      f"{SUPPORTED_TRANSFORMERS}; found {transformers.__version__}")


def _kv_shape(config: Any) -> Dict[str, int]:
    """Layers, K/V heads and head_dim of a transformers model config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(text.num_hidden_layers)
    heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        raise ValueError(f"config.layer_types = {sorted(set(layer_types))}: kvtier's transformers "
                         "integration supports full-attention layers only")
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        raise ValueError(f"config.sliding_window = {text.sliding_window}: sliding-window "
                         "attention is not supported")
    return {"layers": layers, "heads": heads, "head_dim": int(head_dim)}


class KvtierPool:
    """A device KV pool for one model plus the HierarchicalCache over it.

    Args:
      config: the model's config (model.config).
      device: the CUDA device of the model ("cuda", "cuda:1", torch.device); "cpu" runs the pool
        in host memory on the cpu backend (for tests without a GPU).
      dtype: the K/V dtype, the model's (default bfloat16; pass model.dtype otherwise).
      num_tokens: device pool capacity in tokens (rounded up to whole pages).
      page_size: tokens per page (a power of two <= 256).
      **settings: kvtier.HierarchicalCache keyword arguments (shared_host=NAME attaches a shared
        host tier made by create_shared_host; storage="file://..." adds a storage tier). Defaults
        here differ from the cache's where a chat wants them to: write_policy="write_through"
        (back up every insert), prefetch_policy="wait_complete", prefetch_threshold_tokens=0,
        storage_model_id=config._name_or_path (the namespace of stored and shared pages: give
        every process that shares a store or segment the same one).
    """

    def __init__(self, config: Any, *, device: Any = "cuda", dtype: Any = None,
                 num_tokens: int = 32768, page_size: int = 16, **settings: Any) -> None:
        shape = _kv_shape(config)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = torch.bfloat16 if dtype is None else dtype
        self.num_layers = shape["layers"]
        self.heads = shape["heads"]
        self.head_dim = shape["head_dim"]
        self.page_size = int(page_size)
        if self.page_size <= 0:
            raise ValueError(f"page_size = {page_size} must be positive")
        pages = -(-int(num_tokens) // self.page_size)
        if pages <= 0:
            raise ValueError(f"num_tokens = {num_tokens} must be positive")
        pool_shape = (self.num_layers, pages * self.page_size, self.heads, self.head_dim)
        self.k = torch.zeros(pool_shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(pool_shape, dtype=self.dtype, device=self.device)
        slot_bytes = self.heads * self.head_dim * self.k.element_size()
        self.region = ops.KvRegion(layout="layer_first", num_layers=self.num_layers,
                                   slot_bytes=slot_bytes, page_size=self.page_size, k=self.k,
                                   v=self.v, name="pool")
        settings.setdefault("write_policy", "write_through")
        settings.setdefault("prefetch_policy", "wait_complete")
        settings.setdefault("prefetch_threshold_tokens", 0)
        settings.setdefault("storage_model_id", getattr(config, "_name_or_path", "") or "")
        self.cache = HierarchicalCache(self.region, **settings)

    @staticmethod
    def create_shared_host(name: str, config: Any, *, num_tokens: int, page_size: int = 16,
                           dtype: Any = None, **options: Any) -> dict:
        """Creates a shared host segment for `config`'s model (its layers, K/V heads x head_dim
        of `dtype`, default bfloat16) holding num_tokens tokens (rounded up to whole pages), for
        KvtierPools with shared_host=name and the same page_size and dtype, in any process of
        this machine. options: layout, max_processes (kvtier.HierarchicalCache.
        create_shared_host). Remove it with destroy_shared_host(name)."""
        shape = _kv_shape(config)
        itemsize = torch.empty((), dtype=torch.bfloat16 if dtype is None else dtype).element_size()
        page_size = int(page_size)
        if page_size <= 0:
            raise ValueError(f"page_size = {page_size} must be positive")
        if int(num_tokens) <= 0:
            raise ValueError(f"num_tokens = {num_tokens} must be positive")
        return HierarchicalCache.create_shared_host(
            name, num_layers=shape["layers"], slot_bytes=shape["heads"] * shape["head_dim"] *
            itemsize, page_size=page_size, pages=-(-int(num_tokens) // page_size),
            head_num=shape["heads"], **options)

    @staticmethod
    def destroy_shared_host(name: str) -> None:
        """Removes a segment create_shared_host made (pools attached keep working)."""
        HierarchicalCache.destroy_shared_host(name)

    def cache_for(self, input_ids: Any, *, namespace: str = "", align: Optional[int] = None,
                  stream: Any = None) -> "KvtierCache":
        """A KvtierCache holding the longest cached prefix of `input_ids` ([1, T] or [T]) that
        leaves at least one token to compute, rounded down to a multiple of `align` tokens
        (default: the page size; a multiple of it). Storage hits are read into host memory and
        host hits copied to the device on `stream` (default: the current stream)."""
        tokens = _token_tensor(input_ids, "input_ids")
        align = self.page_size if align is None else int(align)
        if align <= 0 or align % self.page_size:
            raise ValueError(f"align = {align} must be a positive multiple of the page size "
                             f"{self.page_size}")
        cache = self.cache
        match = cache.match(tokens, namespace)
        tiers = {"device": match.device_tokens, "host": match.host_tokens, "storage": 0}
        if cache.has_storage:
            cache.query_storage(match)
            tiers["storage"] = match.storage_tokens
            if match.storage_tokens:
                cache.prefetch(match)
        # The slot list is copied to the GPU on the current stream: on `stream` when one is given,
        # so that the copy is ordered before the gathers there.
        with _NoStream() if stream is None else _current(stream):
            stream = _stream(self.device, stream)
            loaded = cache.load_back(match, stream=stream)
            slots = loaded.device_slots
        usable = min(len(slots), max(len(tokens) - 1, 0))
        usable -= usable % align
        # What the usable prefix came from, fastest tier first.
        sources, left = {}, usable
        for tier in ("device", "host", "storage"):
            sources[tier] = min(tiers[tier], left)
            left -= sources[tier]
        slots = slots[:usable]
        return KvtierCache(self, match, tokens, slots, sources, namespace, stream,
                           loading=loaded.loaded_tokens > 0)

    def close(self) -> None:
        self.cache.close()


def _token_tensor(input_ids: Any, name: str) -> Any:
    """The prompt as a 1-D contiguous int32 CPU tensor (one device -> host copy for a GPU tensor,
    one C pass for a list; no Python int per token)."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(f"{name} has batch size {input_ids.shape[0]}; kvtier's "
                                 "transformers cache serves one prompt at a time (batch 1)")
            input_ids = input_ids[0]
        if input_ids.dim() != 1:
            raise ValueError(f"{name} must be [1, T] or [T], got {tuple(input_ids.shape)}")
        if input_ids.is_floating_point() or input_ids.is_complex() or \
                input_ids.dtype == torch.bool:
            raise ValueError(f"{name} has dtype {input_ids.dtype}; expected integers")
        host = input_ids.detach().to("cpu")
        if host.dtype != torch.int32:
            if host.numel() and (int(host.min()) < -2**31 or int(host.max()) >= 2**31):
                raise ValueError(f"{name} has values outside int32")
            host = host.to(torch.int32)
        return host.contiguous()
    if isinstance(input_ids, (list, tuple)):
        values = array.array("i")
        values.frombytes(_kvtier.int32_tokens(input_ids, name))
    else:
        try:
            values = array.array("i", input_ids)
        except (TypeError, OverflowError) as e:
            raise ValueError(f"{name} must be a tensor or a sequence of int32 token ids "
                             f"({e})") from None
    if not values:
        return torch.empty(0, dtype=torch.int32)
    return torch.frombuffer(values, dtype=torch.int32)


class _NoStream:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _current(stream: Any) -> Any:
    """`stream` as torch's current stream for a block (the cache's slot lists are copied to the
    GPU on the current stream); nothing for the cpu pool."""
    return _NoStream() if stream is None else torch.cuda.stream(stream)


def _stream(device: Any, stream: Any) -> Any:
    if stream is not None:
        return stream
    if device.type == "cuda":
        return torch.cuda.current_stream(device)
    return None


# K+V bytes of a prefix up to which a KvtierCache gathers into one K and one V block for every
# layer (two allocations) rather than into a tensor per layer and buffer.
_ONE_BLOCK = 256 << 20


class _KvtierLayer(DynamicLayer):
    """A DynamicLayer whose first `prefix` tokens come from the pool, gathered at the layer's
    first update (KvtierCache._gather). Until then `keys`/`values` are [1, heads, prefix,
    head_dim] tensors (or views of one block for every layer), allocated but not filled."""

    def __init__(self, owner: "KvtierCache", index: int, keys: Any, values: Any) -> None:
        super().__init__()
        self._owner = owner
        self._index = index
        self._pending = keys is not None
        if keys is not None:
            self.dtype, self.device = keys.dtype, keys.device
            self.keys = keys
            self.values = values
            self.is_initialized = True

    def materialize(self) -> None:
        if self._pending:
            self._owner._gather(self._index)

    def update(self, key_states: Any, value_states: Any, cache_kwargs: Any = None) -> Any:
        if self._pending:
            self._owner._gather(self._index)
        return super().update(key_states, value_states, cache_kwargs)


class KvtierCache(Cache):
    """A transformers Cache holding a prompt's cached prefix (see the module docstring).

    Attributes:
      prefix_tokens: tokens of the prompt the cache holds before the model runs.
      sources: {"device": n, "host": n, "storage": n} — where those tokens came from.
    """

    def __init__(self, pool: KvtierPool, match: Any, tokens: Any, slots: Any,
                 sources: Dict[str, int], namespace: str, stream: Any, loading: bool) -> None:
        self._pool = pool
        self._match = match
        self._tokens = tokens  # int32 CPU tensor
        self._slots = slots
        self._namespace = namespace
        self._stream = stream
        self._stream_id = 0 if stream is None else int(stream.cuda_stream)
        self._saved = False
        self._loading = loading  # host hits were loaded: gather layer by layer after the waits
        self.prefix_tokens = len(slots)
        self.sources = sources
        n = pool.num_layers
        self._plan = None
        self._dense = None  # the per-layer tensors the plan was given (cleared once gathered)
        self._left = 0  # layers still to gather
        views = [(None, None)] * n
        if self.prefix_tokens:
            shape = (1, pool.heads, self.prefix_tokens, pool.head_dim)
            itemsize = pool.k.element_size()
            if 2 * n * pool.heads * self.prefix_tokens * pool.head_dim * itemsize <= _ONE_BLOCK:
                # Short prefixes: one K and one V tensor for every layer (two allocations).
                k = torch.empty((n, *shape), dtype=pool.dtype, device=pool.device)
                v = torch.empty((n, *shape), dtype=pool.dtype, device=pool.device)
                self._plan = ops.DensePagedPlan(pool.region, slots, k, v)
                views = list(zip(k.unbind(0), v.unbind(0)))
            else:
                # Long ones: a tensor per layer, freed when the model's first update of the layer
                # replaces it (one block would live until the last layer's: twice the memory).
                ks = [torch.empty(shape, dtype=pool.dtype, device=pool.device) for _ in range(n)]
                vs = [torch.empty(shape, dtype=pool.dtype, device=pool.device) for _ in range(n)]
                self._plan = ops.DensePagedPlan(pool.region, slots, ks, vs)
                self._dense = (ks, vs)
                views = list(zip(ks, vs))
            self._left = n
        super().__init__(layers=[_KvtierLayer(self, i, views[i][0], views[i][1])
                                 for i in range(n)])

    def _gather(self, index: int) -> None:
        """Gathers layer `index`'s prefix (after its wait_layer) — or, on a device hit (nothing
        loaded), every layer at once: one kernel instead of one per layer."""
        wait = self._pool.cache._native.wait_layer  # the checks of cache.wait_layer were done
        handle, stream = self._match.handle, self._stream_id
        if self._loading:
            layer = self.layers[index]
            layer._pending = False
            wait(handle, index, stream)
            self._plan._native.run(index, 1, False, stream)
            self._left -= 1
            if self._dense is not None:  # the layer holds its tensors now, the plan no longer
                self._dense[0][index] = self._dense[1][index] = None
        else:
            # A device hit can still wait for another request's load into the same slots.
            for i, layer in enumerate(self.layers):
                if layer._pending:
                    wait(handle, i, stream)
                    layer._pending = False
            self._plan._native.run(0, len(self.layers), False, stream)
            self._left = 0
        if self._left == 0:  # the tensors stay with their layers until the model replaces them
            self._plan = self._dense = None

    def materialize(self) -> None:
        """Gathers every layer's prefix now (the model does it layer by layer otherwise)."""
        for layer in self.layers:
            if isinstance(layer, _KvtierLayer):
                layer.materialize()

    def save(self, token_ids: Any, *, align: Optional[int] = None, stream: Any = None) -> int:
        """Inserts the KV of the leading tokens of `token_ids` that the model computed into
        kvtier: min(len(token_ids), seq length) rounded down to `align` (default: the page size)
        tokens. Pass the prompt (not generated tokens) to keep cached KV identical to a chunked
        prefill's. Releases the match after the stream's work (the gathers read its slots).
        `stream`: where the model wrote the KV (default: cache_for's). Returns the tokens now
        cached. Once per cache."""
        if self._saved:
            raise ValueError("this KvtierCache was saved already")
        pool = self._pool
        tokens = _token_tensor(token_ids, "token_ids")
        common = min(len(tokens), len(self._tokens))
        if not torch.equal(tokens[:common], self._tokens[:common]):
            raise ValueError("token_ids do not start with the prompt this cache was made for")
        align = pool.page_size if align is None else int(align)
        if align <= 0 or align % pool.page_size:
            raise ValueError(f"align = {align} must be a positive multiple of the page size")
        self.materialize()
        n = min(len(tokens), self.get_seq_length())
        n -= n % align
        stream = self._stream if stream is None else stream
        hc = pool.cache
        try:
            if n <= self.prefix_tokens:
                return self.prefix_tokens
            new = n - self.prefix_tokens
            with _current(stream):
                slots = hc.allocate_device_slots(new)
            ops.scatter_dense(pool.region, slots,
                              [layer.keys[:, :, self.prefix_tokens:n] for layer in self.layers],
                              [layer.values[:, :, self.prefix_tokens:n] for layer in self.layers],
                              stream=stream)
            prefix = self._slots.to(slots.device) if isinstance(self._slots, torch.Tensor) \
                else torch.as_tensor(self._slots)
            hc.insert(tokens[:n], torch.cat([prefix, slots]), self._namespace, stream=stream)
            return n
        finally:
            self._saved = True
            self._release(stream)

    def release(self) -> None:
        """Unpins the matched prefix without saving (after the stream's work)."""
        self._saved = True
        self._release(self._stream)

    def _release(self, stream: Any) -> None:
        if not self._match.released:
            self._pool.cache.release(self._match, stream=stream)
