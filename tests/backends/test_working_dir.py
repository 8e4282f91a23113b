"""The working directory travels with the run: a script, a package it imports and a
data file, none of them in the image, run on pods (Docker containers of the project's
image, created through the API server double) and on a Docker engine reached over TCP
(as a remote one is): by ``fiberlite run`` and by a master started as ``python job.py``.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from docker_env import ensure_docker
from fiberlite import config
from fiberlite.backends import get_backend
from k8s_double.fixture import k8s_api, k8s_docker_api  # noqa: F401  (the fixtures)
from waiting import eventually

pytestmark = [pytest.mark.kubernetes, pytest.mark.docker, pytest.mark.timeout(240)]
NS = "default"

JOB = textwrap.dedent("""
    import os
    import fiberlite as mp
    import mylib

    if __name__ == "__main__":
        with mp.Pool(2) as pool:
            results = pool.map(mylib.work, range(4))
        print("values", [value for value, _, _, _ in results], flush=True)
        print("computed in", " ".join(sorted({where for _, where, _, _ in results})), flush=True)
        print("mylib from", " ".join(sorted({path for _, _, path, _ in results})), flush=True)
        print("in containers", all(inside for _, _, _, inside in results), flush=True)
        print("master in", mp.current_process().name, os.environ.get("FIBERLITE_POD_NAME")
              or os.environ.get("FIBERLITE_DOCKER_CONTAINER") or "this machine", flush=True)
""")

MYLIB = textwrap.dedent("""
    import os
    from .version import VERSION

    def here():
        # where this copy of mylib is, and whether the working directory is the tree's
        return os.path.dirname(__file__), os.path.exists(os.path.join("data", "factor.txt"))

    def where(q, what="process"):
        q.put((what, *here()))

    def nested(q):
        import fiberlite as mp
        child = mp.Process(target=where, args=(q, "process of a process"))
        child.start()
        child.join()

    class Counter:
        def __init__(self):
            self.count = VERSION

        def report(self):
            return ("manager", *here())

    def member(ring):
        return ("ring member", *here())

    def work(x):
        with open(os.path.join("data", "factor.txt")) as fh:  # relative to the working directory
            factor = int(fh.read())
        where = os.environ.get("FIBERLITE_POD_NAME") or os.environ.get("FIBERLITE_DOCKER_CONTAINER")
        in_container = os.path.exists("/.dockerenv")  # Docker's mark in every container
        return x * factor + VERSION, where, os.path.dirname(__file__), in_container
""")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A working directory with job.py, the package mylib/ and data/factor.txt; the test
    runs in it. Its caches and ignored files must stay behind."""
    root = tmp_path / "project"
    (root / "mylib" / "__pycache__").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "job.py").write_text(JOB)
    (root / "mylib" / "__init__.py").write_text(MYLIB)
    (root / "mylib" / "version.py").write_text("VERSION = 1\n")
    (root / "mylib" / "__pycache__" / "junk.pyc").write_bytes(os.urandom(4096))
    (root / "data" / "factor.txt").write_text("10\n")
    (root / "scratch").mkdir()
    (root / "scratch" / "ignored.bin").write_bytes(os.urandom(1 << 20))
    (root / ".gitignore").write_text("scratch/\n")
    monkeypatch.chdir(root)
    return root


@pytest.fixture(scope="module")
def image():
    return ensure_docker()


@pytest.fixture
def settings(monkeypatch):
    """Settings of the in-process `fiberlite run` restored afterwards."""
    monkeypatch.setattr(config, "_overrides", dict(config._overrides))
    monkeypatch.setattr(config, "_resolved", None)
    for name in ("FIBERLITE_POD_NAME", "FIBERLITE_POD_IP", "FIBERLITE_BACKEND",
                 "FIBERLITE_WORKING_DIR", "FIBERLITE_WORKING_DIR_LIMIT"):
        monkeypatch.delenv(name, raising=False)


def results(out: str) -> dict[str, str]:
    lines = {}
    for line in out.splitlines():
        for key in ("values", "computed in", "mylib from", "master in", "in containers"):
            if line.startswith(key + " "):
                lines[key] = line[len(key) + 1:]
    return lines


def left_in_api_server(kube) -> dict[str, list]:
    v1 = kube.core_v1()
    return {"pods": [p.metadata.name for p in v1.list_namespaced_pod(NS).items],
            "secrets": [s.metadata.name for s in v1.list_namespaced_secret(NS).items],
            "configmaps": [c.metadata.name for c in v1.list_namespaced_config_map(NS).items]}


def nothing_left(kube) -> None:
    empty = {"pods": [], "secrets": [], "configmaps": []}
    eventually(lambda: left_in_api_server(kube) == empty, timeout=20,
               what=lambda: f"left in the API server: {left_in_api_server(kube)}")


