"""The kubernetes backend through the official client against the API server double
(tests/k8s_double): every job a pod the double runs as a local process."""
from __future__ import annotations

import collections
import itertools
import os
import signal
import sys
import textwrap
import threading
import time

import pytest
import yaml
from kubernetes import client

import fiberlite
import jobs
from fiberlite import config
from fiberlite.runtime import identity
from fiberlite.backends import get_backend
from fiberlite.backends.kubernetes import pods as k8s_pods, status as k8s_status, watch as k8s_watch
from fiberlite.errors import BackendError
from k8s_double.fixture import k8s_api  # noqa: F401  (the fixture)
from paths import ROOT
from waiting import eventually

pytestmark = [pytest.mark.kubernetes, pytest.mark.timeout(60)]
NS = "default"
IMAGE = "fiberlite:test"


@pytest.fixture
def kube(k8s_api, monkeypatch):  # noqa: F811
    """Settings pointing at the double; the backend closed and settings restored after."""
    # pods run `python` from PATH: the interpreter running the tests, not a pyenv shim
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    for name in ("FIBERLITE_POD_NAME", "FIBERLITE_POD_IP", "FIBERLITE_POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(config, "_overrides", dict(config._overrides))
    monkeypatch.setattr(config, "_resolved", None)
    fiberlite.init(kubeconfig=str(k8s_api.kubeconfig_path), namespace=NS, image=IMAGE,
                   listen_host="127.0.0.1")
    k8s_api.ctx = fiberlite.get_context("kubernetes")
    k8s_api.v1 = k8s_api.core_v1()
    yield k8s_api
    get_backend("kubernetes").close()


RBAC = os.path.join(ROOT, "docs", "kubernetes", "rbac.yaml")
# tried by `fiberlite clean` and tolerated when forbidden (Secrets and ConfigMaps also go with
# their owner pod)
OPTIONAL = {("secrets", "list"), ("configmaps", "list")}


def role_rights() -> set[tuple[str, str]]:
    docs = list(yaml.safe_load_all(open(RBAC)))
    role = next(d for d in docs if d["kind"] == "Role")
    return {(resource, verb) for rule in role["rules"] for resource in rule["resources"]
            for verb in rule["verbs"]}


def rights_used(requests) -> set[tuple[str, str]]:
    """(resource, verb) of each request, as the RBAC authorizer names them."""
    used = set()
    for r in requests:
        parts = r.path.strip("/").split("/")   # api v1 namespaces NS resource [name [sub]]
        if parts[:3] != ["api", "v1", "namespaces"] or len(parts) < 5:
            continue
        resource = parts[4] + ("/" + parts[6] if len(parts) > 6 else "")
        named = len(parts) > 5
        verb = {"POST": "create", "DELETE": "delete" if named else "deletecollection"}.get(
            r.method, "get" if named else "watch" if r.query.get("watch") == "true" else "list")
        used.add((resource, verb))
    return used


def test_rbac_manifest_is_namespaced_and_least():
    kinds = [d["kind"] for d in yaml.safe_load_all(open(RBAC))]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding"]
    assert role_rights() == {("pods", v) for v in ("create", "get", "list", "watch", "delete")} | {
        ("pods/log", "get"), ("secrets", "create"), ("secrets", "delete"), ("events", "list")}


def posts(server, resource):
    return [r for r in server.requests if r.method == "POST" and r.path.endswith("/" + resource)]


def pod_name(process) -> str:
    return process._popen.job.id


@fiberlite.meta(cpu="500m", memory="256Mi")
def small_job(q, text):
    print(text, flush=True)
    q.put(os.environ.get("FIBERLITE_POD_NAME"))


def test_process_and_queue_on_pods(kube, capfd):
    ctx, server = kube.ctx, kube.server
    q = ctx.Queue()
    p = ctx.Process(target=small_job, args=(q, "hello from a pod"))
    p.start()
    name = pod_name(p)
    assert q.get(timeout=30) == name          # the job ran in that pod (downward API)
    p.join(30)
    assert p.exitcode == 0
    bad = ctx.Process(target=jobs.exit_with, args=(3,))
    bad.start()
    bad.join(30)
    assert bad.exitcode == 3
    # the pod's log reaches the parent's stdout; finished pods are deleted
    assert "hello from a pod" in capfd.readouterr().out
    assert server.pod(name) is None and server.pod(pod_name(bad)) is None

    body = posts(server, "pods")[0].body
    spec, container = body["spec"], body["spec"]["containers"][0]
    assert spec["restartPolicy"] == "Never" and container["image"] == IMAGE
    assert container["command"] == ["python", "-m", "fiberlite.runtime.bootstrap"]
    labels = body["metadata"]["labels"]
    assert labels == {"fiberlite/run": identity.run_id(), "fiberlite/job": name,
                      "fiberlite/parent": "master"}
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "256Mi"},
                                      "limits": {"cpu": "500m", "memory": "256Mi"}}
    assert "ownerReferences" not in body["metadata"]  # the test process is not in a pod


