"""Submitting through slurmrestd (``gpurig_slurm.rest``): the login user's JWT from ``scontrol token``, HTTP over the SSH connection.

slurmrestd listens on the controller's loopback only (gpurig.slurm.conf.
rest_dropin); gpurig reaches it through a direct-tcpip channel of the SSH
connection it already holds, so nothing listens on the network and the token
(made on the controller for the login user, five minutes long) travels in a
request header inside SSH: never a command line, a file, a log or a report.
slurmrestd does not read a script's ``#SBATCH`` lines, so the job's options
go in the request, in the shape of the controller's API version (22.05's
v0.0.38 takes ``nodes`` as [min, max] and ``gres``, an environment mapping;
23.11 and later take ``tres_per_node``, an environment list and
``{set, number}`` numbers).
"""

from __future__ import annotations

import http.client
import json
import re
from typing import Any

from gpurig.connect.connection import ChannelError, Connection
from gpurig.errors import HostError
from gpurig.slurm.conf import REST_PORT, rest_api

JOB_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # the batch script's PATH: srun, scontrol, docker
TOKEN_LIFESPAN_S = 300


class RestError(HostError):
    """slurmrestd refused a request, or could not be reached through the SSH connection."""


def controller_release(conn: Connection) -> tuple[int, int]:
    """The controller's Slurm release, as ``scontrol --version`` says it (``slurm 22.05.8`` -> (22, 5))."""
    said = conn.run(["scontrol", "--version"], timeout=30, warn=True).stdout
    found = re.search(r"(\d+)\.(\d+)", said)
    if not found:
        raise RestError(f"scontrol --version said {said.strip()[:60]!r}, which names no Slurm release", "check Slurm on the controller",
                        host=conn.name)
    return int(found.group(1)), int(found.group(2))


def user_token(conn: Connection) -> str:
    """A token for the login user, made by slurmctld (``scontrol token``): in memory only."""
    said = conn.run(["scontrol", "token", f"lifespan={TOKEN_LIFESPAN_S}"], timeout=30, warn=True)
    found = re.search(r"SLURM_JWT=(\S+)", said.stdout)
    if said.failed or not found:
        raise RestError("slurmctld gave no token (scontrol token)", "provision the cluster with gpurig_slurm.rest: true (its JWT key)", host=conn.name)
    return found.group(1)


class RestClient:
    def __init__(self, conn: Connection, user: str, token: str, api: str) -> None:
        self.conn, self.user, self.token, self.api = conn, user, token, api

    @classmethod
    def for_login(cls, conn: Connection) -> RestClient:
        return cls(conn, conn.user or "root", user_token(conn), rest_api(controller_release(conn)))

    def request(self, method: str, path: str, body: dict | None = None) -> dict[str, Any]:
        try:
            session = self.conn.http("127.0.0.1", REST_PORT)
            session.connect()
        except ChannelError as err:  # not an SSH connection, or the host's sshd found nothing listening
            raise RestError(f"cannot reach slurmrestd on the controller's 127.0.0.1:{REST_PORT}: {err.problem}",
                            "is it running? `systemctl status slurmrestd` (gpurig provision starts it with gpurig_slurm.rest: true)",
                            host=self.conn.name) from None
        try:
            headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self.token, "Content-Type": "application/json"}
            session.request(method, f"/slurm/{self.api}{path}", body=json.dumps(body) if body is not None else None, headers=headers)
            response = session.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as err:
            raise RestError(f"slurmrestd's answer broke off: {err}", "see `journalctl -u slurmrestd` on the controller", host=self.conn.name) from None
        finally:
            session.close()
        try:
            doc = json.loads(raw or b"{}")
        except ValueError:
            doc = {}
        errors = [e for e in doc.get("errors") or () if isinstance(e, dict) and (e.get("error") or e.get("description"))]
        if response.status >= 300 or errors:
            said = "; ".join(str(e.get("error") or e.get("description")) for e in errors) or raw.decode(errors="replace").strip()[:200]
            raise RestError(f"slurmrestd refused {method} {path} ({response.status}): {said}", "see what it says; `sinfo` on the controller",
                            host=self.conn.name)
        return doc

    def submit(self, script: str, *, name: str, workdir: str, output: str, nodes: int, gpus_per_node: int, partition: str | None,
               comment: str, minutes: int | None) -> str:
        """The job's id, its options as the controller's API version spells them."""
        old = self.api == "v0.0.38" or self.api == "v0.0.39"
        job: dict[str, Any] = {"name": name, "current_working_directory": workdir, "standard_output": output, "comment": comment,
                               "tasks_per_node": 1, "tasks": nodes,  # one task a node: with the count, N nodes on every version
                               "environment": {"PATH": JOB_PATH} if old else [f"PATH={JOB_PATH}"],
                               "nodes": [nodes, nodes] if old else str(nodes)}
        if gpus_per_node:
            job.update({"gres": f"gpu:{gpus_per_node}"} if old else {"tres_per_node": f"gres/gpu:{gpus_per_node}"})
        if partition:
            job["partition"] = partition
        if minutes:
            job["time_limit"] = minutes if old else {"set": True, "number": minutes}
        said = self.request("POST", "/job/submit", {"job": job, "script": script})
        ident = said.get("job_id")
        if not isinstance(ident, int):
            raise RestError(f"slurmrestd named no job id ({json.dumps(said)[:160]})", "see `squeue` on the controller", host=self.conn.name)
        return str(ident)