def posts(server, resource: str) -> list:
    return [r for r in server.requests if r.method == "POST" and r.path.endswith("/" + resource)]


# -- fiberlite run: the master a pod -----------------------------------------------------------
def fiberlite_run_k8s(kube, image, *options: str, script: str = "job.py") -> int:
    from fiberlite.cli import main
    return main(["run", "--backend", "kubernetes", "--kubeconfig", str(kube.kubeconfig_path),
                 "--namespace", NS, "--image", image,
                 "--env", f"FIBERLITE_KUBECONFIG={kube.kubeconfig_path}", *options, script])


def test_fiberlite_run_sends_the_working_directory_to_the_pods(
        k8s_docker_api, image, project, settings, monkeypatch, capfd):  # noqa: F811
    kube = k8s_docker_api
    status = fiberlite_run_k8s(kube, image)
    out, err = capfd.readouterr()
    assert status == 0, out + err
    seen = results(out)
    assert seen["values"] == "[1, 11, 21, 31]" and seen["in containers"] == "True"
    master = seen["master in"].split()[-1]
    workers = seen["computed in"].split()
    assert master.endswith("-master") and workers and master not in workers
    assert all(w.startswith(master[:-len("master")]) for w in workers)  # pods of the run
    assert seen["mylib from"].startswith("/tmp/fiberlite-tree-")  # the copy, not the image
    assert "sending " + str(project) in err and "files" in err

    # the tree went to the master pod in ConfigMaps it owns, as a projected volume
    maps = posts(kube.server, "configmaps")
    pods = {r.body["metadata"]["name"]: r.body for r in posts(kube.server, "pods")}
    assert maps and all(m.body["metadata"]["ownerReferences"][0]["name"] == master and
                        m.body["immutable"] for m in maps)
    volume, = [v for v in pods[master]["spec"]["volumes"] if v["name"] == "fiberlite-tree"]
    assert [s["configMap"]["name"] for s in volume["projected"]["sources"]] == \
        [m.body["metadata"]["name"] for m in maps]
    assert "fiberlite.runtime.tree.enter" in pods[master]["spec"]["containers"][0]["command"]
    # its children got it from the master, not from the API server
    assert all("volumes" not in body["spec"] or not any(
        v["name"] == "fiberlite-tree" for v in body["spec"]["volumes"])
        for name, body in pods.items() if name != master)
    nothing_left(kube)

    # an edit is what the next run executes; --working-dir names the tree from elsewhere
    (project / "mylib" / "version.py").write_text("VERSION = 2\n")
    (project / "data" / "factor.txt").write_text("100\n")
    monkeypatch.chdir(project.parent)
    status = fiberlite_run_k8s(kube, image, "--working-dir", "project", script="project/job.py")
    out, err = capfd.readouterr()
    assert status == 0, out + err
    assert results(out)["values"] == "[2, 102, 202, 302]"
    assert "sending " + str(project) in err
    nothing_left(kube)


@pytest.mark.parametrize("where, options, script, message", [
    (".", ["--working-dir", "missing"], "project/job.py", "--working-dir missing: no such directory"),
    (".", ["--working-dir", "project/mylib"], "project/job.py",
     "project/job.py is not in the working directory {project}/mylib, which is what travels "
     "with the run: run from the script's directory, pass --working-dir DIR, or "
     "--no-working-dir for a script baked into the image"),
    ("project/mylib", [], "../job.py", "../job.py is not in the working directory {project}/mylib"),
    (".", ["--working-dir", "project"], "project/nothing.py",
     "project/nothing.py: no such file in the working directory {project}"),
])
def test_fiberlite_run_names_a_script_that_cannot_travel(
        k8s_api, project, settings, monkeypatch, capfd, where, options, script, message):  # noqa: F811
    """Checked before anything is packed or created."""
    monkeypatch.chdir(project.parent / where)
    status = fiberlite_run_k8s(k8s_api, "fiberlite:any", *options, script=script)
    err = capfd.readouterr().err
    assert status == 2
    line, = err.splitlines()
    assert message.format(project=project) in line
    assert not posts(k8s_api.server, "pods") and not posts(k8s_api.server, "configmaps")


def test_fiberlite_run_of_a_tree_over_the_limit_fails_before_any_pod(
        k8s_docker_api, image, project, settings, monkeypatch, capfd):  # noqa: F811
    kube = k8s_docker_api
    (project / "data" / "huge.bin").write_bytes(os.urandom(300 << 10))
    monkeypatch.setenv("FIBERLITE_WORKING_DIR_LIMIT", "256Ki")
    status = fiberlite_run_k8s(kube, image)
    err = capfd.readouterr().err
    assert status == 1
    line, = err.splitlines()
    assert line.startswith(f"fiberlite: error: the working directory {project} holds ")
    assert "over the limit of 256.0 KiB (setting working_dir_limit); largest: data/huge.bin 300.0 KiB" in line
    assert not posts(kube.server, "pods") and not posts(kube.server, "configmaps")


