"""The docker backend on a real Docker engine: every job a container of ``fiberlite:test``.

Docker and the image are provisioned by ``ensure_docker()`` (tests/support/docker_env.py); when
that is impossible the tests fail with the reason, they never skip. Containers use host
networking (all traffic on loopback), except the named-network test, whose traffic stays
on this machine's ``fiberlite-test`` bridge.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import cloudpickle
import pytest

import fiberlite
import jobs
from docker_env import ensure_docker
from fiberlite import config
from fiberlite.runtime import identity
from fiberlite.backends import Job, JobSpec, get_backend
from fiberlite.backends.docker import spec as docker_spec
from fiberlite.backends.docker import ContainerJob, DockerBackend, clean, exit_code
from fiberlite.errors import BackendError
from paths import ROOT, SUPPORT
from interpreters import run_python, start_python

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

NETWORK = "fiberlite-test"

# The targets below travel by value; those of tests/support/jobs.py by reference, so the
# containers must import jobs.py from the mounted tests directory.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- targets ------------------------------------------------------------------------------------
def print_both(text):
    print(text)
    print(text + " on stderr", file=sys.stderr)


@fiberlite.meta(cpu=0.5, memory="256Mi")
def limited(q, go):
    limit = None
    for path in ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"):
        try:
            with open(path) as fh:
                limit = int(fh.read().strip())
            break
        except (OSError, ValueError):
            pass
    q.put({"cwd": os.getcwd(), "key": os.environ.get("FIBERLITE_AUTHKEY"), "limit": limit,
           "container": os.environ.get("FIBERLITE_DOCKER_CONTAINER")})
    go.get()


@fiberlite.meta(image="fiberlite-missing:nope")
def in_missing_image():
    pass


def report_container(q):
    q.put((os.environ.get("FIBERLITE_DOCKER_CONTAINER"), fiberlite.parent_process().name))


def nested(q):
    child = fiberlite.Process(target=report_container, args=(q,))
    child.start()
    child.join()
    q.put((os.environ.get("FIBERLITE_DOCKER_CONTAINER"), child.exitcode))


def slow_square(x):
    time.sleep(0.05)
    return x * x


def set_items(d, items):
    for key, value in items:
        d[key] = value


def print_wait_print(q, go):
    print("before the reader", flush=True)
    q.put("ready")
    go.get()
    print("after the reader", flush=True)


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image():
    return ensure_docker()  # RuntimeError with the reason when Docker cannot be provisioned


@pytest.fixture(scope="module")
def ctx(image):
    saved = dict(config._overrides)
    fiberlite.init(image=image)
    yield fiberlite.get_context("docker")
    config._overrides.clear()
    config._overrides.update(saved)
    config.init()


@pytest.fixture(scope="module")
def api(image):
    import docker
    client = docker.APIClient(version="auto")
    yield client
    client.close()


def container_gone(api, cid):
    import docker
    try:
        api.inspect_container(cid)
    except docker.errors.NotFound:
        return True
    return False


def run_containers(api, run_id):
    return api.containers(all=True, filters={"label": [f"fiberlite/run={run_id}"]})


# -- Process ------------------------------------------------------------------------------------
def test_exit_codes_output_traceback_and_removal(ctx, api, capfd):
    procs = [ctx.Process(target=jobs.noop), ctx.Process(target=jobs.exit_with, args=(3,)),
             ctx.Process(target=jobs.raise_value_error),
             ctx.Process(target=print_both, args=("hello from a container",))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 3, 1, 0]
    out, err = capfd.readouterr()
    assert "hello from a container\n" in out
    assert "hello from a container on stderr\n" in err
    assert f"Process {procs[2].name}:" in err and "Traceback" in err
    assert "ValueError: boom from the child" in err
    launch = procs[2]._popen
    assert "ValueError: boom from the child" in launch.backend.logs(launch.job)
    for p in procs:  # removed once joined
        assert container_gone(api, p._popen.job.id)


def test_labels_resources_mounts_and_environment(ctx, api, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    q, go = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=limited, args=(q, go))
    p.start()
    try:
        report = q.get(timeout=60)
        attrs = api.inspect_container(p._popen.job.id)
    finally:
        go.put("done")
        p.join(60)
    assert p.exitcode == 0 and isinstance(p.pid, int)
    name = attrs["Name"].lstrip("/")
    assert report["container"] == name
    labels = attrs["Config"]["Labels"]
    assert labels["fiberlite"] == "1"
    assert labels["fiberlite/run"] == identity.run_id()
    assert labels["fiberlite/job"] == name and name.startswith(f"fl-{identity.run_id()}-")
    assert labels["fiberlite/parent"] == "master"
    host = attrs["HostConfig"]
    assert host["NanoCpus"] == 500_000_000 and host["Memory"] == 256 * 2**20
    assert report["limit"] == 256 * 2**20  # enforced by the kernel, seen from inside
    assert host["NetworkMode"] == "host" and host["AutoRemove"] and host["Init"]
    mounts = {m["Destination"]: m for m in attrs["Mounts"]}
    assert mounts[str(tmp_path)]["RW"] and report["cwd"] == str(tmp_path)
    assert not mounts[ROOT]["RW"]  # sys.path: the checkout (holding tests/support/jobs.py), read-only
    assert "/var/run/docker.sock" in mounts
    assert not any(d.startswith(sys.prefix) for d in mounts)  # never Python's own directories
    assert report["key"] is None  # the key left the job's environment once read
    assert container_gone(api, p._popen.job.id)


def test_terminate_kill_and_join_timeout(ctx, waiting_jobs):
    a, b = waiting_jobs(2, ctx, timeout=60)
    start = time.monotonic()
    a.join(0.3)
    assert 0.25 < time.monotonic() - start < 5
    assert a.is_alive() and a.exitcode is None
    a.terminate()
    b.kill()
    a.join(30)
    b.join(30)
    assert (a.exitcode, b.exitcode) == (-signal.SIGTERM, -signal.SIGKILL)
    assert "SIGTERM" in repr(a) and not a.is_alive()


def test_a_container_job_sees_the_parents_argv_and_log_level(ctx):
    from fiberlite import util
    logger = util.get_logger()
    saved = logger.level
    q = ctx.Queue()
    try:
        logger.setLevel(util.INFO)
        job = ctx.Process(target=jobs.report_preparation, args=(q,))
        job.start()
        assert q.get(timeout=60) == (sys.argv, util.INFO)
        job.join(60)
        assert job.exitcode == 0
    finally:
        logger.setLevel(saved)


def test_queue_producer_consumer(ctx):
    q, out = ctx.Queue(), ctx.Queue()
    producer = ctx.Process(target=jobs.produce, args=(q, 0, 50))
    consumer = ctx.Process(target=jobs.consume, args=(q, out, None))
    producer.start()
    consumer.start()
    producer.join(60)
    q.put(None)
    assert out.get(timeout=60) == list(range(50))
    consumer.join(60)
    assert (producer.exitcode, consumer.exitcode) == (0, 0)


def test_pipe_echo(ctx):
    here, there = ctx.Pipe()
    p = ctx.Process(target=jobs.echo, args=(there,))
    p.start()
    there.close()
    for item in ("text", 42, {"nested": [1, 2]}, b"\x00" * 100_000):
        here.send(item)
        assert here.recv() == item
    here.close()  # the child sees EOF and ends
    p.join(60)
    assert p.exitcode == 0


def test_nested_child_is_a_container_of_its_own(ctx):
    q = ctx.Queue()
    p = ctx.Process(target=nested, args=(q,))
    p.start()
    grandchild, parent_name = q.get(timeout=60)
    child, code = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0 and code == 0
    assert child.startswith(f"fl-{identity.run_id()}-")
    assert grandchild.startswith(child + "-") and parent_name == p.name


# -- errors users see -------------------------------------------------------------------------------
def test_daemon_unreachable_is_one_clear_line(image, tmp_path):
    script = "import fiberlite, jobs\nfiberlite.Process(target=jobs.noop).start()\n"
    start = time.monotonic()
    proc = run_python("-c", script, cwd=tmp_path, timeout=60,
                      env={"DOCKER_HOST": "unix:///nonexistent.sock", "FIBERLITE_BACKEND": "docker",
                           "FIBERLITE_IMAGE": image})
    assert time.monotonic() - start < 10
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("fiberlite.errors.BackendError: cannot reach the Docker daemon at "
                    "unix:///nonexistent.sock: No such file or directory; start dockerd "
                    "(or Docker Desktop) or set DOCKER_HOST")
    docker_sdk_frames = re.findall(r'File "[^"]*(?<!/backends)/docker/', proc.stderr)
    assert not docker_sdk_frames and "During handling" not in proc.stderr


def test_missing_image_and_no_image(ctx, api):
    start = time.monotonic()
    with pytest.raises(BackendError) as info:
        ctx.Process(target=in_missing_image).start()
    assert time.monotonic() - start < 5
    assert str(info.value) == (
        "image 'fiberlite-missing:nope' is not present on this Docker host: build it with "
        "`docker build -t fiberlite-missing:nope .` (the project's Dockerfile), pull it, or set `image`")
    assert info.value.__suppress_context__
    assert not api.containers(all=True, filters={"ancestor": "fiberlite-missing:nope"})
    spec = JobSpec(command=["python", "-c", "pass"], name="fl-noimage", labels={"fiberlite/run": "noimage"})
    with pytest.raises(BackendError, match="no container image for job fl-noimage: set the image setting"):
        DockerBackend().create_job(spec)  # this test process does not run in a container


def test_missing_network_is_one_clear_line(ctx):
    fiberlite.init(docker_network="fiberlite-no-such-net")
    try:
        with pytest.raises(BackendError) as info:
            ctx.Process(target=jobs.noop).start()
    finally:
        fiberlite.init(docker_network="host")
    assert str(info.value) == (
        "Docker network 'fiberlite-no-such-net' does not exist on this Docker host: create it "
        "with `docker network create fiberlite-no-such-net`, or set docker_network=host")


# -- requests formed for the engine ----------------------------------------------------------------
def test_gpu_cpu_memory_and_volumes_reach_the_engine(image, api, tmp_path):
    (tmp_path / "data").mkdir()
    spec = JobSpec(command=["python", "-c", "pass"], name="fl-spec-check", cpu=1.5, memory=2**30, gpu=2,
                   volumes={str(tmp_path / "data"): "/data", "fiberlite-test-cache": "/cache"},
                   labels={"fiberlite/run": "speccheck"}, cwd=str(tmp_path))
    conf = docker_spec.build(spec, image, "host", {"mount_working_dir": True}, None, api.base_url,
                             path_entries=[ROOT, SUPPORT, "/usr/lib/python3.11", sys.prefix, ""])
    assert {m.target for m in conf.mounts} == {str(tmp_path), ROOT, "/data", "/cache",
                                               "/var/run/docker.sock"}
    created = api.create_container(**conf.create_kwargs(api))  # accepted, not started (no GPU here)
    try:
        host = api.inspect_container(created["Id"])["HostConfig"]
    finally:
        api.remove_container(created["Id"], force=True, v=True)
        api.remove_volume("fiberlite-test-cache", force=True)
    request, = host["DeviceRequests"]
    assert request["Count"] == 2 and request["Capabilities"] == [["gpu"]]
    assert host["NanoCpus"] == 1_500_000_000 and host["Memory"] == 2**30
    with pytest.raises(BackendError, match="the working directory is /usr/bin, a system directory"):
        docker_spec.build(spec, image, "host", {"working_dir": "/usr/bin"}, None, api.base_url)


# -- pool and manager -----------------------------------------------------------------------------
def test_pool_map_survives_a_killed_container(ctx):
    with ctx.Pool(2) as pool:
        assert pool.map(slow_square, range(4)) == [0, 1, 4, 9]  # both workers are up
        result = pool.map_async(slow_square, range(60), chunksize=1)
        victim = pool._pool[0]._popen.job.id
        subprocess.run(["docker", "kill", victim], check=True, capture_output=True, timeout=30)
        assert result.get(timeout=90) == [x * x for x in range(60)]
    pool.join()


def test_pool_packs_workers_into_containers(ctx):
    """With cpu=2 a container runs two workers, forked in it; a killed one loses nothing."""
    fiberlite.init(cpu=2)
    with ctx.Pool(4) as pool:
        assert pool._core.per_job == 2
        containers = [process._popen.job.id for process in pool._core.procs.values()]
        assert len(containers) == 2
        result = pool.map_async(slow_square, range(60), chunksize=1)
        subprocess.run(["docker", "kill", containers[0]], check=True, capture_output=True, timeout=30)
        assert result.get(timeout=90) == [x * x for x in range(60)]
        assert len(pool._pool) == 4  # pids inside containers: each container counts its own
    pool.join()


def test_manager_dict(ctx):
    with ctx.Manager() as manager:
        d = manager.dict()
        p = ctx.Process(target=set_items, args=(d, [("a", 1), ("b", [2, 3])]))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        assert dict(d) == {"a": 1, "b": [2, 3]}


# -- no container outlives its parent -------------------------------------------------------------
PARENT = textwrap.dedent("""
    import sys, fiberlite, jobs
    from fiberlite.runtime import identity
    if __name__ == "__main__":
        fiberlite.init(image=sys.argv[1])
        ctx = fiberlite.get_context("docker")
        q, r = ctx.Queue(), ctx.Queue()
        ctx.Process(target=jobs.start_child_then_wait, args=(q,)).start()  # a child with a child
        ctx.Process(target=jobs.wait_forever, args=(r,), daemon=True).start()
        q.get(timeout=60), r.get(timeout=60)
        print(identity.run_id(), flush=True)
        sys.stdin.read()
