"""machine_id: jobs on one kernel and network namespace share it, others do not."""
from __future__ import annotations


import fiberlite
import jobs
from fiberlite.runtime.machine import machine_id
from interpreters import run_python

PRINT_ID = "from fiberlite.runtime.machine import machine_id; print(machine_id())"


def test_a_local_job_is_on_this_machine():
    out = fiberlite.Queue()
    p = fiberlite.Process(target=jobs.report_machine_id, args=(out,))
    p.start()
    assert out.get(timeout=30) == machine_id()
    p.join()


def test_another_network_namespace_is_another_machine_even_with_the_same_hostname():
    """(util-linux's ``unshare``, as root: a new network namespace, same hostname)"""
    here = run_python("-c", PRINT_ID, timeout=60)
    assert here.returncode == 0, here.stderr
    apart = run_python("-c", PRINT_ID, timeout=60, prefix=("unshare", "--net"))
    assert apart.returncode == 0, apart.stderr
    assert here.stdout == f"{machine_id()}\n"
    assert apart.stdout.split("/")[0] == here.stdout.split("/")[0]  # the same kernel boot
    assert apart.stdout != here.stdout