@pytest.fixture
def baked(image, project, tmp_path):
    """An image FROM the project's with job.py, mylib and data in its /app: the code is
    in the image, as before the working directory travelled."""
    import docker
    client = docker.from_env(timeout=120)
    tag = f"{image}-baked-{os.getpid()}"
    (project / "Dockerfile").write_text(f"FROM {image}\nCOPY . /app\n")
    client.images.build(path=str(project), tag=tag, rm=True, forcerm=True)
    try:
        yield tag
    finally:
        client.images.remove(tag, force=True)


def test_no_working_dir_runs_the_script_baked_into_the_image(
        k8s_docker_api, baked, project, tmp_path, settings, monkeypatch, capfd):  # noqa: F811
    kube = k8s_docker_api
    elsewhere = tmp_path / "elsewhere"  # nothing of the code here
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    status = fiberlite_run_k8s(kube, baked, "--no-working-dir")
    out, err = capfd.readouterr()
    assert status == 0, out + err
    seen = results(out)
    assert seen["values"] == "[1, 11, 21, 31]" and seen["in containers"] == "True"
    assert seen["mylib from"] == "/app/mylib"  # the image's
    master = seen["master in"].split()[-1]
    assert master.endswith("-master") and master not in seen["computed in"].split()
    pods = {r.body["metadata"]["name"]: r.body for r in posts(kube.server, "pods")}
    assert pods[master]["spec"]["containers"][0]["command"] == ["python", "job.py"]
    assert not posts(kube.server, "configmaps") and "sending" not in err
    nothing_left(kube)


def master_with_tree(kube, run: str):
    """A master job created as `fiberlite run` creates it, whose pod (a local process of
    the double) sleeps."""
    from fiberlite.backends import JobSpec, TreeArchive
    from fiberlite.runtime.tree.pack import pack
    tree = pack(os.getcwd(), 1 << 20)
    config.init(kubeconfig=str(kube.kubeconfig_path), namespace=NS)
    spec = JobSpec(command=["python", "-c", "import time; time.sleep(600)"], name=f"fl-{run}-master",
                   image="fiberlite:any", labels={"fiberlite/run": run},
                   tree=TreeArchive(tree.digest, tree.data))
    return get_backend("kubernetes").create_job(spec)


def test_a_masters_configmaps_go_with_its_pod_and_with_fiberlite_clean(
        k8s_api, project, settings, capsys):  # noqa: F811
    """Deleting the master pod takes its ConfigMaps (ownerReferences); `fiberlite clean`
    removes those of a run whose command was killed."""
    from fiberlite.cli import main
    kube = k8s_api
    v1 = kube.core_v1()
    try:
        job = master_with_tree(kube, "gone")
        assert [c.metadata.name for c in v1.list_namespaced_config_map(NS).items] == \
            [f"{job.id}-tree-0"]
        v1.delete_namespaced_pod(job.id, NS, grace_period_seconds=0)
        eventually(lambda: not v1.list_namespaced_config_map(NS).items, timeout=10,
                   what="the ConfigMaps of a deleted master pod")
        master_with_tree(kube, "killed")
        assert v1.list_namespaced_config_map(NS).items
        assert main(["clean", "--backend", "kubernetes", "--run", "killed", "--kubeconfig",
                     str(kube.kubeconfig_path), "--namespace", NS]) == 0
        assert "removed 1 job of run killed" in capsys.readouterr().out
        nothing_left(kube)
    finally:
        get_backend("kubernetes").close()


