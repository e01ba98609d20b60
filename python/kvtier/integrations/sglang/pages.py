"""Where SGLang's host KV pool keeps each page: the addresses kvtier.PageStore reads and writes.

SGLang states a page's place in its host pool with ``HostKVCache.get_page_buffer_meta(indices)``:
per page, the addresses of its contiguous parts (MHA: K then V; MLA: one buffer) and their byte
sizes. That method walks the pages in Python (``indices.tolist()``, a loop per page), which costs
more than kvtier's whole batched read of a hot page. So ``HostPoolPages`` asks it once, when the
pool is registered, for three pages (the first, the second and the last), checks that SGLang's
answer is ``base + token_index * stride`` per part (true of every layout whose page is contiguous
per part: page_first, page_first_direct, page_head), and from then on computes a batch's addresses
with numpy in a few microseconds. SGLang's method stays the one statement of the layout; a pool
whose answer is not of that form is refused (``NotImplementedError`` naming the layout), never
guessed at.

Every batch's host indices are checked before an address is formed: one index per token of each
page, each page's indices consecutive from a multiple of ``page_size``, inside the pool.
A bad batch is ``ValueError`` naming the first bad page, so no byte moves outside the pool.

Thread safety: immutable after construction; ``addresses`` may be called from several threads.
"""

from __future__ import annotations

import numpy as np

# Layouts whose pages SGLang's host pools keep contiguous per part (K, V or the MLA buffer), so a
# page is one kvtier page object written and read in place.
CONTIGUOUS_LAYOUTS = ("page_first", "page_first_direct", "page_head")


class HostPoolPages:
    """The page addresses of one SGLang host pool (HostKVCache), checked and vectorised."""

    def __init__(self, host_pool, page_bytes: int, num_buffers: int):
        layout = getattr(host_pool, "layout", None)
        if layout not in CONTIGUOUS_LAYOUTS:
            raise NotImplementedError(
                f"kvtier SGLang backend: host pool layout '{layout}' is not supported: kvtier "
                f"reads and writes pages in place, which needs a page's bytes contiguous per "
                f"buffer ({', '.join(CONTIGUOUS_LAYOUTS)}; start SGLang with "
                f"--hicache-mem-layout page_first or page_first_direct)")
        self.layout = layout
        self.page_size = int(host_pool.page_size)
        self.pool_tokens = int(host_pool.size)
        self.num_buffers = num_buffers
        self.segment_bytes = page_bytes // num_buffers
        pages = self.pool_tokens // self.page_size
        if pages < 2:
            raise ValueError(f"kvtier SGLang backend: the host pool has {pages} page(s); "
                             f"at least 2 are needed")
        probe = [0, 1, pages - 1]  # page numbers asked of SGLang
        ptrs = []
        for page in probe:
            start = page * self.page_size
            idx = np.arange(start, start + self.page_size, dtype=np.int64)
            ptr_list, size_list = host_pool.get_page_buffer_meta(_as_indices(idx, host_pool))
            if len(ptr_list) != num_buffers or any(int(s) != self.segment_bytes
                                                   for s in size_list):
                raise NotImplementedError(
                    f"kvtier SGLang backend: host pool {type(host_pool).__name__} (layout "
                    f"'{layout}') describes a page as {len(ptr_list)} part(s) of "
                    f"{sorted(set(int(s) for s in size_list))} bytes; kvtier's page is "
                    f"{num_buffers} part(s) of {self.segment_bytes} bytes")
            ptrs.append([int(p) for p in ptr_list])
        self.base = np.asarray(ptrs[0], dtype=np.int64)  # [num_buffers]
        stride = np.asarray(ptrs[1], dtype=np.int64) - self.base
        if np.any(stride <= 0) or np.any(stride % self.page_size):
            raise NotImplementedError(
                f"kvtier SGLang backend: host pool layout '{layout}' does not place pages at a "
                f"constant positive stride")
        self.token_stride = stride // self.page_size  # [num_buffers] bytes per token index
        last = self.base + probe[2] * self.page_size * self.token_stride
        if not np.array_equal(last, np.asarray(ptrs[2], dtype=np.int64)):
            raise NotImplementedError(
                f"kvtier SGLang backend: host pool layout '{layout}' is not base + index * "
                f"stride at its last page")

    def addresses(self, host_indices, num_pages: int) -> np.ndarray:
        """The page addresses of a batch: int64 [num_pages] (one buffer) or [num_pages, 2].

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