def test_the_key_travels_in_a_secret(kube):
    server = kube.server
    p = kube.ctx.Process(target=jobs.noop)
    p.start()
    p.join(30)
    assert p.exitcode == 0
    key = fiberlite.current_process().authkey.hex()
    pod_posts, secret_posts = posts(server, "pods"), posts(server, "secrets")
    assert len(secret_posts) == 1 and key in secret_posts[0].raw.decode()
    assert all(key not in r.raw.decode() for r in pod_posts)
    env = {e["name"]: e for e in pod_posts[0].body["spec"]["containers"][0]["env"]}
    secret_name = env["FIBERLITE_AUTHKEY"]["valueFrom"]["secretKeyRef"]["name"]
    assert "value" not in env["FIBERLITE_AUTHKEY"]
    assert secret_name.startswith(f"fl-{identity.run_id()}-key-")
    # deleted when the backend closes (no master pod to own it)
    get_backend("kubernetes").close()
    assert [s.metadata.name for s in kube.v1.list_namespaced_secret(NS).items] == []


def test_state_comes_from_one_watch_not_polling(kube):
    ps = [kube.ctx.Process(target=jobs.noop) for _ in range(3)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(30)
    assert [p.exitcode for p in ps] == [0, 0, 0]
    gets = [r for r in kube.server.requests if r.method == "GET" and r.path.endswith("/pods")]
    watches = [r for r in gets if r.query.get("watch") == "true"]
    assert len(gets) - len(watches) == 1          # one list, then one watch for all jobs
    assert len(watches) == 1 and watches[0].query["labelSelector"] == \
        f"fiberlite/parent=master,fiberlite/run={identity.run_id()}"
    reads = [r for r in kube.server.requests if r.method == "GET" and "/pods/fl-" in r.path
             and not r.path.endswith("/log")]
    assert reads == []                            # no per-pod status polling


def test_watch_resumes_after_410(kube, monkeypatch, waiting_jobs):
    monkeypatch.setattr(k8s_watch, "WATCH_SECONDS", 1)
    p, = waiting_jobs(ctx=kube.ctx)
    kube.server.expire_watch_history()
    compacted = kube.server.api.store.compacted
    other = kube.ctx.Process(target=jobs.noop)   # changes after the compaction point
    other.start()
    other.join(30)
    assert other.exitcode == 0

    def resumed():
        return [r for r in kube.server.requests if r.query.get("watch") == "true"
                and int(r.query.get("resourceVersion") or 0) >= compacted]
    # the watcher reconnects on its own; nothing to await here
    eventually(resumed, 10, what="the watcher's list and watch again after 410 Gone")
    kube.v1.delete_namespaced_pod(pod_name(p), NS, grace_period_seconds=1)
    p.join(30)
    assert p.exitcode == -signal.SIGTERM


def test_terminate_and_kill(kube, waiting_jobs):
    p1, p2 = waiting_jobs(2, kube.ctx)
    assert p1.is_alive()
    p1.terminate()
    p2.kill()
    p1.join(30)
    p2.join(30)
    assert (p1.exitcode, p2.exitcode) == (-signal.SIGTERM, -signal.SIGKILL)
    deletes = {r.path.rsplit("/", 1)[1]: r.query.get("gracePeriodSeconds")
               for r in kube.server.requests if r.method == "DELETE"}
    assert deletes[pod_name(p1)] == str(k8s_pods.GRACE_SECONDS) and deletes[pod_name(p2)] == "0"


def test_pod_deleted_or_evicted_mid_run(kube, caplog, waiting_jobs):
    deleted, evicted = waiting_jobs(2, kube.ctx)
    kube.v1.delete_namespaced_pod(pod_name(deleted), NS)   # as `kubectl delete pod` would
    kube.server.evict(pod_name(evicted))
    deleted.join(30)
    evicted.join(30)
    assert deleted.exitcode == -signal.SIGTERM
    assert evicted.exitcode == -signal.SIGKILL
    assert "pod evicted: The node was low on resource: memory" in caplog.text


@pytest.mark.parametrize("verb,resource", [("create", "pods"), ("create", "secrets"),
                                           ("watch", "pods")])
def test_forbidden_names_verb_and_resource(kube, verb, resource):
    kube.server.forbid(verb, resource)
    p = kube.ctx.Process(target=jobs.noop)
    with pytest.raises(BackendError) as err:
        p.start()
    message = str(err.value)
    assert f"forbids {verb} on {resource}" in message and "docs/kubernetes/rbac.yaml" in message
    assert "\n" not in message


def test_unschedulable_pod_fails_within_seconds(kube, caplog):
    kube.server.unschedulable("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    p = kube.ctx.Process(target=jobs.noop)
    started = time.monotonic()
    p.start()
    p.join(20)
    assert p.exitcode == k8s_status.START_FAILED and time.monotonic() - started < 5
    assert "cannot be scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu." in caplog.text
    assert kube.server.pod(pod_name(p)) is None


def test_image_pull_failure_fails_within_seconds(kube, caplog):
    fiberlite.init(image="registry.invalid/no/such:1")
    kube.server.image_pull_fails("registry.invalid/no/such:1")
    p = kube.ctx.Process(target=jobs.noop)
    started = time.monotonic()
    p.start()
    p.join(20)
    assert p.exitcode == k8s_status.START_FAILED and time.monotonic() - started < 5
    assert "cannot pull image 'registry.invalid/no/such:1'" in caplog.text
    assert "failed to pull and unpack image" in caplog.text      # the event's message
    assert kube.server.pod(pod_name(p)) is None
    used = rights_used(kube.server.requests)
    assert ("events", "list") in used and used <= role_rights()


def slow_square(x):
    time.sleep(0.05)
    return x * x


def test_pool_on_pods_survives_a_lost_pod(kube):
    with kube.ctx.Pool(2) as pool:
        results = pool.imap(slow_square, range(40))
        first = [next(results) for _ in range(5)]
        victim = pod_name(pool._pool[0])
        kube.v1.delete_namespaced_pod(victim, NS, grace_period_seconds=0)
        assert first + list(results) == [x * x for x in range(40)]
        assert pool.map(slow_square, range(4)) == [0, 1, 4, 9]
        assert kube.server.pod(victim) is None


def test_pool_packs_workers_into_pods_and_survives_a_lost_one(kube):
    """A pod with cpu=3 runs three workers, forked in it: six workers are two pods."""
    fiberlite.init(cpu=3)
    with kube.ctx.Pool(6) as pool:
        assert pool._core.per_job == 3
        pods = [pod_name(process) for process in pool._core.procs.values()]
        assert len(pods) == 2
        results = pool.imap(slow_square, range(60))
        first = [next(results) for _ in range(5)]
        assert len({p.pid for p in pool._pool}) == 6
        kube.v1.delete_namespaced_pod(pods[0], NS, grace_period_seconds=0)
        assert first + list(results) == [x * x for x in range(60)]
        assert pool.map(slow_square, range(6)) == [x * x for x in range(6)]
        assert kube.server.pod(pods[0]) is None
        assert len(pool._core.procs) == 2 and pods[0] not in {
            pod_name(process) for process in pool._core.procs.values()}


def test_pool_whose_pods_cannot_start_is_broken_not_hung(kube):
    from fiberlite.pool.master.results import BrokenPoolError
    fiberlite.init(image="registry.invalid/missing:1")
    kube.server.image_pull_fails("registry.invalid/missing:1")
    started = time.monotonic()
    pool = kube.ctx.Pool(2)
    try:
        with pytest.raises(BrokenPoolError):
            pool.map(slow_square, range(4))
        assert time.monotonic() - started < 20
    finally:
        pool.terminate()
        pool.join()
    assert fiberlite.active_children() == []


def square_in_pod(x):
    time.sleep(0.02)
    return x * x, os.environ["FIBERLITE_JOB_NAME"]


def test_pool_maps_on_the_pods_with_room_and_takes_the_others_as_they_start(kube):
    """Room for one pod of three: the map runs there, the Pending ones neither hold it up
    nor fail the pool, and join it when room comes mid-map. Idle, the pool deletes its
    pods; the next map starts new ones."""
    fiberlite.init(cpu=2, idle_timeout=2)
    kube.server.capacity(1)
    stop = threading.Event()

    def items():
        for x in itertools.count():
            if stop.is_set():
                return
            yield x

    with kube.ctx.Pool(6) as pool:
        core = pool._core
        first_pods = {pod_name(process) for process in core.procs.values()}
        assert len(first_pods) == 3
        ran_in = collections.Counter()
        for x, (value, job) in enumerate(pool.imap(square_in_pod, items())):
            assert value == x * x
            ran_in[job] += 1
            if x == 60:
                assert len(ran_in) == 1, "a pod beyond the capacity ran"
                kube.server.capacity(3)
            if len(ran_in) == 3:
                stop.set()
        assert sum(ran_in.values()) == x + 1 and core.dispatcher.start_failures == 0
        eventually(lambda: not core.procs and all(kube.server.pod(name) is None
                                                  for name in first_pods),
                   what="the idle pool's pods")
        assert pool.map(slow_square, range(12), 1) == [x * x for x in range(12)]
        assert {pod_name(process) for process in core.procs.values()}.isdisjoint(first_pods)


def pid_after(delay):
    time.sleep(delay)
    return os.getpid()


def test_a_pool_of_many_pods_maps_while_its_later_pods_are_created(kube, monkeypatch):
    """Pool() returns once its first round of pods is created: here the API server holds
    every creation after the second until told, and the map runs meanwhile on the two
    pods there are; the others join once created."""
    from fiberlite.pool.master import core as pool_core
    monkeypatch.setattr(pool_core, "START_CONCURRENCY", 2)
    fiberlite.init(cpu=2)
    api, created, go_on = kube.server.api, [], threading.Event()
    handle = api.handle

    def held_creations(req):
        if req.method == "POST" and req.path.endswith("/pods"):
            created.append(req.path)
            if len(created) > 2:
                assert go_on.wait(60), "the creation was never let go on"
        return handle(req)

    monkeypatch.setattr(api, "handle", held_creations)
    with kube.ctx.Pool(10) as pool:  # five pods of two workers
        core = pool._core
        eventually(lambda: len(created) == 4, what="the second round of creations")
        results = pool.map(square_in_pod, range(40), 1)
        assert [value for value, _ in results] == [x * x for x in range(40)]
        assert len({job for _, job in results}) <= 2  # the pods held are not there yet
        assert len(created) == 4  # a round at a time: the fifth waits for the second round
        go_on.set()
        eventually(lambda: len(created) == 5 and len(core.procs) == 5, what="the later pods")
        pods = {pod_name(process) for process in core.procs.values()}
        seen: set[int] = set()

        def every_worker_ran() -> bool:
            seen.update(pool.map(pid_after, [0.05] * 10, 1))
            return len(seen) == 10

        eventually(every_worker_ran, what="every worker running a task")
        assert core.dispatcher.start_failures == 0
    eventually(lambda: all(kube.server.pod(name) is None for name in pods), what="the pods deleted")


def test_shrinking_a_pool_deletes_its_pods_that_never_started(kube):
    kube.server.capacity(1)
    with kube.ctx.Pool(3) as pool:  # one worker a pod
        core = pool._core
        pods = {pod_name(process) for process in core.procs.values()}
        assert pool.map(slow_square, range(10), 1) == [x * x for x in range(10)]
        pool.resize(1)
        eventually(lambda: len(core.procs) == 1, what="the shrunk pool")
        kept = pod_name(next(iter(core.procs.values())))
        eventually(lambda: all(kube.server.pod(name) is None for name in pods - {kept}),
                   what="the Pending pods")
        assert core.dispatcher.start_failures == 0
        assert pool.map(slow_square, range(10), 1) == [x * x for x in range(10)]


MASTER_CODE = "import time; time.sleep(120)"


def test_children_of_a_master_pod(kube, monkeypatch, waiting_jobs):
    """In a pod: ownerReferences, its image, env and volumes; its deletion ends the children."""
    v1 = kube.v1
    master = v1.create_namespaced_pod(NS, client.V1Pod(
        metadata=client.V1ObjectMeta(name="master-pod"),
        spec=client.V1PodSpec(restart_policy="Never", service_account_name="fiberlite", containers=[
            client.V1Container(name="main", image="my/app:7", command=[sys.executable, "-c", MASTER_CODE],
                               env=[client.V1EnvVar(name="FROM_MASTER", value="yes")],
                               volume_mounts=[client.V1VolumeMount(name="data", mount_path="/data")])],
            volumes=[client.V1Volume(name="data", persistent_volume_claim=(
                client.V1PersistentVolumeClaimVolumeSource(claim_name="shared")))])))
    monkeypatch.setenv("FIBERLITE_POD_NAME", "master-pod")
    fiberlite.init(image=None)      # the master pod's image is the default
    p, = waiting_jobs(ctx=kube.ctx)
    body = kube.server.pod(pod_name(p))
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "master-pod", "uid": master.metadata.uid}
    assert body["metadata"]["ownerReferences"] == [owner]
    container = body["spec"]["containers"][0]
    assert container["image"] == "my/app:7" and body["spec"]["serviceAccountName"] == "fiberlite"
    assert {"name": "FROM_MASTER", "value": "yes"} in container["env"]
    assert container["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert body["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "shared"}
    secret = posts(kube.server, "secrets")[0].body
    assert secret["metadata"]["ownerReferences"] == [owner]
    # the master pod goes: Kubernetes' garbage collector deletes the child pod
    v1.delete_namespaced_pod("master-pod", NS, grace_period_seconds=0)
    p.join(30)
    assert p.exitcode is not None and p.exitcode < 0


def test_cli_commands_against_the_cluster(kube, capsys):
    from fiberlite.cli import main
    cluster = ["--backend", "kubernetes", "--kubeconfig", str(kube.kubeconfig_path), "--namespace", NS]
    q = kube.ctx.Queue()
    p = kube.ctx.Process(target=small_job, args=(q, "visible in logs"))
    p2 = kube.ctx.Process(target=jobs.wait_forever, args=(q,))
    p.start()
    p2.start()
    q.get(timeout=30)
    q.get(timeout=30)
    run = identity.run_id()
    assert main(["ps", *cluster, "--run", run]) == 0
    listed = capsys.readouterr().out
    assert pod_name(p2) in listed and "running" in listed
    p.join(30)
    assert main(["logs", pod_name(p2), *cluster]) == 0
    assert main(["logs", "fl-nosuchjob", *cluster]) == 1
    capsys.readouterr()
    assert main(["clean", "--run", run, *cluster]) == 0
    assert "kubernetes: removed 1 job of run" in capsys.readouterr().out
    p2.join(30)
    assert p2.exitcode == -signal.SIGKILL
    assert kube.v1.list_namespaced_pod(NS).items == []


RUN_SCRIPT = textwrap.dedent("""
    import os, sys, fiberlite

    def square(q, x):
        q.put(x * x)

    if __name__ == "__main__":
        q = fiberlite.Queue()
        ps = [fiberlite.Process(target=square, args=(q, x)) for x in (2, 3)]
        for p in ps:
            p.start()
        print("squares", sorted(q.get(timeout=60) for _ in ps), flush=True)
        for p in ps:
            p.join()
        print("master pod", os.environ["FIBERLITE_POD_NAME"], flush=True)
        sys.exit(5)
""")


def test_fiberlite_run_on_kubernetes(kube, tmp_path, capfd):
    """The master itself a pod; its children pods owned by it; everything removed after."""
    from fiberlite.cli import main
    script = tmp_path / "master.py"
    script.write_text(RUN_SCRIPT)
    status = main(["run", "--backend", "kubernetes", "--kubeconfig", str(kube.kubeconfig_path),
                   "--namespace", NS, "--image", IMAGE, "--cpu", "1", "--service-account", "runner",
                   # the double's pods are not in a cluster: give the master the kubeconfig
                   "--env", f"FIBERLITE_KUBECONFIG={kube.kubeconfig_path}",
                   # the local runner's pods see this machine: the script is "in the image"
                   "--no-working-dir", str(script)])
    out = capfd.readouterr().out
    assert status == 5, out
    assert "squares [4, 9]" in out
    master_name = next(line.split()[-1] for line in out.splitlines() if line.startswith("master pod"))
    pods = {r.body["metadata"]["name"]: r.body for r in posts(kube.server, "pods")}
    master = pods.pop(master_name)
    assert master["spec"]["containers"][0]["command"] == ["python", str(script)]
    # the job option travelled through the seam; the master's jobs run as the same account
    assert master["spec"]["serviceAccountName"] == "runner"
    assert {p["spec"].get("serviceAccountName") for p in pods.values()} == {"runner"}
    assert master["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1"}
    env = {e["name"]: e.get("value") for e in master["spec"]["containers"][0]["env"]}
    assert env["FIBERLITE_BACKEND"] == "kubernetes" and env["FIBERLITE_IMAGE"] == IMAGE
    assert len(pods) == 2 and all(
        c["metadata"]["ownerReferences"][0]["name"] == master_name and
        c["metadata"]["labels"]["fiberlite/parent"] == master_name for c in pods.values())
    # everything the CLI, the master pod and its children asked for is in the Role
    assert rights_used(kube.server.requests) - OPTIONAL <= role_rights()
    # the double's garbage collector works asynchronously
    eventually(lambda: kube.v1.list_namespaced_pod(NS).items == [], 10,
               what=lambda: f"the pods' removal (left: {kube.v1.list_namespaced_pod(NS).items})")


PAGE_SCRIPT = textwrap.dedent("""
    import json, os, urllib.request, fiberlite, fiberlite.dashboard

    if __name__ == "__main__":
        q = fiberlite.Queue()  # the first object: the page starts
        q.put(1)
        with urllib.request.urlopen(fiberlite.dashboard.url() + "api/state", timeout=10) as page:
            state = json.load(page)
        print("page of", state["run"], "queues", [x["size"] for x in state["queues"]], flush=True)
        print("master pod", os.environ["FIBERLITE_POD_NAME"], flush=True)
""")


def free_port() -> int:
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_fiberlite_run_dashboard_on_kubernetes(kube, tmp_path, capfd):
    """`fiberlite run --dashboard` hands the address to the master pod, which serves its
    page there, and tells the user how to open it from their machine."""
    from fiberlite.cli import main
    script = tmp_path / "master.py"
    script.write_text(PAGE_SCRIPT)
    port = free_port()
    status = main(["run", "--backend", "kubernetes", "--kubeconfig", str(kube.kubeconfig_path),
                   "--namespace", NS, "--image", IMAGE, "--dashboard", str(port),
                   "--env", f"FIBERLITE_KUBECONFIG={kube.kubeconfig_path}", "--no-working-dir",
                   str(script)])
    out, err = capfd.readouterr()
    assert status == 0, out + err
    master_name = next(line.split()[-1] for line in out.splitlines() if line.startswith("master pod"))
    run_id = master_name.split("-")[1]
    assert f"page of {run_id} queues [1]" in out
    assert f"dashboard at http://127.0.0.1:{port}/" in out + err  # the pod's own line
    assert (f"kubectl port-forward -n {NS} pod/{master_name} {port}:{port}   then open "
            f"http://127.0.0.1:{port}/") in err
    assert f"bind it to 0.0.0.0:{port}" in err  # a loopback page has no pod proxy
    [master] = [r.body for r in posts(kube.server, "pods") if r.body["metadata"]["name"] == master_name]
    env = {e["name"]: e.get("value") for e in master["spec"]["containers"][0]["env"]}
    assert env["FIBERLITE_DASHBOARD"] == f"127.0.0.1:{port}"


WAITING_PAGE_SCRIPT = textwrap.dedent("""
    import os, sys, time, fiberlite

    if __name__ == "__main__":
        q = fiberlite.Queue()  # the first object: the page starts
        q.put(1)
        print("master pod", os.environ["FIBERLITE_POD_NAME"], flush=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
            time.sleep(0.1)  # the test reads the page meanwhile
""")


def test_fiberlite_run_opens_the_page_through_the_pod_proxy(kube, tmp_path, capfd):
    """A page bound beyond the pod's loopback: `fiberlite run` opens a local door to it
    through the API server's pod proxy, page, script and data, with the user's rights."""
    import threading
    from fiberlite.cli import main
    script, seen = tmp_path / "master.py", tmp_path / "seen"
    script.write_text(WAITING_PAGE_SCRIPT)
    port = free_port()
    found: dict = {}
    reader = threading.Thread(target=read_through_the_door, args=(kube, capfd, port, seen, found))
    reader.start()  # the command runs on this thread: it sets signal handlers
    status = main(["run", "--backend", "kubernetes", "--kubeconfig", str(kube.kubeconfig_path),
                   "--namespace", NS, "--image", IMAGE, "--dashboard", f"0.0.0.0:{port}",
                   "--env", f"FIBERLITE_KUBECONFIG={kube.kubeconfig_path}", "--no-working-dir",
                   str(script), str(seen)])
    seen.touch()  # the reader gives up if the master never said it runs
    reader.join(60)
    assert status == 0 and "error" not in found, found.get("error")
    master_name = found["master"]
    assert found["state"]["run"] == master_name.split("-")[1]
    assert [q["size"] for q in found["state"]["queues"]] == [1]
    assert found["events"] == 404
    assert 'src="static/app.js"' in found["html"]  # relative: the page works under the proxy's path
    assert found["script_type"].startswith("text/javascript")
    assert found["denied"][0] == 403 and b"pods/proxy" in found["denied"][1]
    proxy = f"{kube.server.host}/api/v1/namespaces/{NS}/pods/{master_name}:{port}/proxy/"
    assert proxy in found["err"]
    proxied = {r.path.split("/proxy")[0] for r in kube.server.requests if "/proxy/" in r.path}
    assert proxied == {proxy[len(kube.server.host):].split("/proxy")[0]}


def read_through_the_door(kube, capfd, port: int, seen, found: dict) -> None:
    """What a user's browser does with the address `fiberlite run` printed; then lets the
    master end (``seen``)."""
    import json
    import urllib.error
    import urllib.request
    out = err = ""
    try:
        deadline = time.monotonic() + 30
        while "master pod" not in out and time.monotonic() < deadline:
            captured = capfd.readouterr()
            out, err = out + captured.out, err + captured.err
            found["out"], found["err"] = out, err
            time.sleep(0.1)
        found["master"] = next(line.split()[-1] for line in out.splitlines()
                               if line.startswith("master pod"))
        door = next(line.split()[-1] for line in err.splitlines()
                    if "through the API server: http" in line)
        with urllib.request.urlopen(door + "api/state", timeout=10) as page:
            found["state"] = json.load(page)
        with urllib.request.urlopen(door, timeout=10) as page:
            found["html"] = page.read().decode()
        with urllib.request.urlopen(door + "static/app.js", timeout=10) as page:
            found["script_type"] = page.headers["Content-Type"]
        try:  # a stream cannot be relayed whole: refused at once, the page polls instead
            urllib.request.urlopen(door + "api/events", timeout=10)
        except urllib.error.HTTPError as refused:
            found["events"] = refused.code
        kube.server.forbid("get", "pods/proxy")
        try:
            urllib.request.urlopen(door + "api/state", timeout=10)
        except urllib.error.HTTPError as denied:
            found["denied"] = (denied.code, denied.read())
    except Exception as exc:
        found["error"] = f"{exc!r}; out: {out}; err: {err}"
    finally:
        seen.touch()


# -- without a cluster ---------------------------------------------------------------------
def test_no_cluster_configuration_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setattr(config, "_overrides", dict(config._overrides))
    monkeypatch.setattr(config, "_resolved", None)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "FIBERLITE_KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    fiberlite.init(kubeconfig=None, image=IMAGE)
    ctx = fiberlite.get_context("kubernetes")
    with pytest.raises(BackendError, match="no Kubernetes cluster configuration.*set the kubeconfig "
                                           "setting.*or run fiberlite in a pod"):
        ctx.Process(target=jobs.noop).start()
    fiberlite.init(kubeconfig=str(tmp_path / "missing"))
    with pytest.raises(BackendError, match="kubeconfig .*missing .*does not exist"):
        ctx.Process(target=jobs.noop).start()


def test_listen_host(monkeypatch, kube):
    backend = get_backend("kubernetes")
    assert backend.listen_host() == "127.0.0.1"          # the setting wins
    fiberlite.init(listen_host=None)
    monkeypatch.setenv("FIBERLITE_POD_IP", "10.1.2.3")
    assert backend.listen_host() == "10.1.2.3"           # downward API
    monkeypatch.delenv("FIBERLITE_POD_IP")
    assert backend.listen_host() == "127.0.0.1"          # the address that routes to the API server


def test_names_labels_and_exit_codes():
    assert k8s_pods.label_value("Main Process/1") == "Main-Process-1"
    assert k8s_pods.label_value("-" + "x" * 80) == "x" * 62
    assert k8s_pods.dns_name("FL_Run.42--Job") == "fl-run-42-job"
    assert k8s_pods.cpu_quantity(2.0) == "2" and k8s_pods.cpu_quantity(0.25) == "250m"

    def pod(code, reason="Error", deleting=False, pod_reason=None):
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name="p", deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None),
            status=client.V1PodStatus(phase="Failed", reason=pod_reason, container_statuses=[
                client.V1ContainerStatus(name="job", image="i", image_id="", ready=False, restart_count=0,
                                         state=client.V1ContainerState(terminated=(
                                             client.V1ContainerStateTerminated(exit_code=code, reason=reason))))]))

    assert k8s_status.outcome(pod(137), False, None).exitcode == 137        # sys.exit(137)?
    assert k8s_status.outcome(pod(137, "OOMKilled"), False, None).exitcode == -9
    assert k8s_status.outcome(pod(143, deleting=True), True, None).exitcode == -15
    assert k8s_status.outcome(pod(143), False, signal.SIGTERM).exitcode == -15
    assert k8s_status.outcome(pod(137, pod_reason="Evicted"), False, None).exitcode == -9
    assert k8s_status.outcome(pod(2), False, None) == k8s_status.Outcome(2)


def test_cluster_run_example_on_kubernetes(kube, capfd):
    """examples/cluster_run.py as the master pod of a run, its Pool's workers pods."""
    from fiberlite.cli import main
    script = os.path.join(ROOT, "examples", "cluster_run.py")
    status = main(["run", "--backend", "kubernetes", "--kubeconfig", str(kube.kubeconfig_path),
                   "--namespace", NS, "--image", IMAGE,
                   "--env", f"FIBERLITE_KUBECONFIG={kube.kubeconfig_path}",
                   "--env", "PYTHONFAULTHANDLER=1", "--no-working-dir", script, "5"])  # a crash at exit shows where
    captured = capfd.readouterr()
    out = captured.out
    assert status == 0, out + captured.err
    assert "backend kubernetes: squares [0, 1, 4, 9, 16]" in out
    created = [r.body["metadata"]["name"] for r in posts(kube.server, "pods")]
    assert len(created) >= 3  # the master and its pool's two workers
