"""kvtier.page_keys: SGLang's test vector, chaining, salts, partial pages and bad input.

The expected keys are recomputed here with hashlib, independently of the C++ code.
"""

import hashlib
import struct

import pytest

import kvtier


def reference_keys(tokens, page_size, salt=""):
    prev = hashlib.sha256(salt.encode()).digest() if salt else b""
    keys = []
    for p in range(len(tokens) // page_size):
        page = tokens[p * page_size:(p + 1) * page_size]
        prev = hashlib.sha256(prev + struct.pack(f"<{page_size}I", *page)).digest()
        keys.append(prev.hex())
    return keys


def test_sglang_vector():
    assert kvtier.page_keys([1, 2, 3, 4], 4) == [
        "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72"
    ]


def test_chain_partial_page_and_salt_match_hashlib():
    tokens = [(i * 7919) % 128000 for i in range(16 * 5 + 3)]
    keys = kvtier.page_keys(tokens, 16)
    assert len(keys) == 5
    assert keys == reference_keys(tokens, 16)
    salted = kvtier.page_keys(tokens, 16, salt="tenant-a")
    assert salted == reference_keys(tokens, 16, "tenant-a")
    assert not set(salted) & set(keys)
    assert kvtier.page_keys(tokens, 16, salt="tenant-b") != salted
    assert kvtier.page_keys([2**32 - 1, 0], 2) == reference_keys([2**32 - 1, 0], 2)


def test_accepts_numpy_and_empty():
    np = pytest.importorskip("numpy")
    tokens = np.arange(64, dtype=np.int64)
    assert kvtier.page_keys(tokens, 16) == reference_keys(list(range(64)), 16)
    assert kvtier.page_keys([], 16) == []
    assert kvtier.page_keys([1, 2, 3], 16) == []


@pytest.mark.parametrize("tokens,page_size,needle", [
    ([1, -1, 3, 4], 4, "-1"),
    ([1, 2, 2**32, 4], 2, "position 2"),
    ([1, 2, 3, 4], 0, "page_size"),
    ([1, 2, 3, 4], 2**20 + 1, "page_size"),
])
def test_bad_input_is_value_error(tokens, page_size, needle):
    with pytest.raises(ValueError, match=needle):
        kvtier.page_keys(tokens, page_size)
