"""machine_id: jobs on one kernel and network namespace share it, others do not."""
from __future__ import annotations

import subprocess
import sys

import fiberlite
import jobs
from fiberlite.runtime.machine import machine_id

PRINT_ID = "from fiberlite.runtime.machine import machine_id; print(machine_id())"


def test_a_local_job_is_on_this_machine():
    out = fiberlite.Queue()
    p = fiberlite.Process(target=jobs.report_machine_id, args=(out,))
    p.start()
    assert out.get(timeout=30) == machine_id()
    p.join()


def test_another_network_namespace_is_another_machine_even_with_the_same_hostname():
    """(util-linux's ``unshare``, as root: a new network namespace, same hostname)"""
    here = subprocess.run([sys.executable, "-c", PRINT_ID], capture_output=True, text=True, check=True)
    apart = subprocess.run(["unshare", "--net", sys.executable, "-c", PRINT_ID],
                           capture_output=True, text=True, timeout=60)
    assert apart.returncode == 0, apart.stderr
    assert here.stdout == f"{machine_id()}\n"
    assert apart.stdout.split("/")[0] == here.stdout.split("/")[0]  # the same kernel boot
    assert apart.stdout != here.stdout
