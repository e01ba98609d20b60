"""examples/tp_torch_distributed.py: a TP=2 group of torch.distributed ranks (gloo for setup only),
each rank's device pool on its own GPU (cuda:0, cuda:1) — a shared prefix reused through device,
host and storage, every rank's loaded bytes checked, then TP=1 reading the store TP=2 filled.
The two-GPU test skips (saying why) with fewer than 2 GPUs, without torch or without a CUDA build
of kvtier; the cpu-device run needs torch only."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the TP example needs PyTorch (torch.distributed)")

import kvtier  # noqa: E402

if not hasattr(kvtier, "TpFollower"):
    pytest.skip("kvtier built without the cache manager", allow_module_level=True)

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                       "tp_torch_distributed.py")


def run_example(*args):
    r = subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True,
                       timeout=240)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "tp_torch_distributed: PASS" in r.stdout
    assert "WRONG" not in r.stdout
    return r.stdout


def test_example_on_two_gpus():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        pytest.skip(f"SKIPPED: the TP=2 example needs 2 GPUs, this machine has {gpus}")
    if not kvtier.built_with_cuda():
        pytest.skip("SKIPPED: kvtier was built without CUDA")
    out = run_example("--device", "gpu")
    assert "device pools on cuda:0..1" in out


def test_example_on_the_cpu_device():
    run_example("--device", "cpu", "--layers", "2", "--pool-slots", "1024", "--prefix-tokens", "256")
