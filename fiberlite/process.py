"""``Process``: the ``multiprocessing.Process`` API, where ``start()`` creates a job on
a backend instead of forking. The behaviour mirrors CPython's
``multiprocessing.process.BaseProcess``; the job itself is handled by
:mod:`fiberlite.runtime.launcher`."""
from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable, Iterable, Mapping

from . import observe
from .runtime import exit_order, identity, main_script
from .runtime.launch_options import LaunchOptions
from .runtime.exit_codes import exit_name

_children: set["Process"] = set()


class _MainProcess:
    """What ``current_process()`` returns in the process that started the run."""

    _identity: tuple = ()
    _parent_pid = None
    daemon = False
    _daemonic = False

    def __init__(self) -> None:
        self._name = "MainProcess"
        self._authkey: bytes | None = None

    name = property(lambda self: self._name, lambda self, v: setattr(self, "_name", str(v)))
    pid = ident = property(lambda self: os.getpid())
    exitcode = None

    @property
    def authkey(self) -> bytes:
        return self._authkey or identity.key()

    @authkey.setter
    def authkey(self, value: bytes) -> None:
        self._authkey = bytes(value)

    def is_alive(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<_MainProcess name={self._name!r} parent=None started>"


class ParentProcess:
    """What ``parent_process()`` returns in a job: the process that created it, alive
    until ``lost`` is set (the job's connection to it ended)."""

    def __init__(self, name: str, pid: int | None, lost: threading.Event) -> None:
        self.name = name
        self.pid = self.ident = pid
        self._lost = lost
        self._sentinel: int | None = None
        self._sentinel_lock = threading.Lock()
        self.daemon = False
        self.exitcode = None

    def is_alive(self) -> bool:
        return not self._lost.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._lost.wait(timeout)

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes ready (end of file) once the parent is gone."""
        with self._sentinel_lock:
            if self._sentinel is None:
                self._sentinel, write = os.pipe()
                threading.Thread(target=self._close_when_gone, args=(write,), daemon=True,
                                 name="fiberlite-parent-sentinel").start()
            return self._sentinel

    def _close_when_gone(self, write: int) -> None:
        self._lost.wait()
        os.close(write)

    def __repr__(self) -> str:
        return f"<ParentProcess name={self.name!r} parent_pid={self.pid}>"


_current: Any = _MainProcess()
_parent: ParentProcess | None = None


def current_process() -> Any:
    """The Process object of the calling job (``MainProcess`` at the top of the run)."""
    return _current


def parent_process() -> ParentProcess | None:
    """The job that created this one, or None at the top of the run."""
    return _parent


def active_children() -> list["Process"]:
    """Started children of this process that are still running (finished ones are reaped)."""
    _reap()
    return list(_children)


def _reap() -> None:
    for child in list(_children):
        launch = child._popen
        if launch is not None and launch.poll() is not None:
            _children.discard(child)


class Process:
    """A job running ``target(*args, **kwargs)``, with ``multiprocessing.Process``'s API."""

    # the job's backend (bound by a context's class), and what a pool says of its jobs
    launch_options: LaunchOptions = LaunchOptions()

    def __init__(self, group: None = None, target: Callable[..., Any] | None = None,
                 name: str | None = None, args: Iterable[Any] = (),
                 kwargs: Mapping[str, Any] | None = None, *, daemon: bool | None = None) -> None:
        assert group is None, "group argument must be None for now"
        count = next(identity.child_counter)
        self._identity = tuple(current_process()._identity) + (count,)
        self._parent_pid = os.getpid()
        self._parent_name = current_process().name
        self._popen: Any = None
        self._closed = False
        self._target = target
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self._name = name or type(self).__name__ + "-" + ":".join(str(i) for i in self._identity)
        self._authkey: bytes | None = current_process()._authkey  # the creator's, as the stdlib
        self._daemonic = bool(daemon) if daemon is not None else bool(current_process().daemon)

    # -- what runs in the job -----------------------------------------------------------
    def run(self) -> None:
        """Override in a subclass, or pass ``target``."""
        if self._target:
            self._target(*self._args, **self._kwargs)

    # -- control from the parent ----------------------------------------------------------
    def start(self) -> None:
        """Create the job that runs :meth:`run`."""
        self._check_closed()
        assert self._popen is None, "cannot start a process twice"
        assert self._parent_pid == os.getpid(), "can only start a process object created by current process"
        assert not current_process().daemon, "daemonic processes are not allowed to have children"
        _reap()
        main_script.check_not_running()
        from .runtime.launcher import Launch
        self._popen = Launch(self, current_process().name)
        # the job has its own copy; drop ours so the target can be collected (as multiprocessing does)
        del self._target, self._args, self._kwargs
        _children.add(self)
        observe.notice("process", self)

    def terminate(self) -> None:
        """Send SIGTERM to the job (its exit code becomes ``-15``)."""
        self._check_closed()
        if self._popen is not None:
            self._popen.terminate(force=False)

    def kill(self) -> None:
        """Send SIGKILL to the job (its exit code becomes ``-9``)."""
        self._check_closed()
        if self._popen is not None:
            self._popen.terminate(force=True)

    def join(self, timeout: float | None = None) -> None:
        """Wait until the job ends, or ``timeout`` seconds pass."""
        self._check_closed()
        assert self._parent_pid == os.getpid(), "can only join a child process"
        assert self._popen is not None, "can only join a started process"
        if self._popen.wait(timeout) is not None:
            _children.discard(self)

    def is_alive(self) -> bool:
        self._check_closed()
        if self is _current:
            return True
        assert self._parent_pid == os.getpid(), "can only test a child process"
        if self._popen is None:
            return False
        if self._popen.poll() is None:
            return True
        _children.discard(self)
        return False

    def close(self) -> None:
        """Release the job's resources; the process must have finished."""
        if self._popen is not None:
            if self._popen.poll() is None:
                raise ValueError("Cannot close a process while it is still running. "
                                 "You should first call join() or terminate().")
            self._popen.close()
            self._popen = None
            _children.discard(self)
        self._closed = True

    def _check_closed(self) -> None:
        if self._closed:
            raise ValueError("process object is closed")

    # -- attributes ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, name: str) -> None:
        assert isinstance(name, str), "name must be a string"
        self._name = name

    @property
    def daemon(self) -> bool:
        return self._daemonic

    @daemon.setter
    def daemon(self, daemonic: bool) -> None:
        assert self._popen is None, "process has already started"
        self._daemonic = bool(daemonic)

    @property
    def authkey(self) -> bytes:
        return self._authkey or identity.key()

    @authkey.setter
    def authkey(self, authkey: bytes) -> None:
        self._authkey = bytes(authkey)

    @property
    def launch(self) -> Any:
        """The started job (a :class:`~fiberlite.runtime.launcher.Launch`: its backend,
        :class:`~fiberlite.backends.Job` and return code), None before :meth:`start` and
        after :meth:`close`; what the run's page reads."""
        return self._popen

    @property
    def exitcode(self) -> int | None:
        self._check_closed()
        if self._popen is None:
            return None
        return self._popen.poll()

    @property
    def ident(self) -> int | None:
        self._check_closed()
        if self is _current:
            return os.getpid()
        return self._popen and self._popen.pid

    pid = ident

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes ready when the job ends."""
        self._check_closed()
        if self._popen is None:
            raise ValueError("process not started")
        return self._popen.sentinel()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_popen"] = None
        return state

    def __repr__(self) -> str:
        if self is _current:
            status = "started"
        elif self._closed:
            status = "closed"
        elif self._parent_pid != os.getpid():
            status = "unknown"
        elif self._popen is None:
            status = "initial"
        else:
            code = self._popen.poll()
            status = "started" if code is None else "stopped"
        info = [type(self).__name__, "name=%r" % self._name, status]
        if self._popen is not None and self._popen.pid is not None:
            info.append("pid=%s" % self._popen.pid)
        if self._popen is not None and status == "stopped":
            code = self._popen.poll()
            info.append("exitcode=%s" % exit_name(code))
        if self._daemonic:
            info.append("daemon")
        return "<%s>" % " ".join(info)

    # -- the job side ---------------------------------------------------------------------
    def _bootstrap(self, parent: ParentProcess) -> int:
        """Run in the job: mirror of ``multiprocessing``'s bootstrap; returns the exit code."""
        global _current, _parent
        _children.clear()
        identity.reset_child_counter()
        _current, _parent = self, parent
        # code that asks the standard library (``multiprocessing.parent_process()``, as a
        # library may, to tell the main process) gets the same answer
        import multiprocessing.process
        multiprocessing.process._parent_process = parent
        try:
            try:
                self.run()
                exitcode = 0
            finally:
                exit_order.leave(through="children")
        except SystemExit as exc:
            if exc.code is None:
                exitcode = 0
            elif isinstance(exc.code, int):
                exitcode = exc.code
            else:
                sys.stderr.write(str(exc.code) + "\n")
                exitcode = 1
        except BaseException:
            exitcode = 1
            import traceback
            sys.stderr.write(f"Process {self.name}:\n")
            traceback.print_exc()
        finally:
            try:
                threading._shutdown()  # type: ignore[attr-defined]
            except Exception:
                pass
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
        return exitcode


def _end_children() -> None:
    """At exit: terminate daemonic children, then wait for the others (as multiprocessing)."""
    for child in active_children():
        if child.daemon and child._popen is not None:
            child._popen.terminate(force=False)
    for child in active_children():
        if child._popen is not None:
            child._popen.wait()


exit_order.at_exit("children", _end_children)
