"""Where a suite run's time went: reads the lines GPURIGTEST_TIMELINE=FILE made the run write (tests/conftest.py).

    GPURIGTEST_TIMELINE=/tmp/t.jsonl python3 -m pytest tests -n 3 --dist loadfile ...
    python3 tests/tools/timeline.py /tmp/t.jsonl

Prints, per worker, when it started and finished and how long it was busy, then the modules by their time
(setup, call and teardown together) with the worker that ran them and when they started.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str, top: int = 40) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if not rows:
        sys.exit(f"{path} holds no report: was the run started with GPURIGTEST_TIMELINE={path}?")
    t0 = min(r["start"] for r in rows)
    workers: dict[str, list[float]] = defaultdict(lambda: [float("inf"), 0.0, 0.0])
    modules: dict[str, list] = {}
    for r in rows:
        span = workers[r["worker"]]
        span[0], span[1] = min(span[0], r["start"]), max(span[1], r["stop"])
        span[2] += r["stop"] - r["start"]
        module = r["test"].split("::")[0]
        entry = modules.setdefault(module, [r["worker"], r["start"], 0.0])
        entry[1] = min(entry[1], r["start"])
        entry[2] += r["stop"] - r["start"]
    print(f"{'worker':8} {'first':>7} {'last':>7} {'busy':>7}")
    for name, (first, last, busy) in sorted(workers.items()):
        print(f"{name:8} {first - t0:7.0f} {last - t0:7.0f} {busy:7.0f}")
    print(f"\n{'module':60} {'worker':6} {'start':>6} {'secs':>6}")
    for module, (worker, start, secs) in sorted(modules.items(), key=lambda m: -m[1][2])[:top]:
        print(f"{module[-60:]:60} {worker:6} {start - t0:6.0f} {secs:6.0f}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
