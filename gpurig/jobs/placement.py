"""Where a run's job runs, resolved on this machine before a host is contacted: deploy's container for a variant, an image, or a deployed container.

``--variant V`` takes the host's ``gpurig_containers`` entry of that variant
when it has one (its env, /dev/shm, ulimits, datasets, cpus, memory), else
the variant's defaults, with the project's image of the spec's default
matrix entry, which must be built here (or be in the spec's registry), as
deploy requires. ``--image REF`` runs that image with deploy's defaults;
``--container NAME`` runs in a deployed container, whatever its image.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpurig.deploy.imagesource import local_engine_if_any, send_from
from gpurig.errors import ConfigError, InventoryError
from gpurig.strict import validate

if TYPE_CHECKING:
    from gpurig.connect.engine import Engine
    from gpurig.deploy.containers import ContainerSpec
    from gpurig.image.spec import ImageSpec
    from gpurig.inventory import Host
    from gpurig.jobs import request as jobspec
    from gpurig.jobs.submit import JobTarget
    from gpurig.jobs.tree import Tree


def resolve_target(host: Host, request: jobspec.RunRequest, job: str, key: str, tree: Tree, *, check: bool,
                   load_spec: Callable[[], ImageSpec], source: str | Path) -> JobTarget:
    """The job's target on ``host``; ``load_spec`` gives the project's image spec, read only for ``--variant``."""
    from gpurig.deploy.containers import ContainerSpec
    from gpurig.image import compat
    from gpurig.jobs import request as jobspec
    from gpurig.jobs.submit import JobTarget

    base = JobTarget(request=request, job=job, key=key, tree=tree, check=check)
    if request.container:
        problem = validate.container_name_problem(request.container)
        if problem:
            raise ConfigError(f"--container {validate.excerpt(request.container)} {problem}", "name it as `gpurig status` shows it")
        return base
    local = local_engine_if_any()
    if request.image:
        problem = validate.image_ref_problem(request.image)
        if problem:
            raise ConfigError(f"--image {validate.excerpt(request.image)} {problem}", "give a reference such as pytorch:2.14.1-cu130-slim")
        image = local.image(request.image) if local else None
        template = jobspec.job_container(ContainerSpec(host=host.name, name="", variant="", image=request.image, entry=None), job, request)
        cuda = (image.labels.get("io.gpurig.cuda", "") if image else "") != compat.CPU
        return dataclasses.replace(base, container=template, image_ref=request.image, image=image, uid=_uid(image.user if image else ""),
                         cuda=cuda, deliver=_deliver(local, None), fan_out=_fan_out(request.image, image, local, None, source))
    image_spec = load_spec()
    template = container_for(host, image_spec, request.variant or "slim", source)
    image = local.image(template.image) if local else None
    if image is None and template.entry is not None and not image_spec.registry:
        raise ConfigError(f"the image {template.image} is not built on this machine",
                          f"build it first: invoke build --variant {template.variant} --torch {template.entry.torch} --cuda {template.entry.cuda}")
    cuda = template.entry is not None and not template.entry.is_cpu
    return dataclasses.replace(base, container=jobspec.job_container(template, job, request), image_ref=template.image, image=image,
                     uid=image_spec.user.uid, cuda=cuda, matrix_cudas=tuple(e.cuda for e in image_spec.matrix),
                     deliver=_deliver(local, image_spec.registry or None),
                     fan_out=_fan_out(template.image, image, local, image_spec.registry or None, source))


def container_for(host: Host, image_spec: ImageSpec, variant: str, source: str | Path) -> ContainerSpec:
    """The host's gpurig_containers entry of ``variant`` when it has one, else that variant's defaults (gpurig_shm_size still holds)."""
    from gpurig.deploy.containers import load_containers

    if "gpurig_containers" in host.vars:
        specs, _ = load_containers(host, image_spec, variant=variant, source=source) if _has_variant(host, variant) else ([], [])
        if specs:
            return specs[0]
        host = dataclasses.replace(host, vars={k: v for k, v in host.vars.items() if k != "gpurig_containers"})
    try:
        specs, _ = load_containers(host, image_spec, variant=variant, source=source)
    except InventoryError as err:
        raise ConfigError(err.problem, err.fix) from None
    return specs[0]


def _has_variant(host: Host, variant: str) -> bool:
    entries = host.vars.get("gpurig_containers")
    return isinstance(entries, list) and any(isinstance(e, dict) and e.get("variant") == variant for e in entries)


def _uid(user: str) -> int | None:
    name = user.split(":")[0]
    return int(name) if name.isdecimal() and int(name) != 0 else None


def _deliver(local: Engine | None, registry: str | None):
    """deploy's delivery, from this machine's engine (where the image was built)."""
    return lambda engine, conn, ref: send_from(local, engine, conn, ref, registry)


def _fan_out(ref: str, image, local: Engine | None, registry: str | None, source: str | Path):
    """For a job over several nodes (Slurm's): nodes -> deploy's fan-out of the image among them, with the deliver it replaces."""
    from gpurig.deploy.fanoutwire import job_fanout

    return lambda nodes: job_fanout(nodes, ref, image, source, registry=registry, local=local, plain=_deliver(local, registry))