""")


def test_parent_sigkill_leaves_no_container(image, api, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = start_python(script, image, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    run_id = None
    try:
        run_id = parent.stdout.readline().strip()
        assert run_id, "the parent script did not start its jobs"
        containers = run_containers(api, run_id)
        assert len(containers) == 3  # child, grandchild, daemonic child
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        start = time.monotonic()
        for c in containers:
            try:
                api.wait(c["Id"], timeout=15, condition="removed")
            except Exception as exc:
                if getattr(exc, "status_code", None) != 404:  # 404: removed already
                    raise
        assert time.monotonic() - start < 15
        assert run_containers(api, run_id) == []
    finally:
        parent.kill()
        if run_id:
            clean(run_id)


# -- a named Docker network ---------------------------------------------------------------------
NETWORKED = textwrap.dedent("""
    import json, os, sys, fiberlite, jobs, psutil
    from fiberlite.runtime.hub import get_hub

    def bound():  # the local addresses this process's hub listens on
        port = int(get_hub().address.rsplit(":", 1)[1])
        return sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="tcp")
                       if c.status == psutil.CONN_LISTEN and c.laddr.port == port})

    def where(q):
        child = fiberlite.Process(target=jobs.put_value, args=(q, "from the grandchild"))
        child.start()
        child.join()
        q.put((get_hub().address, child.exitcode, bound()))

    if __name__ == "__main__":
        q = fiberlite.Queue()
        p = fiberlite.Process(target=where, args=(q,))
        p.start()
        value = q.get(timeout=60)
        child_hub, code, child_bound = q.get(timeout=60)
        p.join(60)
        print(json.dumps({"parent_hub": get_hub().address, "child_hub": child_hub,
                          "parent_bound": bound(), "child_bound": child_bound,
                          "value": value, "codes": [p.exitcode, code]}), flush=True)
