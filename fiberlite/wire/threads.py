"""Threads started on demand, also while the interpreter exits.

Python 3.12.0 and 3.12.1 refuse to start a thread once the interpreter has begun to
finalize, and it has when ``atexit`` hooks run (3.12.2 lifted that again). fiberlite's
exit order (:mod:`fiberlite.runtime.exit_order`) runs in such a hook, and what it waits
for may still need a thread: a job that dials back while the script waits for it to end
is admitted by a thread that watches its handshake's deadline; a connection lost while
closing wakes its callers from a thread (never from nng's own). On those versions one
standby thread, started with the first socket, runs such work when no thread can be started
(one piece of work after the other; each is short).
"""
from __future__ import annotations

import os
import queue
import sys
import threading
from typing import Any, Callable

#: this interpreter refuses new threads in ``atexit`` hooks
REFUSES_AT_EXIT = (3, 12, 0) <= sys.version_info[:3] < (3, 12, 2)


def start(target: Callable[..., Any], *args: Any, name: str | None = None) -> None:
    """Run ``target(*args)`` on a daemon thread of its own (on the standby thread when
    the interpreter, exiting, starts no more)."""
    prepare()
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    try:
        thread.start()
    except RuntimeError:
        if _standby is None:
            raise
        _standby.put((target, args))


def prepare() -> None:
    """Called by what will need threads at exit (a socket, a gate), while threads can
    still be started: start the standby thread, if this interpreter needs one."""
    if REFUSES_AT_EXIT and _standby is None:
        _start_standby()


def run_for(target: Callable[[], Any], timeout: float, name: str | None = None) -> bool:
    """Run ``target()`` on another thread and wait for it at most ``timeout`` seconds
    (it goes on unwaited after that); whether it finished in time."""
    done = threading.Event()

    def run() -> None:
        try:
            target()
        finally:
            done.set()
    start(run, name=name)
    return done.wait(timeout)


# the standby starts with the first socket or thread (not at import: a process that
# forks, such as a pool's template, must have no thread of its own before it does)
_standby: queue.SimpleQueue | None = None
_standby_lock = threading.Lock()


def _start_standby() -> None:
    global _standby
    with _standby_lock:
        if _standby is not None:
            return
        work: queue.SimpleQueue = queue.SimpleQueue()
        try:
            threading.Thread(target=_serve, args=(work,), name="fiberlite-standby", daemon=True).start()
        except RuntimeError:
            return  # already exiting: no standby
        _standby = work


def _serve(work: queue.SimpleQueue) -> None:
    while True:
        target, args = work.get()
        try:
            target(*args)
        except Exception as exc:  # as an uncaught exception in a thread of its own would
            sys.stderr.write(f"fiberlite: in {getattr(target, '__qualname__', target)}: {exc!r}\n")


def _forget_standby() -> None:
    global _standby, _standby_lock
    _standby, _standby_lock = None, threading.Lock()  # a forked child has no standby thread


os.register_at_fork(after_in_child=_forget_standby)
