import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # kv_reference

# Under CI=true a test skipped because a required dependency is missing FAILS: CI installs
# deps/debian-packages.txt, and a skip there would hide an untested path behind a green run
# (tests/tools/missing_dep.py and tests/support/missing_dependency.h are the same rule for the
# other tests). Required: what deps/debian-packages.txt installs for /usr/bin/python3, and the
# kvtier binary ctest passes in KVTIER_CLI. Not required: a GPU, CUDA, a second GPU, and
# transformers (not a Debian 12 package; the GPU machine has it).
REQUIRED_MODULES = ("numpy", "torch", "zmq", "msgpack", "prometheus_client")
_IMPORT_SKIP = re.compile(r"could not import '([\w.]+)'")


def _ci():
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def _missing_required(reason):
    """The missing required dependency `reason` (a skip's reason) names, or None."""
    m = _IMPORT_SKIP.search(reason)
    if m and m.group(1).split(".")[0] in REQUIRED_MODULES:
        return m.group(1)
    if "KVTIER_CLI" in reason and "not set" in reason:
        return "KVTIER_CLI"
    return None


def _fail_if_required_missing(report):
    if not (_ci() and report.skipped and isinstance(report.longrepr, tuple)):
        return
    reason = str(report.longrepr[2])
    what = _missing_required(reason)
    if what is not None:
        report.outcome = "failed"
        report.longrepr = ("%s (CI=true: the required dependency %s must be present; see "
                           "deps/debian-packages.txt)" % (reason, what))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_if_required_missing(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_if_required_missing(outcome.get_result())
