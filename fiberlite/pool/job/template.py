"""The fork template of a pool host, with a socket to the host to talk over.

A host job (:mod:`.host`) has one before it needs any worker: forked by the job's
bootstrap as it starts (:mod:`.early`), or started by the host as a program of its own.
The template imports once what a worker needs, then forks a worker each time the host
asks: a worker costs a fork, not an interpreter start (the idea of ``multiprocessing``'s
forkserver). It forks only where that is safe: one Python thread and no nng socket (nng
runs threads of its own), which is why it is a process of its own and not the host.

The host and the template talk over one ``SOCK_SEQPACKET`` socket, a pickled tuple a
message::

    host -> template   ("prep", preparation, key, run_id,    first, once; environ: the
                        environ)                             host's os.environ
                       ("fork", wid)
    template -> host   ("forked", wid, pid)                  with the host's end of the
                                                             worker's socket
                       ("failed", wid, reason)               the fork itself failed
                       ("exited", wid, exitcode)             negative: killed by a signal

The template ends when the host does (end of its stream), killing the workers that are
still alive: a pool's workers never outlive their host.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import sys
import threading
from typing import NoReturn

from ...wire import unix

MAX_MESSAGE = 1 << 20  # bytes of one control message (a preparation is the largest)
# set by the host for the template's start only: fiberlite then imports what a job
# imports (not asyncio, which pynng would pull in), and the workers do not inherit it
JOB_MARK = "FIBERLITE_JOB"


def main() -> None:
    """The template started as a program of its own, its socket's descriptor in argv."""
    os.environ.pop(JOB_MARK, None)
    control = unix.adopt(int(sys.argv[1]))
    run(control)


def run(control: socket.socket) -> None:
    """Wait for the host's preparation on ``control``, then fork workers as it asks."""
    # Ctrl-C reaches the whole process group: the template ends when its host does
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        first = control.recv(MAX_MESSAGE)
    except OSError:
        first = b""
    if not first:
        return  # the host ended (a pool stopped as it started): nothing to do, nothing to say
    _, preparation, key, run_id, environ = pickle.loads(first)
    os.environ.clear()
    os.environ.update(environ)
    from ...runtime import identity
    from ...runtime.prepare import prepare
    identity.adopt(key, run_id)
    prepare(preparation)
    from . import worker  # noqa: F401  (imported once here, inherited by every fork)
    _serve(control)


def _serve(control: socket.socket) -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, int] = {}  # pid -> wid
    try:
        while True:
            ready, _, _ = select.select([control, wake_r], [], [])
            if wake_r in ready:
                _drain(wake_r)
                _reap(control, children)
            if control in ready:
                try:
                    data = control.recv(MAX_MESSAGE)
                except ConnectionResetError:
                    data = b""  # the host was killed with messages unread
                if not data:
                    return  # the host is gone
                kind, wid = pickle.loads(data)
                if kind == "fork":
                    _fork(control, wid, children, (wake_r, wake_w))
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _reap(control: socket.socket, children: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        wid = children.pop(pid, None)
        if wid is not None:
            _tell(control, ("exited", wid, os.waitstatus_to_exitcode(status)))


def _tell(control: socket.socket, message: tuple, fds: list[int] | None = None) -> None:
    try:
        unix.send_fds(control, pickle.dumps(message), fds or [])
    except (BrokenPipeError, ConnectionResetError):
        pass  # the host is gone; the loop sees it next
    except OSError as exc:  # the host would wait for this message forever: say so
        sys.stderr.write(f"fiberlite fork template: cannot tell the host {message!r}: {exc}\n")


def _fork(control: socket.socket, wid: int, children: dict[int, int],
          own_fds: tuple[int, int]) -> None:
    if threading.active_count() != 1:  # never: the template starts no thread
        _tell(control, ("failed", wid, "the fork template has threads; refusing to fork"))
        return
    host_end, worker_end = unix.pair()
    try:
        pid = os.fork()
    except OSError as exc:
        host_end.close()
        worker_end.close()
        _tell(control, ("failed", wid, f"fork failed: {exc}"))
        return
    if pid == 0:
        host_end.close()
        control.close()
        _become_worker(worker_end, wid, own_fds)
    worker_end.close()
    children[pid] = wid
    _tell(control, ("forked", wid, pid), [host_end.fileno()])
    host_end.close()


def _become_worker(sock: socket.socket, wid: int, own_fds: tuple[int, int]) -> NoReturn:
    """In the forked child: drop the template's state, then run one pool worker."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in own_fds:
        os.close(fd)
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # each worker draws its own random numbers, as after a spawn
        numpy.random.seed()
    code = 1
    try:
        code = run_worker(sock, wid)
    finally:
        os._exit(code)


def run_worker(sock: socket.socket, wid: int) -> int:
    """Run pool worker ``wid`` on ``sock`` (its host's first message says how); return its
    exit code."""
    import cloudpickle

    from ...process import ParentProcess, Process
    from ...wire.frames import FrameSocket
    from .upstream import HostUpstream, NearbyUpstream
    from .worker import worker_main
    conn = FrameSocket(sock.detach())
    initializer, initargs, maxtasks, host_name, host_pid, nearby = \
        cloudpickle.loads(conn.recv_bytes())
    host = HostUpstream(conn)
    upstream = host if nearby is None else NearbyUpstream(host, *nearby, presents=False)
    process = Process(target=worker_main, name=f"PoolWorker-{wid}", daemon=True,
                      args=(upstream, wid, initializer, initargs, maxtasks))
    parent = ParentProcess(host_name, host_pid, host.lost)
    return process._bootstrap(parent)
