"""Make SGLang's ``sgl_kernel.kvcacheio`` calls run on kvtier, with SGLang unmodified.

SGLang's host pools (``sglang/srt/mem_cache/memory_pool_host.py``) do
``from sgl_kernel.kvcacheio import transfer_kv_per_layer, ...``. With this hook installed that
module is kvtier's drop-in (``kvtier.compat.sgl_kernel``: same names, arguments and meaning);
the rest of ``sgl_kernel`` stays the real one. Where ``sgl_kernel`` is not installed at all, the
hook provides a ``sgl_kernel`` package holding only ``kvcacheio``.

One line, for every process SGLang starts (its scheduler processes are spawned, so the hook
travels in the environment, as a ``sitecustomize`` on PYTHONPATH, not in the parent's memory)::

    python -m kvtier.compat.sgl_kernel_hook -m sglang.launch_server --model-path ... \\
        --enable-hierarchical-cache --hicache-io-backend kernel

which is the same as::

    PYTHONPATH=$(python -m kvtier.compat.sgl_kernel_hook --site-dir)${PYTHONPATH:+:$PYTHONPATH} \\
        python -m sglang.launch_server ...

In one process (a test, a notebook), before SGLang's memory_pool_host is imported::

    import kvtier.compat.sgl_kernel_hook as hook; hook.install()

Thread safety: install() / uninstall() change the interpreter's import system; call them before
other threads import SGLang.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

ALIASED = "sgl_kernel.kvcacheio"
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sgl_kernel_site")


class _KvcacheioFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers `sgl_kernel.kvcacheio` with kvtier's drop-in, and `sgl_kernel` itself only where
    no real sgl_kernel is installed."""

    def find_spec(self, name, path, target=None):
        if name == ALIASED:
            return importlib.machinery.ModuleSpec(name, self)
        if name == "sgl_kernel" and self._real_sgl_kernel_absent():
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    @staticmethod
    def _real_sgl_kernel_absent() -> bool:
        for finder in sys.meta_path:
            if isinstance(finder, _KvcacheioFinder) or not hasattr(finder, "find_spec"):
                continue
            try:
                if finder.find_spec("sgl_kernel", None) is not None:
                    return False
            except Exception:  # a finder that cannot answer for this name
                continue
        return True

    def create_module(self, spec):
        if spec.name == ALIASED:
            from . import sgl_kernel as drop_in

            module = types.ModuleType(ALIASED, drop_in.__doc__)
            for name in drop_in.__all__:
                setattr(module, name, getattr(drop_in, name))
            module.__all__ = list(drop_in.__all__)
            module.__kvtier__ = True
            return module
        module = types.ModuleType("sgl_kernel", "kvtier's sgl_kernel: only kvcacheio (kvtier); "
                                  "the real sgl_kernel is not installed")
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def installed() -> bool:
    return any(isinstance(f, _KvcacheioFinder) for f in sys.meta_path)


def install() -> None:
    """Routes later imports of sgl_kernel.kvcacheio to kvtier (idempotent). An already imported
    sgl_kernel.kvcacheio is replaced too, for modules that import it from now on."""
    if not installed():
        sys.meta_path.insert(0, _KvcacheioFinder())
    existing = sys.modules.get(ALIASED)
    if existing is not None and not getattr(existing, "__kvtier__", False):
        del sys.modules[ALIASED]


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _KvcacheioFinder)]
    existing = sys.modules.get(ALIASED)
    if existing is not None and getattr(existing, "__kvtier__", False):
        del sys.modules[ALIASED]


def site_dir_environment(env=None) -> dict:
    """`env` (default os.environ) with the hook's sitecustomize first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR] + parts)
    return env


def main(argv) -> int:
    usage = ("usage: python -m kvtier.compat.sgl_kernel_hook (--site-dir | -m MODULE [ARGS...] | "
             "SCRIPT [ARGS...])")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage + "\n\n" + __doc__)
        return 0 if argv else 2
    if argv[0] == "--site-dir":
        print(SITE_DIR)
        return 0
    env = site_dir_environment()
    os.execve(sys.executable, [sys.executable] + list(argv), env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
