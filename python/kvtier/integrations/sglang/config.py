"""The ``--hicache-storage-backend-extra-config`` of kvtier's SGLang storage backend.

SGLang hands the parsed JSON object to the backend as ``HiCacheStorageConfig.extra_config``
(after popping its own prefetch settings). Its keys are of three kinds, each declared once:

* SGLang's own (``SGLANG_KEYS``): read by SGLang's ``backend_factory`` and cache controller, not
  by kvtier; accepted and ignored here.
* kvtier's integration fields (``INTEGRATION_FIELDS``): where the pages go and the deployment's
  name.
* kvtier's storage options: every field of the C++ ``StorageOptions`` schema by its name
  (``kvtier.PageStore.storage_option_fields()``: io_threads, timeout_ms, ...), passed to
  ``kvtier.PageStore``, which checks each value against the schema's bounds.

Any other key is an error naming it (a typo must not silently fall back to a default).

Thread safety: pure functions over their arguments.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Optional

logger = logging.getLogger(__name__)

# Keys of extra_config that SGLang itself reads (backend_factory's dynamic loading; the cache
# controller's choice of the zero-copy interface). SGLang pops its prefetch settings and
# tp_lcm_size before the backend sees the dict.
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")


@dataclasses.dataclass(frozen=True)
class IntegrationField:
    name: str
    required: bool
    help: str


INTEGRATION_FIELDS = (
    IntegrationField(
        "url", True,
        "the kvtier store: file:///abs/dir[?capacity=..], redis://[[user]:password@]host[:port], "
        "redis+cluster://host:port[,host:port...] or memory://NAME (one process only)"),
    IntegrationField(
        "model_id", False,
        "the model's name in the store's namespace; default: SGLang's model name "
        "(--served-model-name, else --model-path). Deployments that should share pages give "
        "the same name"),
)
_INTEGRATION_NAMES = tuple(f.name for f in INTEGRATION_FIELDS)


@dataclasses.dataclass(frozen=True)
class BackendConfig:
    """A checked extra_config: the store's URL, the model's name and the storage options."""

    url: str
    model_id: str
    storage_options: Mapping[str, Any]
    interface_v1: bool


def storage_option_names() -> tuple:
    """The names of kvtier's storage options (the C++ StorageOptions schema)."""
    import kvtier

    return tuple(f["name"] for f in kvtier.PageStore.storage_option_fields())


def parse_extra_config(extra_config: Optional[Mapping[str, Any]],
                       model_name: Optional[str]) -> BackendConfig:
    """Checks extra_config and splits it into kvtier's parts.

    Raises ValueError naming the key for an unknown key, a missing or empty url, a url or
    model_id that is not a string, and no model name at all. The storage options' values are
    checked by kvtier.PageStore when the store opens (also a ValueError naming the option).
    """
    extra = dict(extra_config or {})
    options = storage_option_names()
    known = set(SGLANG_KEYS) | set(_INTEGRATION_NAMES) | set(options)
    unknown = sorted(k for k in extra if k not in known)
    if unknown:
        raise ValueError(
            f"kvtier SGLang backend: unknown extra_config field(s) {unknown}; kvtier's fields "
            f"are {list(_INTEGRATION_NAMES)} and the storage options {list(options)} "
            f"(SGLang's own: {list(SGLANG_KEYS)})")
    for field in INTEGRATION_FIELDS:
        value = extra.get(field.name)
        if value is None:
            if field.required:
                raise ValueError(f"kvtier SGLang backend: extra_config field '{field.name}' is "
                                 f"required: {field.help}")
            continue
        if not isinstance(value, str) or not value:
            raise ValueError(f"kvtier SGLang backend: extra_config field '{field.name}' = "
                             f"{value!r} must be a non-empty string: {field.help}")
    model_id = extra.get("model_id") or model_name
    if not model_id:
        raise ValueError("kvtier SGLang backend: no model name: SGLang passed none, so set "
                         "extra_config field 'model_id'")
    interface_v1 = bool(extra.get("interface_v1", 0))
    if not interface_v1:
        logger.warning("kvtier SGLang backend: extra_config has no \"interface_v1\": 1, so SGLang "
                       "uses its copying interface (batch_get/batch_set through torch tensors) "
                       "instead of kvtier's zero-copy batch_get_v1/batch_set_v1")
    return BackendConfig(url=extra["url"], model_id=model_id,
                         storage_options={k: extra[k] for k in options if k in extra},
                         interface_v1=interface_v1)
