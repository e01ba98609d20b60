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


def test_as_int_is_the_kv_event_block_hash():
    # The last 8 bytes of each key, big-endian unsigned: int.from_bytes(key, "big") & (2**64 - 1),
    # vLLM's rule for int block hashes.
    assert kvtier.page_keys([1, 2, 3, 4], 4, as_int=True) == [0x27120E72AB733B72]
    tokens = [(i * 104729) % 150000 for i in range(16 * 40)]
    for salt in ("", "tenant-a"):
        hashes = kvtier.page_keys(tokens, 16, salt=salt, as_int=True)
        expected = [int(k, 16) & (2**64 - 1) for k in reference_keys(tokens, 16, salt)]
        assert hashes == expected
        assert all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)
    assert any(h >= 2**63 for h in kvtier.page_keys(tokens, 16, as_int=True))
    assert kvtier.page_keys([1, 2, 3], 16, as_int=True) == []
    with pytest.raises(ValueError, match="page_size"):
        kvtier.page_keys([1, 2, 3, 4], 0, as_int=True)


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
    ([1, 2, 3, 4], 1.5, "page_size"),  # a float: ValueError, not pybind11's TypeError (issue 36)
    ([1, 2, 3, 4], "2", "page_size"),
    ([1, 2, 3, 4], True, "page_size"),
])
def test_bad_input_is_value_error(tokens, page_size, needle):
    with pytest.raises(ValueError, match=needle):
        kvtier.page_keys(tokens, page_size)
