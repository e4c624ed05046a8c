"""gpurig.deploy.apply.wait_started against an engine whose restart policy restarts a container that failed at start: the
exit code reported is the failed run's, never the 0 a restart leaves in the engine's state."""

from __future__ import annotations

from types import SimpleNamespace

from gpurig.deploy.apply import wait_started


class Engine:
    """``waits``: what each wait returns in turn; ``states``: the container's inspect after each wait."""

    def __init__(self, waits, states) -> None:
        self.waits, self.states, self.seen = list(waits), list(states), 0

    def wait(self, name, timeout):
        return self.waits.pop(0)

    def container(self, name):
        raw = self.states[min(self.seen, len(self.states) - 1)]
        self.seen += 1
        return SimpleNamespace(raw={"Config": {}, **raw}, exit_code=raw["State"]["ExitCode"], running=raw["State"]["Running"])


JOB = SimpleNamespace(settle_s=2, health_s=10)
RESTARTED_RUNNING = {"RestartCount": 1, "State": {"ExitCode": 0, "Running": True, "Restarting": False}}
RESTARTING = {"RestartCount": 2, "State": {"ExitCode": 3, "Running": False, "Restarting": True}}


def test_a_zero_read_after_a_restart_is_not_the_exit_code_the_next_exit_is():
    engine = Engine([0, 3], [RESTARTED_RUNNING, RESTARTED_RUNNING, RESTARTING])
    assert wait_started(engine, "gpurig-slim", JOB)[1] == 3


def test_a_container_that_exits_zero_each_time_is_reported_as_exiting_zero():
    engine = Engine([0, 0], [RESTARTED_RUNNING])
    assert wait_started(engine, "gpurig-once", JOB)[1] == 0


def test_a_container_still_running_after_the_settle_time_started():
    running = {"RestartCount": 0, "State": {"ExitCode": 0, "Running": True}}
    assert wait_started(Engine([None], [running]), "gpurig-slim", JOB)[1] is None