""")


def test_named_network(image, api, tmp_path):
    import docker
    created = False
    try:
        network = api.inspect_network(NETWORK)
    except docker.errors.NotFound:
        api.create_network(NETWORK, driver="bridge")
        network, created = api.inspect_network(NETWORK), True
    gateway = network["IPAM"]["Config"][0]["Gateway"]
    script = tmp_path / "networked.py"
    script.write_text(NETWORKED)
    try:
        proc = run_python(script, cwd=tmp_path, timeout=90,
                          env={"FIBERLITE_BACKEND": "docker", "FIBERLITE_IMAGE": image,
                               "FIBERLITE_DOCKER_NETWORK": NETWORK})
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        if created:
            api.remove_network(NETWORK)
    assert result["parent_hub"].startswith(f"tcp://{gateway}:")  # the host, as the network sees it
    child_ip = result["child_hub"].split("//")[1].rsplit(":", 1)[0]
    assert child_ip != gateway and child_ip.rsplit(".", 1)[0] == gateway.rsplit(".", 1)[0]
    # each hub listens on the address it gave out, not on every interface
    assert result["parent_bound"] == [gateway] and result["child_bound"] == [child_ip]
    assert result["value"] == "from the grandchild" and result["codes"] == [0, 0]


# -- what the command line uses -----------------------------------------------------------------
def test_list_stream_logs_and_clean(ctx, api, capfd):
    backend = get_backend("docker")
    q, go = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=print_wait_print, args=(q, go))
    p.start()
    assert q.get(timeout=60) == "ready"
    name = p._popen.job.handle.name
    assert (name, identity.run_id(), "running") in backend.list_jobs(identity.run_id())
    chunks = backend.stream_logs(name, follow=True)  # the reader takes the output over
    go.put("go")
    text = "".join(chunks)
    p.join(60)
    assert p.exitcode == 0
    out = capfd.readouterr().out
    # every line once: on the terminal until the reader came, then to the reader only
    assert (out + text).count("before the reader\n") == 1
    assert text.count("after the reader\n") == 1 and "after the reader" not in out

    other = DockerBackend()  # a job this backend instance did not start
    job = other.create_job(JobSpec(
        command=["python", "-c", "print('left behind', flush=True); import time; time.sleep(60)"],
        name="fl-cleantest-1", image=ctx_image(), labels={"fiberlite/run": "cleantest",
                                                          "fiberlite/job": "fl-cleantest-1"}))
    text = ""
    for chunk in backend.stream_logs("fl-cleantest-1", follow=True):
        text += chunk
        if "left behind" in text:
            break
    assert "left behind" in "".join(backend.stream_logs("fl-cleantest-1"))
    with pytest.raises(LookupError):
        backend.stream_logs("fl-no-such-job")
    assert clean("cleantest") == 1
    assert other.wait(job, 30) == -signal.SIGKILL
    assert run_containers(api, "cleantest") == []
    other.close()


def ctx_image():
    return config.get("image")


# -- the event cache --------------------------------------------------------------------------
def test_exit_statuses_and_events_settle_jobs():
    assert [exit_code(s) for s in (0, 1, 3, 127, 128, 137, 143, 255)] == [0, 1, 3, 127, 128, -9, -15, 255]
    backend = DockerBackend()  # no engine needed: events are fed by hand
    died, vanished = ContainerJob("a" * 64, "fl-x-1"), ContainerJob("b" * 64, "fl-x-2")
    backend._jobs.update({died.id: died, vanished.id: vanished})
    handles = [Job(backend, j.id, JobSpec(command=[]), handle=j) for j in (died, vanished)]
    assert backend.wait(handles[0], 0) is None and backend.status(handles[0]).value == "running"
    backend._on_event({"Action": "oom", "Actor": {"ID": died.id}})
    backend._on_event({"Action": "die", "Actor": {"ID": died.id, "Attributes": {"exitCode": "137"}}})
    backend._on_event({"Action": "destroy", "Actor": {"ID": vanished.id}})  # its die was never seen
    backend._on_event({"Action": "die", "Actor": {"ID": "c" * 64, "Attributes": {"exitCode": "0"}}})
    assert [backend.wait(j, 1) for j in handles] == [-9, -9]
    assert died.oom and vanished.gone and backend.status(handles[1]).value == "exited"


# -- the Ring on containers -----------------------------------------------------------------------
def ring_battery(ring):
    import numpy as np
    small = np.arange(10, dtype=np.float64) * (ring.rank + 1)
    big = np.arange(300_000, dtype=np.float32) + ring.rank
    return (ring.all_reduce(small), ring.all_reduce(big, op="max"), ring.all_reduce(big, op="mean"),
            ring.broadcast({"from": ring.rank}, src=1), ring.all_gather(ring.rank),
            ring.reduce_scatter(big))


def ring_member_dies(ring):
    import numpy as np
    from fiberlite.errors import RingError
    if ring.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        ring.all_reduce(np.ones(1000))
    except RingError as exc:
        return str(exc)
    return "no error"


def test_ring_collectives_on_containers(ctx):
    import numpy as np
    results = ctx.Ring(2, ring_battery, timeout=90).run()
    big = [np.arange(300_000, dtype=np.float32) + r for r in range(2)]
    for rank, (small, top, mean, bcast, gathered, shard) in enumerate(results):
        np.testing.assert_array_equal(small, np.arange(10, dtype=np.float64) * 3)
        np.testing.assert_array_equal(top, big[1])
        np.testing.assert_allclose(mean, (big[0] + big[1]) / 2)
        assert bcast == {"from": 1} and gathered == [0, 1]
        np.testing.assert_array_equal(shard, np.array_split(big[0] + big[1], 2)[rank])


def test_ring_member_container_killed_others_raise(ctx):
    from fiberlite.errors import RingError
    ring = ctx.Ring(2, ring_member_dies, timeout=60)
    ring.start()
    with pytest.raises(RingError) as info:
        ring.join()
    assert info.value.rank == 1
    assert "rank 1" in str(info.value)


# -- queues and pipes with several writers -------------------------------------------------------
@pytest.mark.parametrize("kind", ["Pipe", "SimpleQueue", "Queue"])
def test_sends_of_several_containers_arrive_in_the_order_they_returned(ctx, kind):
    """Containers take a ticket and send it under one lock: the parent reads the tickets
    in order, and a Queue's consumers in containers get every item once."""
    import pattern_jobs
    got = pattern_jobs.ticketed_run(ctx, kind, 3, 200)
    assert got == list(range(1, 601))


def test_queue_consumers_in_containers_get_every_item_once(ctx):
    import pattern_jobs
    q, out = ctx.JoinableQueue(), ctx.Queue()
    consumers = [ctx.Process(target=pattern_jobs.get_until_none, args=(q, out, True)) for _ in range(3)]
    for p in consumers:
        p.start()
    for i in range(600):
        q.put((0, i))
    for _ in consumers:
        q.put(None)
    q.join()
    parts = [out.get(timeout=120) for _ in consumers]
    for p in consumers:
        p.join(120)
    assert sorted(i for part in parts for _, i in part) == list(range(600))
