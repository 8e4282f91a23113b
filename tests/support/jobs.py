"""Targets for jobs started by the tests: a small module children import quickly."""
from __future__ import annotations

import os
import signal
import sys
import time

import fiberlite


def load_script(path, text: str) -> dict:
    """Run ``text`` as the file ``path`` in a module nobody can import: its functions
    are pickled by value, as those of a user's ``__main__``."""
    path.write_text(text)
    namespace = {"__name__": "a_script_nobody_can_import"}
    exec(compile(text, str(path), "exec"), namespace)
    return namespace


def noop() -> None:
    pass


def put_value(q, value) -> None:
    q.put(value)


def exit_with(code) -> None:
    sys.exit(code)


def raise_value_error() -> None:
    raise ValueError("boom from the child")


def hard_exit(code: int) -> None:
    os._exit(code)


def wait_forever(ready=None) -> None:
    if ready is not None:
        ready.put(os.getpid())
    while True:
        time.sleep(1)


def report_identity(q) -> None:
    me = fiberlite.current_process()
    parent = fiberlite.parent_process()
    q.put((me.name, me.pid, me.daemon, parent.name if parent else None, parent.pid if parent else None,
           os.getcwd(), os.environ.get("FIBERLITE_AUTHKEY")))


def report_launch_options(q) -> None:
    q.put(fiberlite.current_process().launch_options)


def report_preparation(q) -> None:
    """What a job received of its parent besides the Process: argv and the logger's level."""
    from fiberlite import util
    q.put((sys.argv, util.get_logger().getEffectiveLevel()))


def produce(q, start: int, count: int) -> None:
    for i in range(start, start + count):
        q.put(i)


def put_slowly(q, count: int, stops: int) -> None:
    """Put ``count`` ints a fraction of a millisecond apart (readers wait for each), then
    ``stops`` times None."""
    for i in range(count):
        q.put(i)
        time.sleep(0.0005)
    for _ in range(stops):
        q.put(None)


def consume(q, out, sentinel=None) -> None:
    total = []
    while True:
        item = q.get()
        if item == sentinel:
            break
        total.append(item)
    out.put(total)


def work_joinable(q) -> None:
    while True:
        item = q.get()
        q.task_done()
        if item is None:
            break


def echo(conn) -> None:
    while True:
        try:
            item = conn.recv()
        except EOFError:
            break
        conn.send(item)
    conn.close()


def send_then_close(conn, items) -> None:
    for item in items:
        conn.send(item)
    conn.close()


def send_bytes(conn, data: bytes) -> None:
    conn.send_bytes(data)


def spawn_grandchild(q) -> None:
    p = fiberlite.Process(target=wait_forever, args=(q,))
    p.start()
    q.put(os.getpid())
    p.join()


def start_child_then_wait(q) -> None:
    """Start a child that waits forever, report both pids, then wait."""
    p = fiberlite.Process(target=wait_forever)
    p.start()
    q.put((os.getpid(), p.pid))
    p.join()


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def array_roundtrip(q_in, q_out) -> None:
    arr = q_in.get()
    arr *= 2  # arrays received are writable, as with multiprocessing
    q_out.put(arr)


class Counter(fiberlite.Process):
    """A Process subclass overriding run()."""

    def __init__(self, q, n):
        super().__init__()
        self.q = q
        self.n = n

    def run(self):
        self.q.put(sum(range(self.n)))


def send_when_told(go, conn, item) -> None:
    """Wait for a message on ``go``, then send ``item`` on ``conn``."""
    go.recv()
    conn.send(item)


def wait_for_connections(conns, out) -> None:
    """Report which of ``conns`` (by index) fiberlite.connection.wait finds ready."""
    from fiberlite.connection import wait
    ready = wait(conns, timeout=30)
    out.put(sorted(conns.index(c) for c in ready))


def _refuse_to_load() -> None:
    raise RuntimeError("this argument cannot be loaded in the job")


class LoadsBadly:
    """An argument that pickles fine but fails to unpickle in the job."""

    def __reduce__(self):
        return (_refuse_to_load, ())


def take_args(*args) -> None:
    pass


def report_sum(source, out) -> None:
    """Receive one numpy array or bytes-like object from ``source`` (a Connection or a
    Queue) and put its byte sum on ``out``."""
    item = source.recv() if hasattr(source, "recv") else source.get()
    out.put(sum(memoryview(item).cast("B")))


def use_after_go(go, q, out) -> None:
    """When told on ``go``, round-trip a value through ``q`` and report it on ``out``."""
    go.recv()
    q.put("through q")
    out.put(q.get())


def report_machine_id(q) -> None:
    from fiberlite.runtime.machine import machine_id
    q.put(machine_id())


def report_key_exposure(q, go=None) -> None:
    """Where this job could still find the run's key: its start environment
    (/proc/self/environ), os.environ, the descriptors it holds, the secrets file."""
    with open("/proc/self/environ", "rb") as fh:
        start_environ = fh.read().decode(errors="replace")
    pipes = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if int(fd) > 2 and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                pipes.append(int(fd))
        except OSError:
            pass
    q.put({"start_environ": start_environ, "environ": dict(os.environ), "pipes": pipes,
           "secrets_file": os.path.exists("/.fiberlite-secrets/secrets"),
           "container": os.environ.get("FIBERLITE_DOCKER_CONTAINER")})
    if go is not None:
        go.get()


def report_parent(q) -> None:
    """Report this job's parent as both APIs see it; once the parent is gone, report
    again, with what its sentinel and ``is_alive`` say then."""
    import multiprocessing
    from multiprocessing.connection import wait
    parent = fiberlite.parent_process()
    q.put((parent.pid, parent.name, multiprocessing.parent_process() is parent,
           wait([parent.sentinel], timeout=0), parent.is_alive()))
    ready = wait([parent.sentinel], timeout=60)
    q.put((ready == [parent.sentinel], parent.is_alive()))


def start_reporting_child(q) -> None:
    """Start a child that reports its parent (this job), then wait to be ended."""
    fiberlite.Process(target=report_parent, args=(q,)).start()
    q.put(("middle", os.getpid(), fiberlite.current_process().name))
    time.sleep(600)


def slow_square(x: int, seconds: float = 0.02) -> tuple[int, int]:
    """``(x, x * x)`` after ``seconds``: a map long enough to kill a worker in."""
    time.sleep(seconds)
    return x, x * x


# -- tasks of the executors and the other libraries' backends -------------------------------------
class TaskError(Exception):
    """Raised by :func:`fail_on`: a class the caller can catch by name."""


def square(x):
    return x * x


def add(a, b=0):
    return a + b


def fail_on(x, bad=3):
    if x == bad:
        raise TaskError(f"bad item {x}")  # the remote line
    return x


def worker_name(_=None) -> str:
    """The name of the process a task ran in (``PoolWorker-N`` in a pool's worker)."""
    return fiberlite.current_process().name
