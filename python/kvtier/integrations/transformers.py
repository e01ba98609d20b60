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
unmodified `model(...)` / `model.generate(...)` computes only the rest. Each layer's prefix is
gathered from the pool into the layer's dense K/V (kvtier.ops.gather_dense) when the model first
updates that layer, after `wait_layer` made the current stream wait for that layer's load: layer
l's attention overlaps the loads of layers > l. `KvtierCache.save(token_ids)` scatters the KV the
model computed for the prompt into freshly allocated pool slots (kvtier.ops.scatter_dense, one
call for every layer) and inserts the prefix into the cache (the write policy then backs it up to
host memory and storage), and releases the match once the current stream's reads are done.

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

import re
from typing import Any, Dict, Optional

from .. import ops
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
      **settings: kvtier.HierarchicalCache settings. Defaults here differ from the cache's where a
        single-process chat wants them to: write_policy="write_through" (back up every insert),
        prefetch_policy="wait_complete", prefetch_threshold_tokens=0.
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
        self.k = torch.zeros(pool_shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(pool_shape, dtype=dtype, device=self.device)
        slot_bytes = self.heads * self.head_dim * self.k.element_size()
        self.region = ops.KvRegion(layout="layer_first", num_layers=self.num_layers,
                                   slot_bytes=slot_bytes, page_size=self.page_size, k=self.k,
                                   v=self.v, name="pool")
        settings.setdefault("write_policy", "write_through")
        settings.setdefault("prefetch_policy", "wait_complete")
        settings.setdefault("prefetch_threshold_tokens", 0)
        settings.setdefault("storage_model_id", getattr(config, "_name_or_path", "") or "")
        self.cache = HierarchicalCache(self.region, **settings)

    def cache_for(self, input_ids: Any, *, namespace: str = "", align: Optional[int] = None,
                  stream: Any = None) -> "KvtierCache":
        """A KvtierCache holding the longest cached prefix of `input_ids` ([1, T] or [T]) that
        leaves at least one token to compute, rounded down to a multiple of `align` tokens
        (default: the page size; a multiple of it). Storage hits are read into host memory and
        host hits copied to the device on `stream` (default: the current stream)."""
        tokens = _token_list(input_ids)
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
        stream = _stream(self.device, stream)
        loaded = cache.load_back(match, stream=stream)
        usable = min(len(loaded.device_slots), max(len(tokens) - 1, 0))
        usable -= usable % align
        # What the usable prefix came from, fastest tier first.
        sources, left = {}, usable
        for tier in ("device", "host", "storage"):
            sources[tier] = min(tiers[tier], left)
            left -= sources[tier]
        slots = loaded.device_slots[:usable]
        if isinstance(slots, torch.Tensor) and slots.device != self.device and \
                self.device.type == "cuda":
            slots = slots.to(self.device)
        return KvtierCache(self, match, tokens, slots, sources, namespace)

    def close(self) -> None:
        self.cache.close()


def _token_list(input_ids: Any) -> list:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(f"input_ids has batch size {input_ids.shape[0]}; kvtier's "
                                 "transformers cache serves one prompt at a time (batch 1)")
            input_ids = input_ids[0]
        if input_ids.dim() != 1:
            raise ValueError(f"input_ids must be [1, T] or [T], got {tuple(input_ids.shape)}")
        return input_ids.tolist()
    return [int(t) for t in input_ids]


def _stream(device: Any, stream: Any) -> Any:
    if stream is not None:
        return stream
    if device.type == "cuda":
        return torch.cuda.current_stream(device)
    return None


class _KvtierLayer(DynamicLayer):
    """A DynamicLayer whose first `prefix` tokens come from the pool, gathered at the layer's
    first update (after wait_layer). Until then `keys`/`values` are allocated but not filled."""

    def __init__(self, owner: "KvtierCache", index: int, prefix: int) -> None:
        super().__init__()
        self._owner = owner
        self._index = index
        self._pending = prefix > 0
        if prefix > 0:
            pool = owner._pool
            shape = (1, pool.heads, prefix, pool.head_dim)
            self.dtype, self.device = pool.dtype, pool.device
            self.keys = torch.empty(shape, dtype=pool.dtype, device=pool.device)
            self.values = torch.empty(shape, dtype=pool.dtype, device=pool.device)
            self.is_initialized = True

    def materialize(self) -> None:
        if not self._pending:
            return
        self._pending = False
        owner, pool = self._owner, self._owner._pool
        pool.cache.wait_layer(owner._match, self._index)
        ops.gather_dense(pool.region, owner._slots, [self.keys], [self.values],
                         first_layer=self._index)

    def update(self, key_states: Any, value_states: Any, cache_kwargs: Any = None) -> Any:
        self.materialize()
        return super().update(key_states, value_states, cache_kwargs)


class KvtierCache(Cache):
    """A transformers Cache holding a prompt's cached prefix (see the module docstring).

    Attributes:
      prefix_tokens: tokens of the prompt the cache holds before the model runs.
      sources: {"device": n, "host": n, "storage": n} — where those tokens came from.
    """

    def __init__(self, pool: KvtierPool, match: Any, tokens: list, slots: Any,
                 sources: Dict[str, int], namespace: str) -> None:
        self._pool = pool
        self._match = match
        self._tokens = tokens
        self._slots = slots
        self._namespace = namespace
        self._saved = False
        self.prefix_tokens = len(slots)
        self.sources = sources
        super().__init__(layers=[_KvtierLayer(self, i, self.prefix_tokens)
                                 for i in range(pool.num_layers)])

    def materialize(self) -> None:
        """Gathers every layer's prefix now (the model does it layer by layer otherwise)."""
        for layer in self.layers:
            if isinstance(layer, _KvtierLayer):
                layer.materialize()

    def save(self, token_ids: Any, *, align: Optional[int] = None, stream: Any = None) -> int:
        """Inserts the KV of the leading tokens of `token_ids` that the model computed into
        kvtier: min(len(token_ids), seq length) rounded down to `align` (default: the page size)
        tokens. Pass the prompt (not generated tokens) to keep cached KV identical to a chunked
        prefill's. Releases the match after the current stream's work (the gathers read its
        slots). Returns the tokens now cached. Once per cache."""
        if self._saved:
            raise ValueError("this KvtierCache was saved already")
        pool = self._pool
        tokens = _token_list(token_ids)
        if tokens[:len(self._tokens)] != self._tokens[:len(tokens)]:
            raise ValueError("token_ids do not start with the prompt this cache was made for")
        align = pool.page_size if align is None else int(align)
        if align <= 0 or align % pool.page_size:
            raise ValueError(f"align = {align} must be a positive multiple of the page size")
        self.materialize()
        n = min(len(tokens), self.get_seq_length())
        n -= n % align
        stream = _stream(pool.device, stream)
        hc = pool.cache
        try:
            if n <= self.prefix_tokens:
                return self.prefix_tokens
            new = n - self.prefix_tokens
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
        """Unpins the matched prefix without saving (after the current stream's work)."""
        self._saved = True
        self._release(_stream(self._pool.device, None))

    def _release(self, stream: Any) -> None:
        if not self._match.released:
            self._pool.cache.release(self._match, stream=stream)
