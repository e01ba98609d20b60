"""kvtier.ops.configure's settings are the C++ TransferEngineConfig schema: same names, defaults
and bounds; a value just outside a bound is a ValueError with the C++ Validate's wording, and the
bound itself is accepted."""

import pytest

from kvtier import _kvtier, ops

FIELDS = ops.config_fields()
NUMERIC = [f for f in FIELDS if f["kind"] == "int"]


@pytest.fixture(autouse=True)
def restore_engine_config():
    old = ops.engine_config()
    yield
    ops.configure(**old)


def test_the_table_is_the_cpp_schema():
    by_name = {f["name"]: f for f in FIELDS}
    # The bound ops.py once typed as 1: the engine requires 16.
    assert by_name["dma_ops_per_lane"]["min"] == 16
    assert by_name["dma_lanes"]["min"] == 1 and by_name["dma_lanes"]["max"] == 16
    assert "device" not in by_name  # each engine is made for its regions' device
    # Defaults are the C++ struct's: a fresh engine configuration holds them.
    assert set(ops.engine_config()) == set(by_name)
    assert {f["name"]: f["default"] for f in FIELDS}["max_sms_to_host"] == 3
    # The cache's settings take the engine's fields from the same schema.
    cache = {f["name"]: f for f in _kvtier.cache_config_fields()}
    for f in FIELDS:
        assert cache[f["name"]] == f


@pytest.mark.parametrize("field", NUMERIC, ids=[f["name"] for f in NUMERIC])
def test_bounds_are_refused_outside_and_accepted_on(field):
    name, lo, hi = field["name"], field["min"], field["max"]
    ops.configure(**{name: lo})
    assert ops.engine_config()[name] == lo
    ops.configure(**{name: hi})
    assert ops.engine_config()[name] == hi
    # (A value past int64 is refused as not fitting: no C++ field could hold it.)
    for value in [lo - 1] + ([hi + 1] if hi < 2**63 - 1 else []):
        with pytest.raises(ValueError, match=rf"^{name} = {value} must be in \[{lo}, {hi}\]$"):
            ops.configure(**{name: value})
        # The binding alone (no Python check) refuses it with the same words.
        with pytest.raises(ValueError, match=rf"^{name} = {value} must be in \[{lo}, {hi}\]$"):
            _kvtier.configure(**{name: value})
    assert ops.engine_config()[name] == hi  # a refused call changes nothing


def test_dma_ops_per_lane_below_16_is_refused():
    with pytest.raises(ValueError, match=r"dma_ops_per_lane = 1 must be in \[16, 1048576\]"):
        ops.configure(dma_ops_per_lane=1)


def test_unknown_settings_and_wrong_types_are_named():
    with pytest.raises(ValueError, match="'dma_lane' is not a kvtier.ops engine setting"):
        ops.configure(dma_lane=2)
    with pytest.raises(ValueError, match="'device' is not a kvtier.ops engine setting"):
        _kvtier.configure(device=1)
    with pytest.raises(ValueError, match="dma_batch = 1 must be True or False"):
        ops.configure(dma_batch=1)
    with pytest.raises(ValueError, match="max_sms = 2.5 must be an integer"):
        ops.configure(max_sms=2.5)
    with pytest.raises(ValueError, match="max_sms = 2.5 must be an integer"):
        _kvtier.configure(max_sms=2.5)
