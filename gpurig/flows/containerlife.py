"""Stopping and removing gpurig's containers, as ``gpurig stop`` and ``gpurig rm`` do and the dashboard's stop button does.

``lifecycle_work`` is what runs on a host: its engine lists the containers
deploy labelled (``io.gpurig.deploy.name``), picks the named ones (every one
when none is named) and acts on each; a container deploy did not make is
never listed, so never touched. The CLI runs it with its progress, report
and recap; ``stop_container`` runs it quietly on one host for a caller with
no terminal (the dashboard): one answer back, a host that could not be asked
raised as one ``HostError``, a name deploy never gave there as ``NoSuchContainer``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpurig.errors import GpurigError, HostError
from gpurig.flows.fleettask import make_connector, select_hosts
from gpurig.status import Status

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.connect.engineinfo import ContainerInfo
    from gpurig.flows.fleettask import HostOptions
    from gpurig.results import Outcome

STOP_TIMEOUT = 30  # seconds between the stop signal and KILL, as `gpurig stop`
RUNNING = ("running", "paused", "restarting")


class NoSuchContainer(GpurigError):
    """A container name that no container deploy made on that host carries (or a host not among the selected ones)."""


def stop_act(engine: Any, ci: ContainerInfo) -> None:
    engine.stop(ci.name, timeout=STOP_TIMEOUT)


def stop_done_already(ci: ContainerInfo) -> str:
    """Why a container needs no stop (``already stopped``); empty when it runs."""
    return "" if ci.status in RUNNING else "already stopped" if ci.status == "exited" else f"not running ({ci.status})"


def remove_act(engine: Any, ci: ContainerInfo) -> None:
    engine.remove(ci.name)


def lifecycle_work(names: Sequence[str], act: Callable[[Any, ContainerInfo], None], done_already: Callable[[ContainerInfo], str] = lambda ci: "",
                   check: bool = False) -> Callable[[Connection], Outcome]:
    """``act(engine, ci)`` on the named gpurig containers of a host (all of them when none is named); ``done_already(ci)`` says
    why one needs nothing: it is listed, and the host stays ``ok`` unless another changed. A name not found fails the host;
    the Outcome's data is the names acted on (with ``check``, those it would act on)."""
    from gpurig.connect.engineopen import open_engine
    from gpurig.deploy.compare import NAME_LABEL
    from gpurig.results import Outcome

    def work(conn: Connection) -> Outcome:
        done, untouched = [], []
        with open_engine(conn) as engine:
            mine = engine.containers(label=NAME_LABEL)
            picked = [ci for ci in mine if not names or ci.name in names]
            missing = sorted(set(names) - {ci.name for ci in mine})
            for ci in picked:
                if done_already(ci):
                    untouched.append(f"{ci.name}: {done_already(ci)}")
                    continue
                if not check:
                    act(engine, ci)
                done.append(ci.name)
        said = "; ".join(untouched)
        if missing:
            said = "; ".join(w for w in (f"no gpurig container named {', '.join(missing)} here", said) if w)
            return Outcome(status=Status.FAILED, data=tuple(done), detail=said)
        return Outcome(status=Status.CHANGED if done else Status.OK, data=tuple(done), detail=said)

    return work


@dataclass(frozen=True)
class Stopped:
    """What ``stop_container`` did: on which host, which container, whether it stopped it (False: it was not running), and why."""

    host: str
    name: str
    changed: bool
    detail: str


def stop_container(opts: HostOptions, host: str, name: str) -> Stopped:
    """Stop gpurig container ``name`` on ``host`` as ``gpurig stop -l HOST --name NAME`` does, quietly: NoSuchContainer when deploy
    made none of that name there (a container it did not make is never stopped) or the host is not selected, HostError when the
    host could not be asked."""
    from gpurig.connect.fleet import run_fleet
    from gpurig.strict.validate import container_name_problem, excerpt

    rule = container_name_problem(name)
    if rule:
        raise NoSuchContainer(f"container {excerpt(name)} {rule}", "name containers as `gpurig status` shows them", host=host)
    chosen = [h for h in select_hosts(opts) if h.name == host]
    if not chosen:
        raise NoSuchContainer(f"host {excerpt(host)} is not among the selected hosts", "select it with -l", host=host)
    connector = make_connector(opts)
    try:
        report = run_fleet(chosen, lifecycle_work([name], stop_act, stop_done_already, opts.check), connector=connector, forks=1, label="stop")
    finally:
        connector.close()
    [result] = report.results
    if result.status == Status.FAILED and not result.data and "no gpurig container named" in result.reason:
        raise NoSuchContainer(f"no container named {name} that gpurig deployed on {host}",
                              "only containers deploy made (its io.gpurig.deploy labels) are stopped from gpurig", host=host)
    if result.status not in (Status.OK, Status.CHANGED):
        raise HostError(f"{result.status}: {result.reason or 'no reason given'}", result.fix, host=result.host)
    changed = result.status == Status.CHANGED
    return Stopped(host, name, changed, "stopped" if changed else result.reason or "not running")
