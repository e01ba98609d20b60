"""kvtier.compat.sgl_kernel_hook: SGLang's `sgl_kernel.kvcacheio` imports answered by kvtier.

Needs no SGLang: the hook is checked in fresh interpreters (so the test process's imports stay
as they were), through its one-line launcher and its sitecustomize, in a spawned child process
too (how SGLang starts its schedulers), and with a real-looking `sgl_kernel` package present
(a folder made here standing for the compiled one, whose other names must stay reachable).
A copy through the hooked module is checked byte for byte.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import kvtier.compat.sgl_kernel as drop_in
import kvtier.compat.sgl_kernel_hook as hook


def run_python(code, env=None, args=()):
    env = dict(os.environ if env is None else env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


CHECK = """
    import multiprocessing as mp
    import numpy as np

    def names():
        import sgl_kernel.kvcacheio as k
        import kvtier.compat.sgl_kernel as d
        assert getattr(k, "__kvtier__", False), k
        assert all(getattr(k, n) is getattr(d, n) for n in d.__all__)
        return sorted(d.__all__)

    def copy():
        from sgl_kernel.kvcacheio import transfer_kv_per_layer
        rng = np.random.default_rng(3)
        src_k = rng.integers(0, 256, (64, 32), dtype=np.uint8)
        src_v = rng.integers(0, 256, (64, 32), dtype=np.uint8)
        dst_k = np.full((64, 32), 0xA5, np.uint8)
        dst_v = np.full((64, 32), 0xA5, np.uint8)
        si = np.array([5, 9, 63, 0], np.int64)
        di = np.array([1, 2, 3, 60], np.int64)
        transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, si, di, 32)
        assert (dst_k[di] == src_k[si]).all() and (dst_v[di] == src_v[si]).all()
        rest = np.setdiff1d(np.arange(64), di)
        assert (dst_k[rest] == 0xA5).all() and (dst_v[rest] == 0xA5).all()

    def child(q):
        q.put(names())

    if __name__ == "__main__":
        expected = names()
        copy()
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        got = q.get(timeout=60)
        p.join(60)
        assert got == expected, (got, expected)
        print("ok", len(expected))
"""


def test_launcher_installs_hook_in_spawned_children(tmp_path):
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent(CHECK))
    out = subprocess.run([sys.executable, "-m", "kvtier.compat.sgl_kernel_hook", str(script)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == f"ok {len(drop_in.__all__)}"


def test_site_dir_line_and_real_sgl_kernel_kept(tmp_path):
    # A folder standing for the compiled sgl_kernel: a name of its own, and a kvcacheio that
    # must never be imported while the hook is on.
    pkg = tmp_path / "sgl_kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("own_op = 'real sgl_kernel'\n")
    (pkg / "kvcacheio.py").write_text("raise ImportError('the real kvcacheio was imported')\n")
    site = run_python("import kvtier.compat.sgl_kernel_hook as h; h.main(['--site-dir'])").strip()
    assert site == hook.SITE_DIR and os.path.isfile(os.path.join(site, "sitecustomize.py"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([site, str(tmp_path), env.get("PYTHONPATH", "")])
    out = run_python("""
        import sgl_kernel, sgl_kernel.kvcacheio as k
        assert sgl_kernel.own_op == 'real sgl_kernel'
        assert k.__kvtier__ and k.transfer_kv_direct.__module__ == 'kvtier.compat.sgl_kernel'
        print('ok')
    """, env=env)
    assert out.strip() == "ok"


def test_without_hook_nothing_changes(tmp_path):
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("")
    (tmp_path / "sgl_kernel" / "kvcacheio.py").write_text("ORIGINAL = True\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    out = run_python("""
        import sgl_kernel.kvcacheio as k
        assert k.ORIGINAL
        import kvtier.compat.sgl_kernel_hook as h
        h.install()
        import importlib, sys
        assert 'sgl_kernel.kvcacheio' not in sys.modules   # dropped, so the next import is kvtier's
        k2 = importlib.import_module('sgl_kernel.kvcacheio')
        assert k2.__kvtier__
        h.uninstall()
        assert 'sgl_kernel.kvcacheio' not in sys.modules
        assert importlib.import_module('sgl_kernel.kvcacheio').ORIGINAL
        print('ok')
    """, env=env)
    assert out.strip() == "ok"


def test_no_sgl_kernel_installed_gives_only_kvcacheio():
    import importlib.util

    if importlib.util.find_spec("sgl_kernel") is not None:
        pytest.skip("sgl_kernel is installed here; the test is of a machine without it")
    out = run_python("""
        import kvtier.compat.sgl_kernel_hook as h
        h.install()
        import sgl_kernel.kvcacheio as k
        assert k.__kvtier__
        try:
            from sgl_kernel import sgl_per_token_quant_fp8  # noqa: F401
        except ImportError as e:
            print('ImportError', 'sgl_per_token_quant_fp8' in str(e))
    """)
    assert out.strip() == "ImportError True"


def test_usage_without_arguments():
    out = subprocess.run([sys.executable, "-m", "kvtier.compat.sgl_kernel_hook"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage:" in out.stdout
