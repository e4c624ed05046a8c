"""Benchmark: image delivery to a host over SSH, the forward path (only missing layers) against docker save | docker load.

Run as root, with Docker and Debian's docker-registry installed:

    python bench/bench_deploy.py [--runs 3] [--cuda cpu|13.0]

The host is the deploy tests' one (tests/integration/deploy): a Debian 12
container booting systemd, given Docker by `gpurig provision`, reached by
gpurig over real SSH on 127.0.0.1; its engine stores images on a volume.
The images are built by `gpurig build` from the image tests' spec (CPU
torch from the local wheelhouse by default). Three scenarios, each with
both methods, runs interleaved (forward, save-load, forward, ...):

- first deploy of slim onto a host with no image;
- redeploy of slim after a one-file edit of checks/ (the host has the old slim);
- jupyter onto a host that has slim.

"bytes" are those that crossed the SSH connection (both ways, for the
forward: every byte pumped through the port forward); "wall" is deliver()'s
own time, from asking the host what it has to the image tagged there, the
push into the local registry included. The local registry's storage
persists between deliveries as ~/.cache/gpurig/registry does for a user;
the very first push into an empty one (every layer compressed) is shown
on its own line. Everything made is removed at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import sys
import tempfile
import types
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "integration")]

from gpurig.connect.connector import Connector  # noqa: E402
from gpurig.connect.engineopen import local_engine, open_engine  # noqa: E402
from gpurig.connect.ssh import SSHSettings  # noqa: E402
from gpurig.deploy.delivery import deliver  # noqa: E402
from gpurig.inventory import load_inventory  # noqa: E402

MB = 1e6


def load_root_conftest():
    """tests/integration/conftest.py's Docker, ContainerHost and banner check (a conftest cannot be imported by name)."""
    spec = importlib.util.spec_from_file_location("gpurig_bench_root_conftest", REPO / "tests" / "integration" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def bench_kit():
    """(the tests' Docker, their container_kit) as one session that is its own run (no xdist workers to share host images with)."""
    from gpurig.image.dockercli import find_client

    root = load_root_conftest()
    session = "bench" + uuid.uuid4().hex[:7]
    kit = types.SimpleNamespace(session=session, run=session, run_label=root.RUN_LABEL, label=root.TEST_LABEL, login=root.LOGIN,
                                mirror=root.MIRROR, host=root.ContainerHost, banner=root._banner)
    return root.Docker(find_client().path, local_engine()), kit


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Bench:
    def __init__(self, work: Path, cuda: str) -> None:
        from deploy.cpuimages import CpuImages, images_kit, make_project
        from systemd_kit import SystemdHosts, SystemdImages, authorized_keys

        self.docker, self.kit = bench_kit()
        self.work = work
        self.cuda = cuda
        key = work / "id_ed25519"
        import subprocess

        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        self.images = SystemdImages(self.docker, self.kit)
        self.hosts = SystemdHosts(self.docker, self.kit, self.images, authorized_keys(work / "keys", self.kit.login, key), key)
        self.images_kit, self.make_project, self.CpuImages = images_kit, make_project, CpuImages
        self.built = None
        self.cache = work / "registry"

    def setup(self) -> dict[str, str]:
        from deploy.gpuhost import prepare_host

        say("host: a fresh Debian 12 systemd host, `gpurig provision --only docker,daemon` ...")
        self.host = self.hosts.make("debian12", storage="volume")
        prepare_host(self.host, self.work)
        wheels = self.images_kit.wheel_dir()
        if not wheels:
            sys.exit(f"no torch-{self.images_kit.CPU_TORCH}+cpu wheel in pip's find-links")
        base = self.images.base("debian12")
        spec = f"gpurig-bench-{self.kit.session[-7:]}"
        project = self.make_project(self.work / "project", spec, base, wheels)
        self.built = self.CpuImages(project, spec, f"{self.kit.label}={self.kit.session}", base=base, wheels=wheels)
        refs = {}
        for variant in ("slim", "jupyter"):
            say(f"image: gpurig build --variant {variant} --cuda {self.cuda} ...")
            refs[variant] = self.built.build(project, variant, self.cuda)
        edited = self.built.copy_project(self.work / "project-edited", f"{spec}-edit")
        probe = edited / "checks" / "verify_torch.py"
        probe.write_text(probe.read_text() + "\n# a one-line edit\n")
        say("image: slim again with one file of checks/ edited ...")
        refs["slim-edited"] = self.built.build(edited, "slim", self.cuda)
        from systemd_kit import inventory_for

        inventory = inventory_for(self.work / "inventory" / "hosts.yaml", self.host)
        host = next(iter(load_inventory(inventory).hosts.values()))
        self.connector = Connector(SSHSettings(project_known_hosts=self.work / "known_hosts", user_known_hosts=None,
                                               ssh_config=None, allow_agent=False, look_for_keys=False))
        self.conn = self.connector.open(host)
        self.local = local_engine()
        self.remote = open_engine(self.conn)
        return refs

    def bare(self) -> None:
        """Only the few-MB probe image left on the host."""
        probe = self.host.sh("docker image inspect -f '{{.Id}}' gpurig-test-probe:1").stdout.strip()
        ids = set(self.host.sh("docker images -aq --no-trunc").stdout.split()) - {probe}
        if ids:
            self.host.sh("docker rmi -f " + " ".join(sorted(ids)), check=False)

    def deliver(self, ref: str, method: str):
        return deliver(self.local, self.remote, self.conn, ref, methods=("present", method), cache_dir=self.cache)

    def close(self) -> None:
        for closing in ("remote", "local", "conn", "connector"):
            if hasattr(self, closing):
                getattr(self, closing).close()
        self.hosts.remove()
        if self.built is not None:
            for ref in self.built.built:
                self.docker("image", "rm", ref, check=False)
        self.images.remove()


def human(size: float) -> str:
    return f"{size / MB:.1f} MB" if size >= MB else f"{size / 1e3:.1f} kB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cuda", default="cpu", help="cpu (default) or the CUDA of the test spec's CUDA entry (13.0; ~6 GB images)")
    args = parser.parse_args()
    if shutil.which("docker-registry") is None:
        sys.exit("docker-registry is not installed (apt-get install docker-registry)")
    work = Path(tempfile.mkdtemp(prefix="gpurig-bench-deploy-"))
    bench = Bench(work, args.cuda)
    try:
        refs = bench.setup()
        sizes = {name: bench.local.image(ref).size for name, ref in refs.items()}
        scenarios = {
            "first deploy of slim": (lambda: bench.bare(), refs["slim"], sizes["slim"]),
            "slim after a checks/ edit": (lambda: (bench.bare(), bench.deliver(refs["slim"], "forward")), refs["slim-edited"], sizes["slim-edited"]),
            "jupyter onto a host with slim": (lambda: (bench.bare(), bench.deliver(refs["slim"], "forward")), refs["jupyter"], sizes["jupyter"]),
        }
        bench.bare()
        say("forward into an empty local registry (first push ever: every layer compressed) ...")
        cold = bench.deliver(refs["slim"], "forward")  # also fills the local registry the timed runs use
        results: dict[tuple[str, str], list] = {}
        for run in range(args.runs):
            for name, (prepare, ref, _) in scenarios.items():
                for method in ("forward", "save-load"):
                    prepare()
                    done = bench.deliver(ref, method)
                    assert done.method == method, done
                    results.setdefault((name, method), []).append(done)
                    say(f"run {run + 1}: {name:30s} {method:9s} {human(done.bytes_moved):>10s} {done.seconds:6.1f} s")
        print()
        kind = "CPU" if args.cuda == "cpu" else f"CUDA {args.cuda}"
        print(f"Delivery to one host over SSH ({kind} images: slim {sizes['slim'] / MB:.0f} MB, jupyter {sizes['jupyter'] / MB:.0f} MB), "
              f"median of {args.runs}:")
        print(f"  {'scenario':30s} {'method':9s} {'moved':>10s} {'% image':>8s} {'wall s':>7s}")
        for name, (_, _, size) in scenarios.items():
            med = {}
            for method in ("forward", "save-load"):
                runs = results[(name, method)]
                moved = statistics.median(d.bytes_moved for d in runs)
                wall = statistics.median(d.seconds for d in runs)
                med[method] = (moved, wall)
                print(f"  {name:30s} {method:9s} {human(moved):>10s} {100 * moved / size:7.3f}% {wall:7.1f}")
            (fb, fw), (sb, sw) = med["forward"], med["save-load"]
            print(f"  {'':30s} forward/save-load: bytes {fb / sb:.2g}x, wall {fw / sw:.2f}x")
        print(f"  first push into an empty local registry (slim, forward): {human(cold.bytes_moved)} moved, {cold.seconds:.1f} s")
        edit = statistics.median(d.bytes_moved for d in results[("slim after a checks/ edit", "forward")]) / sizes["slim-edited"]
        jup = statistics.median(d.bytes_moved for d in results[("jupyter onto a host with slim", "forward")]) / sizes["jupyter"]
        print(f"  targets: checks/ edit < 1% of the image: {'met' if edit < 0.01 else 'MISSED'} ({100 * edit:.3f}%); "
              f"jupyter after slim < 5%: {'met' if jup < 0.05 else 'MISSED'} ({100 * jup:.2f}%)")
    finally:
        bench.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
