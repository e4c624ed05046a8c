"""The ``rollout`` task: move a fleet to a new image only as far as verify passes, canary first, then in batches.

Thin: check the flags (verify's level, --max-fail, --canary, --batch, the
variant) before anything is read from a host, then ``gpurig.flows.fleetrollout``
checks the target image and every host's containers before any connection,
runs the batches and shows where each host ended up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurig.cli.base import load_project_spec
from gpurig.cli.options import host_task, select_hosts
from gpurig.errors import ConfigError, did_you_mean
from gpurig.strict import validate

if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions

__all__ = ["rollout"]

HELP = {
    "variant": "the variant whose containers move (slim, ssh, jupyter, full): each host's gpurig_containers of it, or one of it",
    "to": "the image to move to: a tag of the spec's image (2.14.1-cu130-slim) or a whole reference, built on this machine",
    "canary": "how many hosts move first, alone, before any batch (default 1; 0: none)",
    "batch": "hosts per batch after the canary: a count (5) or a share of all the hosts (20%, the default)",
    "max_fail": "how many hosts may fail (rolled back) before the rollout stops and leaves the rest untouched (default 0)",
    "level": "verify's level on each host: quick (default) | full",
    "prune": "once every host runs the new image, remove the images they ran before (each unless a container still uses it)",
    "spec": "image spec file (default: the one in images/)",
}


@host_task(help=HELP, changes=True)
def rollout(c, opts: HostOptions, variant=None, to=None, canary=1, batch="20%", max_fail=0, level="quick", prune=False, spec=None):
    """Move hosts to a new image as far as verify passes: canary, then batches; a failed host is rolled back; resumable."""
    from gpurig.deploy.rollplan import check_max_fail, plan_batches
    from gpurig.flows.fleetrollout import roll_out
    from gpurig.verify.gate import make_plan

    if not variant or not to:
        raise ConfigError("rollout needs --variant and --to", "gpurig rollout -l GROUP --variant slim --to 2.14.1-cu130-slim")
    plan = make_plan(None, None, level)
    check_max_fail(int(max_fail))
    plan_batches([], int(canary), str(batch))  # --canary and --batch checked before anything is read
    image_spec = load_project_spec(c, spec)
    if variant not in image_spec.variants:  # before a host's containers or the state file's name are made of it
        raise ConfigError(f"--variant {validate.excerpt(str(variant))}: no such variant{did_you_mean(str(variant), image_spec.variants)}",
                          f"choose one of {', '.join(image_spec.variants)}")
    roll_out(opts, select_hosts(opts), image_spec, plan, variant=str(variant), to=str(to), canary=int(canary), batch=str(batch),
             max_fail=int(max_fail), prune=bool(prune))
