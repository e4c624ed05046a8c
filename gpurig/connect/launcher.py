"""Running a standalone Python file on a host from the command line itself: compressed, base64'd, handed to python3.

The probes and the monitor's agent (checks/*.py) travel this way, so a host
needs nothing but python3: no copy step, no file left behind, no stdin used
(``docker exec`` and sudo keep it free). The script runs as ``__main__``
(with no ``__file__``) and sees ``args`` as ``sys.argv[1:]``.
"""

from __future__ import annotations

import base64
import shlex
import zlib
from collections.abc import Sequence


def embedded(source: str, name: str, args: Sequence[str] = (), python: str = "python3") -> list[str]:
    """argv that runs ``source`` (shown in tracebacks as ``name``) with ``args``; only base64 and repr'd text in the code."""
    packed = base64.b64encode(zlib.compress(source.encode(), 9)).decode()
    boot = f"import base64,zlib;exec(compile(zlib.decompress(base64.b64decode('{packed}')),{name!r},'exec'))"
    return [python, "-c", boot, *args]


def embedded_line(source: str, name: str, args: Sequence[str] = (), python: str = "python3") -> str:
    """``embedded`` as one shell line, every word quoted."""
    return shlex.join(embedded(source, name, args, python))