# -- python job.py on this machine, the jobs pods ------------------------------------------------
def laptop_master(kube, image, project) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIBERLITE_")}
    env.update(FIBERLITE_BACKEND="kubernetes", FIBERLITE_KUBECONFIG=str(kube.kubeconfig_path),
               FIBERLITE_NAMESPACE=NS, FIBERLITE_IMAGE=image, FIBERLITE_LISTEN_HOST="127.0.0.1")
    return subprocess.run([sys.executable, "job.py"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=180)


def test_a_master_outside_the_cluster_sends_its_working_directory(
        k8s_docker_api, image, project):  # noqa: F811
    kube = k8s_docker_api
    done = laptop_master(kube, image, project)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = results(done.stdout)
    assert seen["values"] == "[1, 11, 21, 31]" and seen["in containers"] == "True"
    assert seen["master in"] == "MainProcess this machine"
    assert seen["computed in"].split() and seen["mylib from"].startswith("/tmp/fiberlite-tree-")
    assert not posts(kube.server, "configmaps")  # jobs fetch it from their master
    nothing_left(kube)

    (project / "mylib" / "version.py").write_text("VERSION = 5\n")
    done = laptop_master(kube, image, project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert results(done.stdout)["values"] == "[5, 15, 25, 35]"

    (project / "data" / "huge.bin").write_bytes(os.urandom(300 << 10))
    (project / ".fiberlite.toml").write_text('working_dir_limit = "256Ki"\n')
    created = len(posts(kube.server, "pods"))
    done = laptop_master(kube, image, project)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        f"fiberlite.errors.ConfigError: the working directory {project} holds ")
    assert len(posts(kube.server, "pods")) == created  # no job started
    nothing_left(kube)


EVERY = textwrap.dedent("""
    import fiberlite as mp
    from fiberlite.managers import BaseManager
    import mylib

    class Manager(BaseManager):
        pass

    Manager.register("Counter", mylib.Counter)

    if __name__ == "__main__":
        q = mp.Queue()
        for target in (mylib.where, mylib.nested):
            p = mp.Process(target=target, args=(q,))
            p.start()
            p.join()
            print(*q.get(timeout=60), p.exitcode, flush=True)
        with Manager() as manager:
            print(*manager.Counter().report(), flush=True)
        for seen in mp.Ring(2, mylib.member).run():
            print(*seen, flush=True)
""")


def test_every_kind_of_job_runs_in_the_tree(k8s_docker_api, image, project):  # noqa: F811
    """Process, a process's process (fetching from its parent pod), a manager's server,
    ring members: each imports mylib from its copy and runs in it."""
    (project / "every.py").write_text(EVERY)
    (project / "job.py").unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIBERLITE_")}
    env.update(FIBERLITE_BACKEND="kubernetes", FIBERLITE_KUBECONFIG=str(k8s_docker_api.kubeconfig_path),
               FIBERLITE_NAMESPACE=NS, FIBERLITE_IMAGE=image, FIBERLITE_LISTEN_HOST="127.0.0.1")
    done = subprocess.run([sys.executable, "every.py"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    pattern = re.compile(r"(process|process of a process|manager|ring member) "
                         r"/tmp/fiberlite-tree-\S+ True( 0)?")
    found = [pattern.fullmatch(line) for line in done.stdout.splitlines()]
    assert all(found), done.stdout
    assert [m.group(1) for m in found] == ["process", "process of a process", "manager",
                                           "ring member", "ring member"]
    nothing_left(k8s_docker_api)


# -- Docker: an engine that is not this machine's ------------------------------------------------
class EngineOverTcp:
    """The local Docker engine's socket, forwarded on 127.0.0.1:PORT: to fiberlite an
    engine reached over TCP, which cannot see this machine's files."""

    def __init__(self, path: str = "/var/run/docker.sock") -> None:
        self.path = path
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "tcp://127.0.0.1:%d" % self.server.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX)
            engine.connect(self.path)
            for a, b in ((client, engine), (engine, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            try:
                target.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self.closed = True
        self.server.close()


@pytest.fixture
def remote_engine(image):
    engine = EngineOverTcp()
    yield engine.address
    engine.close()


def docker_env(engine: str, image: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FIBERLITE_", "DOCKER_"))}
    env.update(DOCKER_HOST=engine, FIBERLITE_BACKEND="docker", FIBERLITE_IMAGE=image)
    return env


def test_jobs_on_a_remote_docker_engine_get_the_working_directory(remote_engine, image, project):
    env = docker_env(remote_engine, image)
    done = subprocess.run([sys.executable, "job.py"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = results(done.stdout)
    assert seen["values"] == "[1, 11, 21, 31]" and seen["in containers"] == "True"
    assert seen["mylib from"].startswith("/tmp/fiberlite-tree-")  # not a bind mount

    fiberlite = os.path.join(os.path.dirname(sys.executable), "fiberlite")
    (project / "mylib" / "version.py").write_text("VERSION = 3\n")
    done = subprocess.run([fiberlite, "run", "job.py"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = results(done.stdout)
    assert seen["values"] == "[3, 13, 23, 33]"
    master = seen["master in"].split()[-1]
    assert master.endswith("-master") and master not in seen["computed in"].split()
    assert "sending " + str(project) in done.stderr


def test_a_local_engine_still_mounts_the_working_directory(image, project, settings):
    """With the engine on this machine nothing is packed: the directory is bind-mounted."""
    from fiberlite.runtime.tree.offer import offer_for
    config.init(image=image)
    backend = get_backend("docker")
    assert backend.shares_working_dir()
    assert offer_for(backend, "docker") is None
    config.init(mount_working_dir=False)  # a copy instead, as for a remote engine
    assert not backend.shares_working_dir()
