"""kvtier's import hook for every process of an SGLang server (kvtier.compat.sgl_kernel_hook).

This folder is put first on PYTHONPATH by ``python -m kvtier.compat.sgl_kernel_hook ...``; Python
imports this ``sitecustomize`` at start-up in each process, spawned ones included. It installs
the hook (sgl_kernel.kvcacheio -> kvtier), then runs the ``sitecustomize`` this one shadows (a
distribution's own, e.g. Debian's), if there is one.
"""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))

try:
    import kvtier.compat.sgl_kernel_hook as _hook

    _hook.install()
except ImportError as _e:  # kvtier not importable in this interpreter: say so, start anyway
    sys.stderr.write(f"kvtier sgl_kernel hook not installed: {_e}\n")

_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.origin and os.path.dirname(os.path.abspath(_spec.origin)) != _here:
    _shadowed = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_shadowed)
