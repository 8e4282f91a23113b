"""Parent side of a job's life: pickle the Process, create the job, hand the Process
over when the job dials back, and report its exit code.

    parent                                       job (python -m fiberlite.runtime.bootstrap)
    Launch: register JobChannel, create job  ->  dial hub, authenticate
                                              <-  fetch
    reply (preparation, pickled Process)     ->  prepare, run, report exit code
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable

from .. import config, util
from . import exit_order, identity
from ..backends import JobSpec, close_all, get_backend
from .handles import expire_exports, exports_for_job
from .hub import Servant, get_hub, unregister
from .launch_options import FORK_TEMPLATE
from .tree.offer import offer_for
from ..meta import requests_of
from ..wire.codec import Payload, name_unpicklable, unpicklable_error

# "python" is the job's own interpreter: the local backend runs sys.executable, container
# backends the image's python
BOOTSTRAP = ["python", "-m", "fiberlite.runtime.bootstrap"]

log = logging.getLogger(__name__)


class JobChannel(Servant):
    """The parent's end of one job: hands over the Process once, records its exit code;
    its watcher is told when the job's connection ends (the job exited or is exiting).
    ``on_silent()`` is called when the job's connection is given up because the job
    stayed silent for ``peer_timeout`` (it must not block)."""

    def __init__(self, preparation: Payload, process: Payload, exports: list) -> None:
        self._parts: tuple | None = (preparation, process)
        self._exports = exports  # pipe ends pickled with the Process
        self.peer: int | None = None
        self.reported: int | None = None
        self.connected = threading.Event()
        self.lost = threading.Event()
        self.on_silent: Callable[[], None] | None = None

    def op_fetch(self, request) -> None:
        if self._parts is None:
            request.fail(RuntimeError("this job was already started"))
            return
        parts, self._parts = self._parts, None
        self.peer = request.peer
        self.connected.set()
        request.reply(parts)

    def op_exit(self, request, exitcode: int) -> None:
        self.reported = exitcode
        request.reply()

    def peer_lost(self, peer: int) -> None:
        if peer == self.peer:
            self.lost.set()
            self.release_exports()
            self.tell_watcher()

    def peer_silent(self, peer: int) -> None:
        if peer == self.peer and self.on_silent is not None:
            self.on_silent()

    def release_exports(self) -> None:
        """The job has ended: pipe ends it never unpickled no longer hold their pipe open."""
        exports, self._exports = self._exports, []
        if exports:
            expire_exports(exports)


def describe_unpicklable(process: Any) -> str:
    """Name the part of a Process that cannot be pickled."""
    parts = [("target", getattr(process, "_target", None))]
    parts += [(f"argument {i}", a) for i, a in enumerate(getattr(process, "_args", ()))]
    parts += [(f"keyword argument {k!r}", v) for k, v in getattr(process, "_kwargs", {}).items()]
    return (name_unpicklable(parts)
            or f"the Process object {process!r} (an attribute of your subclass?)")


def pack_process(process: Any) -> Payload:
    try:
        return Payload.pack(process)
    except Exception as exc:
        culprit = describe_unpicklable(process)
        message = (f"cannot start {process.name}: {culprit} cannot be pickled ({exc}). "
                   "The target, its arguments and the Process are sent to the new job; "
                   "pass picklable objects, or create this one inside the target.")
        raise unpicklable_error(exc, message) from exc


def preparation(parent_name: str, tree: dict | None = None) -> dict[str, Any]:
    """What the job needs before it can unpickle the Process (``tree``: the working
    directory it fetches first, see :mod:`.tree.offer`)."""
    main = sys.modules.get("__main__")
    return {
        "tree": tree,
        "sys_path": list(sys.path),
        "sys_argv": list(sys.argv),
        "cwd": os.getcwd(),
        "settings": config.settings(),
        # the job's logger starts at this logger's level and prints on stderr if this one
        # does, as multiprocessing's does
        "log_level": util.get_logger().getEffectiveLevel(),
        "log_to_stderr": util.logs_to_stderr(),
        "parent_name": parent_name,
        "parent_pid": os.getpid(),
        "main_path": getattr(main, "__file__", None),
        "main_name": getattr(getattr(main, "__spec__", None), "name", None),  # python -m
        "run_id": identity.run_id(),
    }


def job_spec(process: Any, backend_name: str, hub_address: str, oid: int) -> JobSpec:
    settings = config.settings()
    target = getattr(process, "_target", None)
    wants = requests_of(target, type(process))
    run = identity.run_id()
    parent = os.environ.get("FIBERLITE_JOB_NAME", "master")
    name = f"fl-{run}-{'-'.join(str(i) for i in process._identity)}"
    env = {"FIBERLITE_HUB": hub_address, "FIBERLITE_JOB": str(oid),
           "FIBERLITE_RUN_ID": run, "FIBERLITE_JOB_NAME": name,
           "FIBERLITE_BACKEND": backend_name, "PYTHONUNBUFFERED": "1"}
    if process.launch_options.forks_template:
        env[FORK_TEMPLATE] = "1"
    return JobSpec(
        command=list(BOOTSTRAP),
        name=name,
        image=wants.get("image") or settings.get("image"),
        env=env,
        secret_env=identity.key_env(),
        cpu=wants.get("cpu", settings.get("cpu")),
        memory=wants.get("memory", settings.get("memory")),
        gpu=wants.get("gpu", settings.get("gpu")),
        labels={"fiberlite/run": run, "fiberlite/job": name, "fiberlite/parent": parent},
        cwd=os.getcwd(),
        waits_for_capacity=process.launch_options.waits_for_capacity,
        workers=process.launch_options.workers,
    )


_watchers: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


def join_watchers(timeout: float) -> None:
    """Wait (up to ``timeout`` seconds in all) for the sentinel threads, once every job
    has ended (at exit): a daemon thread still talking to the backend (removing its
    job's container or pod) when the interpreter is torn down aborts the process."""
    deadline = time.monotonic() + timeout
    for watcher in list(_watchers):
        watcher.join(max(0.0, deadline - time.monotonic()))


WATCHER_JOIN_SECONDS = 15.0  # sentinel threads finishing their job's clean-up at exit
exit_order.at_exit("watchers", lambda: join_watchers(WATCHER_JOIN_SECONDS))
exit_order.at_exit("backends", close_all)


class Launch:
    """A started job (``multiprocessing``'s ``Popen`` counterpart); ``parent_name`` is
    what ``parent_process().name`` gives in the job."""

    def __init__(self, process: Any, parent_name: str) -> None:
        backend_name = process.launch_options.backend_name()
        self.backend = get_backend(backend_name)
        self.backend.preflight()
        tree = offer_for(self.backend, backend_name)  # a tree over the limit fails here
        hub = get_hub(backend_name)
        with exports_for_job() as exports:
            try:
                process_payload = pack_process(process)
                self.channel = JobChannel(Payload.pack(preparation(parent_name, tree)),
                                          process_payload, exports)
                self.ref = hub.register(self.channel)
                spec = job_spec(process, backend_name, hub.address, self.ref.oid)
                if tree is not None:
                    spec.cwd = None  # made by the job, in its copy of the tree
                self.job = self.backend.create_job(spec)
            except BaseException:
                expire_exports(exports)  # no job will use what was pickled for it
                raise
        self.pid = self.job.pid
        self.name = process.name
        self.returncode: int | None = None
        self._sentinel: int | None = None
        self._lock = threading.Lock()
        self.channel.on_silent = self._given_up

    def _given_up(self) -> None:
        """The job stayed silent for ``peer_timeout``: it is lost for the run (what it
        held is given back as its connection ends) and is killed through the backend,
        so that it cannot come back; if it does before the kill lands, it finds its
        connection closed and exits (see :func:`fiberlite.runtime.dialed.fence`)."""
        log.warning("%s answered nothing for %g s: it is lost, and killed", self.name,
                    config.get("peer_timeout"))
        threading.Thread(target=self._kill_lost, name="fiberlite-kill-lost", daemon=True).start()

    def _kill_lost(self) -> None:
        try:
            self.backend.terminate(self.job, force=True)
        except Exception as exc:   # the backend cannot reach it either: it fences itself
            log.warning("could not kill the lost job %s: %s", self.name, exc)

    def _finish(self, code: int) -> int:
        with self._lock:
            if self.returncode is None:
                reported = self.channel.reported  # exact even where a backend only sees 128+N
                self.returncode = reported if reported is not None else code
                unregister(self.ref.oid)
                self.channel.release_exports()
                try:
                    self.backend.cleanup(self.job)
                except Exception:
                    pass
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        code = self.backend.wait(self.job, 0)
        return None if code is None else self._finish(code)

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        code = self.backend.wait(self.job, timeout)
        return None if code is None else self._finish(code)

    def terminate(self, force: bool) -> None:
        if self.poll() is None:
            self.backend.terminate(self.job, force=force)

    def sentinel(self) -> int:
        if self._sentinel is None:
            fd = self.backend.sentinel(self.job)
            if fd is None:
                fd = self._watcher_fd()
            self._sentinel = fd
            self._release = weakref.finalize(self, _close_fd, fd)  # close() or collected
            # not at exit: weakref's exit hook runs before fiberlite's exit stages, and a
            # wait on the fd of a job still running (a pool's supervisor) would then see a
            # closed fd as ready and join that job for good (the OS closes it at the end)
            self._release.atexit = False
        return self._sentinel

    def _watcher_fd(self) -> int:
        """A pipe whose read end becomes readable (EOF) when the job ends."""
        read_fd, write_fd = os.pipe()

        def watch() -> None:
            try:
                self.wait()
            finally:
                os.close(write_fd)

        watcher = threading.Thread(target=watch, name="fiberlite-sentinel", daemon=True)
        _watchers.add(watcher)
        watcher.start()
        return read_fd

    def close(self) -> None:
        if self._sentinel is not None:
            self._release()
            self._sentinel = None


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
