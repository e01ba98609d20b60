"""Where the vLLM tests find vLLM: the source folder named by KVTIER_VLLM_SRC (default: the repo's
.engines/vllm, which is git-ignored and carried to the GPU machine), plus kvtier's stand-ins for the
vLLM modules that cannot run here (python/tests/vllm_stubs: vLLM's logger, shm_broadcast's
free-space check, CUDA host registration). vLLM's own kv_offload classes come from the source
folder, unmodified.

vLLM cannot be fetched by CI, so a missing folder is a skip with the reason, not a failure; with
KVTIER_VLLM_REQUIRED=1 (scripts/vllm_check.sh) it is an error."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
STUBS = os.path.join(_HERE, "vllm_stubs")


def vllm_source_dir() -> str:
    return os.environ.get("KVTIER_VLLM_SRC") or os.path.join(_REPO, ".engines", "vllm")


def add_vllm_to_path() -> str | None:
    """Puts vLLM's source folder and the stubs on sys.path; returns why not (for pytest.skip)."""
    src = vllm_source_dir()
    marker = os.path.join(src, "vllm", "v1", "kv_offload", "tiering", "manager.py")
    if not os.path.isfile(marker):
        why = (f"vLLM's source is not at {src} (set KVTIER_VLLM_SRC to a vLLM source folder with "
               "vllm/v1/kv_offload/tiering; see docs/vllm.md)")
        if os.environ.get("KVTIER_VLLM_REQUIRED") == "1":
            raise RuntimeError(why)
        return why
    for path in (STUBS, src):
        if path not in sys.path:
            sys.path.insert(0, path)
    return None
