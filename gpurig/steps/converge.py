"""Bring one host to the wanted state: gather facts once, plan each step, apply in order.

Facts are gathered again only after a step changed something, so a host
already in shape costs one facts round trip and no changing command. A
failed step stops that host: the steps after it are reported ``skipped``
with the reason. Check mode plans every step and runs nothing that changes
the host.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from gpurig.connect.connection import Connection
from gpurig.errors import GpurigError
from gpurig.facts import Facts
from gpurig.facts import gather as gather_facts
from gpurig.inventory.profile import HostProfile
from gpurig.status import Status
from gpurig.steps.daemon import as_written, text_before
from gpurig.steps.hostfiles import unified_diff
from gpurig.steps.plan import Plan, Step, StepResult

ResultHandler = Callable[[StepResult], None]


def converge(
    conn: Connection,
    steps: Sequence[Step],
    wanted: HostProfile,
    *,
    check: bool = False,
    diff: bool = False,
    on_result: ResultHandler | None = None,
    gather: Callable[[Connection], Facts] = gather_facts,
) -> list[StepResult]:
    """One ``StepResult`` per step, in order; ``on_result`` hears each as it ends.

    ``diff`` keeps each file change's unified diff in the results (otherwise
    dropped, so a report never carries file content unasked).
    """
    facts = gather(conn)
    unknown: tuple[str, str] | None = _incomplete(facts, "")
    results: list[StepResult] = []
    originals: dict[str, str | None] = {}  # a file two steps write -> its text before the first
    stopped_by: StepResult | None = None
    for step in steps:
        started = time.monotonic()
        if stopped_by is not None:
            result = StepResult(step.name, Status.SKIPPED, f"not run: step {stopped_by.step} failed")
        elif unknown:
            result = StepResult(step.name, Status.FAILED, unknown[0], fix=unknown[1])
        else:
            before = facts
            result, changed = _run_step(step, facts, wanted, conn, check)
            result = _whole_file_diffs(result, before, originals)
            if check:
                for change in result.changes:
                    facts = as_written(facts, change.path, change.content)
            if changed:
                try:
                    facts = gather(conn)
                    unknown = _incomplete(facts, f" after step {step.name}")
                except GpurigError as err:
                    unknown = (f"facts could not be gathered again after step {step.name}: {err.problem}", err.fix)
        result = dataclasses.replace(result, duration_s=time.monotonic() - started)
        result = dataclasses.replace(result, changes=tuple(c.for_report(diff) for c in result.changes))
        if result.status == Status.FAILED and stopped_by is None:
            stopped_by = result
        results.append(result)
        if on_result:
            on_result(result)
    return results


def converge_rebooting(
    conn: Connection,
    steps: Sequence[Step],
    wanted: HostProfile,
    *,
    check: bool = False,
    diff: bool = False,
    gather: Callable[[Connection], Facts] = gather_facts,
) -> list[StepResult]:
    """``converge``; when its ``reboot`` step rebooted the host, once more over the other steps from what the host is now.

    The second pass's results stand for those steps (the driver it loaded,
    nouveau gone), followed by the reboot's own result.
    """
    results = converge(conn, steps, wanted, check=check, diff=diff, gather=gather)
    rebooted = [r for r in results if r.step == "reboot" and r.status == Status.CHANGED]
    if not rebooted or check:
        return results
    again = converge(conn, [s for s in steps if s.name != "reboot"], wanted, diff=diff, gather=gather)
    return again + rebooted


def _run_step(step: Step, facts: Facts, wanted: HostProfile, conn: Connection, check: bool) -> tuple[StepResult, bool]:
    """(result, whether the host changed)."""
    try:
        plan = step.plan(facts, wanted)
    except GpurigError as err:
        plan = Plan.fail(err.problem, err.fix)
    if plan.status != Status.CHANGED:
        return StepResult(step.name, plan.status, plan.reason, fix=plan.fix), False
    if check:
        return StepResult(step.name, Status.CHANGED, f"would change (check mode): {plan.reason}", plan.changes), False
    try:
        step.apply(conn, plan)
    except GpurigError as err:
        # No later step runs on this host, so there is nothing to gather facts again for.
        return StepResult(step.name, Status.FAILED, err.problem, plan.changes, fix=err.fix), False
    return StepResult(step.name, Status.CHANGED, plan.reason, plan.changes), True


def _whole_file_diffs(result: StepResult, facts: Facts, originals: dict[str, str | None]) -> StepResult:
    """A file an earlier step of this run wrote too gets its diff from the text before that step: one diff of the
    file as it was to the file as it will be, not one partial diff per step (``originals`` remembers the first text)."""
    changes = []
    for change in result.changes:
        path = change.path
        known, text = text_before(facts, path)
        if known and path and change.content is not None:
            if path in originals:
                change = dataclasses.replace(change, diff=unified_diff(path, originals[path], change.content))
            else:
                originals[path] = text
        changes.append(change)
    return dataclasses.replace(result, changes=tuple(changes))


def _incomplete(facts: Facts, when: str) -> tuple[str, str] | None:
    """(problem, fix) when no step may plan from these facts: a host that stopped answering mid-script."""
    if not facts.missing:
        return None
    return (f"facts incomplete{when} (no output for {', '.join(facts.missing)}: the host stopped answering?)",
            "check the host and run again")
