"""Stand-in for vLLM's `vllm.logger` (its import chain -- vllm.envs and the rest of vLLM -- is
not part of the reconstructed source). Only what the kv_offload modules call: init_logger() and
the *_once variants of a standard logging.Logger."""

import functools
import logging


class _VllmLogger(logging.LoggerAdapter):
    @functools.lru_cache(maxsize=None)
    def _once(self, level, msg, *args):
        self.log(level, msg, *args)

    def debug_once(self, msg, *args, **_):
        self._once(logging.DEBUG, msg, *args)

    def info_once(self, msg, *args, **_):
        self._once(logging.INFO, msg, *args)

    def warning_once(self, msg, *args, **_):
        self._once(logging.WARNING, msg, *args)


def init_logger(name: str) -> _VllmLogger:
    return _VllmLogger(logging.getLogger(name), {})
