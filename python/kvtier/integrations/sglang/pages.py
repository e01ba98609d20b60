"""Where SGLang's host KV pool keeps each page: the addresses kvtier.PageStore reads and writes.

SGLang states a page's place in its host pool with ``HostKVCache.get_page_buffer_meta(indices)``:
per page, the addresses of its pieces and their byte sizes. A page of page_first,
page_first_direct or page_head is one piece per buffer (MHA: K then V; MLA: one buffer); a page of
layer_first (SGLang's default host layout) is one piece per layer and buffer (MHA: K and V of
layer 0, then of layer 1, ...; MLA: layer 0, layer 1, ...). That method walks the pages in Python
(``indices.tolist()``, a loop per page), which costs more than kvtier's whole batched read of a hot
page. So ``HostPoolPages`` asks it once, when the pool is registered, for three pages (the first,
the second and the last), checks that SGLang's answer is ``base + token_index * token_stride +
layer * layer_stride`` per buffer, and from then on computes a batch's addresses (each page's
layer-0 piece per buffer) with numpy in a few microseconds; kvtier.PageStore takes them with
``layer_stride`` (0 when a page is one piece per buffer) and, for layer_first, gathers / scatters
the pieces in C++. SGLang's method stays the one statement of the layout; a pool whose answer is
not of that form is refused (``NotImplementedError`` naming the layout), never guessed at.

Every batch's host indices are checked before an address is formed: one index per token of each
page, each page's indices consecutive from a multiple of ``page_size``, inside the pool.
A bad batch is ``ValueError`` naming the first bad page, so no byte moves outside the pool.

Thread safety: immutable after construction; ``addresses`` may be called from several threads.
"""

from __future__ import annotations

import numpy as np

# Layouts whose pages SGLang's host pools keep contiguous per buffer (K, V or the MLA buffer), so
# a page is written and read in place.
CONTIGUOUS_LAYOUTS = ("page_first", "page_first_direct", "page_head")
# Every layout served: layer_first pages are one piece per layer, gathered / scattered in C++.
SUPPORTED_LAYOUTS = CONTIGUOUS_LAYOUTS + ("layer_first",)


class HostPoolPages:
    """The page addresses of one SGLang host pool (HostKVCache), checked and vectorised.

    ``layer_stride``: bytes between a page's layer pieces (layer_first), 0 when a page is one
    piece per buffer; pass it to kvtier.PageStore.get / set with the addresses.
    """

    def __init__(self, host_pool, page_bytes: int, num_buffers: int):
        layout = getattr(host_pool, "layout", None)
        if layout not in SUPPORTED_LAYOUTS:
            raise NotImplementedError(
                f"kvtier SGLang backend: host pool layout '{layout}' is not supported "
                f"({', '.join(SUPPORTED_LAYOUTS)} are)")
        self.layout = layout
        self.page_size = int(host_pool.page_size)
        self.pool_tokens = int(host_pool.size)
        self.num_buffers = num_buffers
        self.segment_bytes = page_bytes // num_buffers
        # Pieces of one buffer of one page, as SGLang lists them.
        pieces = int(host_pool.layer_num) if layout == "layer_first" else 1
        piece_bytes = self.segment_bytes // pieces
        pages = self.pool_tokens // self.page_size
        if pages < 2:
            raise ValueError(f"kvtier SGLang backend: the host pool has {pages} page(s); "
                             f"at least 2 are needed")
        probe = [0, 1, pages - 1]  # page numbers asked of SGLang
        ptrs = []  # per probed page: int64 [pieces, num_buffers]
        for page in probe:
            start = page * self.page_size
            idx = np.arange(start, start + self.page_size, dtype=np.int64)
            ptr_list, size_list = host_pool.get_page_buffer_meta(_as_indices(idx, host_pool))
            if len(ptr_list) != num_buffers * pieces or any(int(s) != piece_bytes
                                                            for s in size_list):
                raise NotImplementedError(
                    f"kvtier SGLang backend: host pool {type(host_pool).__name__} (layout "
                    f"'{layout}') describes a page as {len(ptr_list)} piece(s) of "
                    f"{sorted(set(int(s) for s in size_list))} bytes; kvtier expects "
                    f"{num_buffers * pieces} piece(s) of {piece_bytes} bytes")
            ptrs.append(np.asarray([int(p) for p in ptr_list],
                                   dtype=np.int64).reshape(pieces, num_buffers))
        self.base = ptrs[0][0].copy()  # [num_buffers]: page 0's layer-0 pieces
        stride = ptrs[1][0] - self.base
        if np.any(stride <= 0) or np.any(stride % self.page_size):
            raise NotImplementedError(
                f"kvtier SGLang backend: host pool layout '{layout}' does not place pages at a "
                f"constant positive stride")
        self.token_stride = stride // self.page_size  # [num_buffers] bytes per token index
        layer_strides = set((ptrs[0][1] - ptrs[0][0]).tolist()) if pieces > 1 else {0}
        self.layer_stride = int(layer_strides.pop())
        if layer_strides or (pieces > 1 and self.layer_stride < piece_bytes):
            raise NotImplementedError(
                f"kvtier SGLang backend: host pool layout '{layout}' does not place a page's "
                f"layers at one stride of at least a piece ({piece_bytes} bytes)")
        layers = np.arange(pieces, dtype=np.int64)[:, None] * self.layer_stride
        for page, got in zip(probe, ptrs):
            want = self.base[None, :] + page * self.page_size * self.token_stride[None, :] + layers
            if not np.array_equal(got, want):
                raise NotImplementedError(
                    f"kvtier SGLang backend: host pool layout '{layout}' is not base + index * "
                    f"token_stride + layer * layer_stride at page {page}")

    def addresses(self, host_indices, num_pages: int) -> np.ndarray:
        """The page addresses of a batch (each page's layer-0 piece per buffer): int64
        [num_pages] (one buffer) or [num_pages, 2].

        ``host_indices``: the batch's host token indices (a torch tensor or anything numpy
        takes), ``num_pages * page_size`` of them. ValueError names the first bad page.
        """
        idx = _to_numpy(host_indices)
        p = self.page_size
        if idx.ndim != 1 or idx.shape[0] != num_pages * p:
            raise ValueError(f"host_indices has shape {tuple(idx.shape)}; {num_pages} pages of "
                             f"{p} tokens need {num_pages * p} indices")
        pages = idx.reshape(num_pages, p)
        starts = pages[:, 0]
        bad = (starts % p != 0) | (starts < 0) | (starts > self.pool_tokens - p)
        if p > 1:
            bad |= np.any(pages != starts[:, None] + np.arange(p, dtype=np.int64), axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"host_indices of page {i} ({pages[i, :4].tolist()}...) are not {p} consecutive "
                f"indices from a multiple of {p} inside the host pool's {self.pool_tokens} tokens")
        addrs = self.base[None, :] + starts[:, None] * self.token_stride[None, :]
        return addrs[:, 0].copy() if self.num_buffers == 1 else addrs


def _to_numpy(indices) -> np.ndarray:
    if hasattr(indices, "detach"):  # a torch tensor (SGLang's host indices are CPU int64)
        indices = indices.detach()
        if indices.device.type != "cpu":
            indices = indices.cpu()
        return indices.numpy().astype(np.int64, copy=False)
    return np.asarray(indices, dtype=np.int64)


def _as_indices(idx: np.ndarray, host_pool):
    """Indices in the type SGLang's pools take (a torch tensor), when torch is there."""
    try:
        import torch
    except ImportError:  # pragma: no cover - SGLang always has torch
        return idx
    return torch.from_numpy(idx)
