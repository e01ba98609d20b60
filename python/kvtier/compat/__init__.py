"""Drop-in replacements for other libraries' KV transfer APIs (see sgl_kernel)."""
from . import sgl_kernel  # noqa: F401
