"""The first code a job runs: ``python -m fiberlite.runtime.bootstrap``.

It dials the parent's hub (address and object id in the environment, key in the
secret environment), proves it holds the run's key, fetches its preparation data and
the pickled Process, runs it and reports the exit code. If the connection to the
parent drops, or the parent answers nothing for ``peer_timeout`` seconds (its machine
vanished, the network was cut: :mod:`fiberlite.wire.liveness`), the parent is gone and
the job exits too, a moment later: no orphans. It never dials its parent again. If the
job was out of touch when that happened (it heard nothing from the parent, or was frozen
itself), the parent may have given it up as lost: the job then sends nothing more to
anyone (:func:`~fiberlite.runtime.dialed.fence`), so that it cannot come back into the run.
"""
from __future__ import annotations

import os
import sys
import threading

from .launch_options import FORK_TEMPLATE
from .prepare import prepare

PARENT_GONE_GRACE = 2.0  # seconds a job runs on once its parent is gone


def _fail(message: str) -> None:
    sys.stderr.write(f"fiberlite job: {message}\n")
    sys.stderr.flush()
    os._exit(1)


def main() -> None:
    from . import identity
    try:
        address = os.environ.pop("FIBERLITE_HUB")
        oid = int(os.environ.pop("FIBERLITE_JOB"))
        key = identity.take_key()
    except (KeyError, ValueError, OSError):
        _fail("started without FIBERLITE_HUB, FIBERLITE_JOB and the run's key; "
              "jobs are started by fiberlite, not by hand")
    identity.adopt(key, os.environ.get("FIBERLITE_RUN_ID", ""))
    if os.environ.pop(FORK_TEMPLATE, None):  # a pool host: its fork template starts now,
        from ..pool.job.early import fork_template  # beside it, before any socket or thread
        fork_template()
    from .dialed import connect, dial_once, fence
    from .hub import ObjectRef
    from ..process import ParentProcess
    from ..wire import liveness
    try:
        client = connect(address)
    except Exception as exc:
        _fail(f"cannot reach the parent job at {address}: {exc}")
    dial_once(address, f"the connection to the parent job at {address} ended; this job is exiting")
    lost = threading.Event()

    def parent_gone() -> None:
        silent = client.silent_for
        why = (f"the parent job at {address} answered nothing for {silent:g} s (its machine is "
               f"gone, cut off or frozen?); this job is exiting" if silent is not None
               else f"the parent job at {address} is gone; this job is exiting")
        if client.out_of_touch:  # the parent may have given this job up: it is out of the
            fence(why)           # run, and whatever it sends from now on reaches nobody
        lost.set()  # parent_process().is_alive() is False and its join() returns from now
        # the job may act on it (report, clean up) for a moment, then it exits: no orphans
        exit_timer = threading.Timer(PARENT_GONE_GRACE, _fail, (why,))
        exit_timer.daemon = True
        exit_timer.start()

    client.on_lost(parent_gone)
    ref = ObjectRef(address, oid)
    from .tree.receive import TreeError, discard, fetch_for_job
    try:
        prep_payload, process_payload = ref.call("fetch")
        prep = prep_payload.unpack()
        fetch_for_job(prep, address)  # the working directory, where the parent's is not seen
        prepare(prep)
        liveness.reconfigure()  # the parent's peer_timeout
        process = process_payload.unpack()
    except TreeError as exc:
        _fail(f"could not receive the working directory: {exc}")
    except Exception as exc:
        import traceback
        traceback.print_exc()
        _fail(f"could not receive the process to run: {exc}")
    process._popen = None
    import multiprocessing  # logging names a record's process after the stdlib's
    multiprocessing.current_process().name = process.name
    exitcode = process._bootstrap(ParentProcess(prep["parent_name"], prep["parent_pid"], lost))
    from . import exit_order
    from .dialed import flush
    exit_order.leave(through="backends")  # the hub's sockets stay open to report the exit
    try:
        flush()  # what this job put or sent lands before it is reported gone
    except Exception as exc:
        sys.stderr.write(f"fiberlite job: {exc}\n")
    try:
        ref.call("exit", exitcode)
    except Exception:
        pass
    discard()  # this job's copy of the working directory, if it had one
    os._exit(exitcode)


if __name__ == "__main__":
    main()
