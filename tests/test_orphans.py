"""Children never outlive their parent, even when it is killed with SIGKILL."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import textwrap

import psutil
import pytest
from interpreters import start_python

pytestmark = pytest.mark.timeout(90)

PARENT = textwrap.dedent("""
    import sys, fiberlite, jobs
    if __name__ == "__main__":
        q, r = fiberlite.Queue(), fiberlite.Queue()
        fiberlite.Process(target=jobs.start_child_then_wait, args=(q,)).start()
        fiberlite.Process(target=jobs.wait_forever, args=(r,), daemon=True).start()
        pids = [*q.get(timeout=60), r.get(timeout=60)]
        print(" ".join(str(pid) for pid in pids), flush=True)
        sys.stdin.read()
""")


def test_parent_sigkill_leaves_no_orphans(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = start_python(script, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        line = parent.stdout.readline()
        pids = [int(x) for x in line.split()]
        assert len(pids) == 3, line
        procs = [psutil.Process(pid) for pid in pids]
        assert all(p.is_running() for p in procs)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        gone, alive = psutil.wait_procs(procs, timeout=10)
        assert not alive, f"orphans left running: {alive}"
    finally:
        parent.kill()
        for pid in locals().get("pids", []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


STOPPABLE_PARENT = textwrap.dedent("""
    import sys, fiberlite, jobs
    if __name__ == "__main__":
        r = fiberlite.Queue()
        fiberlite.Process(target=jobs.wait_forever, args=(r,)).start()
        print(r.get(timeout=60), flush=True)
        sys.stdin.read()
""")


def test_a_parent_that_stops_answering_is_given_up(tmp_path):
    # a stopped process keeps its connections open, as a vanished machine does: only
    # the unanswered pings of its children tell them it is gone
    script = tmp_path / "parent.py"
    script.write_text(STOPPABLE_PARENT)
    parent = start_python(script, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env={"FIBERLITE_PEER_TIMEOUT": "2"})
    child = None
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        exited = os.pidfd_open(child.pid)   # readable once it exits (a stopped parent cannot reap it)
        try:
            parent.send_signal(signal.SIGSTOP)
            ready, _, _ = select.select([exited], [], [], 30)
        finally:
            os.close(exited)
        assert ready, "the child kept running for 30 s after its parent stopped answering"
    finally:
        parent.kill()
        parent.wait(10)
        if child is not None and child.is_running():
            child.kill()
