"""The extra_config of kvtier's SGLang backend (kvtier.integrations.sglang.config): needs no SGLang.

Every field is kvtier's (declared once: the integration's table and the C++ StorageOptions
schema) or SGLang's own; anything else is an error naming it, and docs/sglang.md documents
every field there is.
"""

import logging
import os

import pytest

import kvtier
from kvtier.integrations.sglang import config

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "sglang.md")
SGLANG_PART = {"backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
               "class_name": "KvtierHiCacheStorage", "interface_v1": 1}


def parse(model_name="org/model", **fields):
    return config.parse_extra_config({**SGLANG_PART, **fields}, model_name)


def test_fields_split_into_kvtier_parts():
    c = parse(url="file:///tmp/x", io_threads=8, timeout_ms=500)
    assert c.url == "file:///tmp/x" and c.model_id == "org/model" and c.interface_v1
    assert dict(c.storage_options) == {"io_threads": 8, "timeout_ms": 500}
    assert parse(url="redis://h", model_id="shared").model_id == "shared"


def test_storage_options_are_the_cxx_schema():
    names = [f["name"] for f in kvtier.PageStore.storage_option_fields()]
    assert config.storage_option_names() == tuple(names)
    assert "io_threads" in names and "timeout_ms" in names


@pytest.mark.parametrize("bad", ["io_thread", "URL", "prefetch_threshold", "tp_lcm_size"])
def test_unknown_field_is_an_error_naming_it(bad):
    with pytest.raises(ValueError, match=f"'{bad}'") as e:
        parse(url="file:///tmp/x", **{bad: 1})
    assert "io_threads" in str(e.value) and "url" in str(e.value)  # says what there is


def test_url_is_required_and_a_string():
    with pytest.raises(ValueError, match="'url' is required"):
        parse()
    for bad in ["", 7, ["file:///x"]]:
        with pytest.raises(ValueError, match="'url'"):
            parse(url=bad)
    with pytest.raises(ValueError, match="'model_id'"):
        parse(url="file:///x", model_id=3)


def test_a_model_name_is_needed():
    with pytest.raises(ValueError, match="model_id"):
        config.parse_extra_config({**SGLANG_PART, "url": "file:///x"}, None)
    assert config.parse_extra_config({**SGLANG_PART, "url": "file:///x", "model_id": "m"},
                                     None).model_id == "m"


def test_without_interface_v1_a_warning(caplog):
    extra = {k: v for k, v in SGLANG_PART.items() if k != "interface_v1"}
    with caplog.at_level(logging.WARNING):
        c = config.parse_extra_config({**extra, "url": "file:///x"}, "m")
    assert not c.interface_v1 and "interface_v1" in caplog.text


def test_docs_name_every_field():
    text = open(DOCS).read()
    names = list(config.SGLANG_KEYS) + [f.name for f in config.INTEGRATION_FIELDS] + \
        list(config.storage_option_names())
    missing = [n for n in names if f"`{n}`" not in text]
    assert not missing, f"docs/sglang.md does not document {missing}"
