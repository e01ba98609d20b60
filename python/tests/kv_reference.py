"""Independent numpy reference for the KV layouts of docs/architecture.md §2 (used by the tests).

A buffer of any layout is viewed as the canonical array [L, N, S] (layer, slot, bytes of the slot)
with plain reshapes and transposes, so the reference shares no code with kvtier's address math.
"""

import numpy as np

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")


def buffer_shape(layout, L, N, S, P=1, H=1):
    if layout == "layer_first":
        return (L, N, S)
    if layout == "page_first":
        return (N, L, S)
    if layout == "page_first_direct":
        return (N // P, L, P, S)
    if layout == "page_head":
        return (N // P, H, P, L, S // H)
    raise ValueError(layout)


def to_canonical(buf, layout, L, N, S, P=1, H=1):
    """[L, N, S] uint8 copy of a buffer (any dtype) in `layout`."""
    b = np.asarray(buf).view(np.uint8).reshape(buffer_shape(layout, L, N, S, P, H))
    if layout == "layer_first":
        c = b
    elif layout == "page_first":
        c = b.transpose(1, 0, 2)
    elif layout == "page_first_direct":
        c = b.transpose(1, 0, 2, 3)
    else:  # page_head: (p, h, o, l, d) -> (l, p, o, h, d)
        c = b.transpose(3, 0, 2, 1, 4)
    return np.ascontiguousarray(c).reshape(L, N, S)


def from_canonical(canon, layout, L, N, S, P=1, H=1):
    """Inverse of to_canonical: the uint8 buffer bytes, in the layout's shape."""
    c = np.asarray(canon, dtype=np.uint8).reshape(L, N, S)
    if layout == "layer_first":
        b = c
    elif layout == "page_first":
        b = c.transpose(1, 0, 2)
    elif layout == "page_first_direct":
        b = c.reshape(L, N // P, P, S).transpose(1, 0, 2, 3)
    else:
        b = c.reshape(L, N // P, P, H, S // H).transpose(1, 3, 2, 0, 4)
    return np.ascontiguousarray(b)


def expected_copy(src_canon, dst_canon, si, di, src_layer, dst_layer, num_layers):
    """dst_canon after copying layers/slots as a TransferRequest does."""
    out = dst_canon.copy()
    si = np.asarray(si, dtype=np.int64)
    di = np.asarray(di, dtype=np.int64)
    for k in range(num_layers):
        out[dst_layer + k, di] = src_canon[src_layer + k, si]
    return out


def random_bytes(rng, shape):
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def random_indices(rng, count, num_slots, page_size=1, distinct=True):
    """`count` slot indices in runs of whole pages (page-aligned runs, as engines allocate)."""
    pages_needed = -(-count // page_size)
    num_pages = num_slots // page_size
    pages = rng.choice(num_pages, size=pages_needed, replace=not distinct and pages_needed > num_pages)
    idx = (pages[:, None] * page_size + np.arange(page_size)[None, :]).reshape(-1)[:count]
    return idx.astype(np.int64)
