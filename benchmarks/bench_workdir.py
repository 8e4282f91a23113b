"""``fiberlite run`` with the working directory sent along, against a run whose code is
in the image: the time from the command to the first result.

The cluster is the test suite's Kubernetes API server double (``tests/k8s_double``)
with its Docker runner: every pod is a Docker container of the image, started through
the API as on a node (``docs/kubernetes/double.md`` says what that leaves out: no
image pulls, one node, every pod on loopback). The project is a ``job.py`` whose
``Pool(2)`` maps a function of its package ``mylib`` that reads ``data/factor.txt``,
next to a file of random bytes (which does not compress) that makes the tree 1 MiB or
20 MiB. Each sample runs ``fiberlite run`` as a new process and times until the line
the master prints with the pool's first result reaches the command's output.

Rows:

- ``code in the image`` (**reference**): the same project copied into an image built
  ``FROM`` the fiberlite image (``COPY . /app``), run with ``--no-working-dir``;
- ``1 MiB tree`` / ``20 MiB tree``: the fiberlite image only; ``fiberlite run`` packs
  the project, sends it to the master pod in ConfigMaps and the master sends it to its
  two worker pods over the run's connections.

Rows take turns, after one untimed round (none with ``--quick``). Run:
``python benchmarks/bench_workdir.py [--image IMAGE] [--quick] [--json PATH]``
(IMAGE: ``FIBERLITE_IMAGE``, else ``fiberlite:test``; ``.ci/docker_setup.sh`` builds it).
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from _common import Report, finish, from_samples, interleave, parser, progress, sized  # noqa: E402

REFERENCE = "code in the image"
RUN_TIMEOUT = 300.0

JOB = textwrap.dedent("""
    import fiberlite as mp
    import mylib

    if __name__ == "__main__":
        with mp.Pool(2) as pool:
            for value in pool.imap(mylib.work, range(4)):
                print("first result", value, flush=True)
                break
""")
MYLIB = textwrap.dedent("""
    def work(x):
        with open("data/factor.txt") as fh:
            return x * int(fh.read())
""")


def make_project(folder: Path, size: int) -> Path:
    """The project: job.py, mylib/, data/factor.txt and random bytes up to ``size``."""
    folder.mkdir(parents=True)
    (folder / "job.py").write_text(JOB)
    (folder / "mylib").mkdir()
    (folder / "mylib" / "__init__.py").write_text(MYLIB)
    (folder / "data").mkdir()
    (folder / "data" / "factor.txt").write_text("3\n")
    used = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    (folder / "data" / "blob.bin").write_bytes(os.urandom(max(0, size - used)))
    return folder


def bake(project: Path, base: str) -> str:
    """An image ``FROM base`` with the project in /app (its working directory)."""
    tag = f"fiberlite-bench-workdir:{secrets.token_hex(4)}"
    (project / "Dockerfile").write_text(f"FROM {base}\nCOPY . /app\n")
    try:
        subprocess.run(["docker", "build", "-q", "-t", tag, str(project)], check=True,
                       capture_output=True, timeout=RUN_TIMEOUT)
    finally:
        (project / "Dockerfile").unlink()
    return tag


class Cluster:
    """The API server double whose pods are Docker containers."""

    def __init__(self, folder: Path) -> None:
        from k8s_double.docker_runner import DockerRunner
        from k8s_double.fixture import write_kubeconfig
        from k8s_double.server import ApiServerDouble
        token = secrets.token_hex(16)
        self.kubeconfig = folder / "kubeconfig"
        self.kubeconfig.touch()
        self.server = ApiServerDouble(token=token, runner=DockerRunner(
            mounts={str(self.kubeconfig): str(self.kubeconfig)}))
        write_kubeconfig(self.kubeconfig, self.server.host, token)

    def run(self, project: Path, image: str, *options: str) -> float:
        """Seconds from starting ``fiberlite run`` to the master's first result."""
        command = [os.path.join(os.path.dirname(sys.executable), "fiberlite"), "run",
                   "--backend", "kubernetes", "--kubeconfig", str(self.kubeconfig),
                   "--namespace", "default", "--image", image,
                   "--env", f"FIBERLITE_KUBECONFIG={self.kubeconfig}", *options, "job.py"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FIBERLITE_")}
        started = time.perf_counter()
        proc = subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        first = None
        try:
            for line in proc.stdout:
                if line.startswith("first result") and first is None:
                    first = time.perf_counter() - started
            proc.wait(RUN_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
        if proc.returncode != 0 or first is None:
            raise RuntimeError(f"fiberlite run failed ({proc.returncode}): {proc.stderr.read()}")
        return first

    def close(self) -> None:
        self.server.close()


def main() -> None:
    p = parser("fiberlite run: the working directory sent along, against code in the image")
    p.add_argument("--image", default=os.environ.get("FIBERLITE_IMAGE", "fiberlite:test"),
                   help="the fiberlite image (default: FIBERLITE_IMAGE, else fiberlite:test)")
    p.add_argument("--repeats", type=int, help="samples per row (default 5, --quick 1)")
    args = p.parse_args()
    rounds = args.repeats or sized(args, 5, 1)
    warmup = sized(args, 1, 0)  # --quick checks that every row runs, once
    report = Report("workdir", "fiberlite run: from the command to the first result",
                    quick=args.quick, repeats=rounds, image=args.image)
    section = report.section("first_result", "fiberlite run until the first result (Pool(2) "
                             "on pods)", unit="run", reference=REFERENCE)
    folder = Path(tempfile.mkdtemp(prefix="bench-workdir-"))
    projects = {name: make_project(folder / name.replace(" ", "-"), size)
                for name, size in ((REFERENCE, 1 << 20), ("1 MiB tree", 1 << 20),
                                   ("20 MiB tree", 20 << 20))}
    baked = bake(projects[REFERENCE], args.image)
    cluster = Cluster(folder)
    try:
        measures = {REFERENCE: lambda: cluster.run(projects[REFERENCE], baked, "--no-working-dir"),
                    "1 MiB tree": lambda: cluster.run(projects["1 MiB tree"], args.image),
                    "20 MiB tree": lambda: cluster.run(projects["20 MiB tree"], args.image)}
        progress(f"workdir: {len(measures)} rows, {warmup} warm-up and {rounds} round(s)")
        samples = interleave(measures, rounds, warmup=warmup, label="workdir")
    finally:
        cluster.close()
        subprocess.run(["docker", "rmi", "-f", baked], capture_output=True, timeout=RUN_TIMEOUT)
        shutil.rmtree(folder, ignore_errors=True)
    for name, values in samples.items():
        section.add(name, from_samples(values))
    section.note = ("pods are Docker containers started through the API server double (no "
                    "image pull, one node, loopback network); the trees are random bytes, "
                    "which do not compress")
    finish(report, args)


if __name__ == "__main__":
    main()
