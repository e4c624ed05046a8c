"""The loopback sshd fixtures of tests/integration/hosts/conftest.py, for other folders' conftests.

Loaded from that file once per session (not copied): every folder that
borrows them gets the same module, so the session-scoped farm is one farm.
(tests/integration is on sys.path under pytest's default import mode.)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_NAME = "gpurig_tests_hosts_conftest"


def hosts_conftest() -> ModuleType:
    if _NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_NAME, Path(__file__).resolve().parent / "hosts" / "conftest.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[_NAME]
