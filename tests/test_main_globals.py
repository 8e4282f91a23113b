"""Globals of the main script that cannot be pickled: a job runs the script again to make
its own (as the stdlib's spawn does), and where it cannot, the error names the global.

Each test runs a script of its own as ``__main__`` in a new interpreter: what is tested
is how a main script's functions travel."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from paths import ROOT

pytestmark = pytest.mark.timeout(120)


def run(tmp_path, source: str, as_file: bool = True, **settings: str) -> subprocess.CompletedProcess:
    """Run ``source`` as the main script (``as_file``: from a file, else with ``-c``),
    with ``settings`` as ``FIBERLITE_<NAME>`` in its environment."""
    source = textwrap.dedent(source)
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.update({f"FIBERLITE_{name.upper()}": value for name, value in settings.items()})
    if as_file:
        script = tmp_path / "main_script.py"
        script.write_text(source)
        command = [sys.executable, str(script)]
    else:
        command = [sys.executable, "-c", source]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=100)


MANAGER_AS_NAMESPACE = """
    import queue
    import fiberlite as mp
    from fiberlite.managers import BaseManager

    inbox = queue.Queue()  # holds locks: cannot be pickled

    def the_inbox():
        return inbox

    class Mailroom(BaseManager):
        pass

    Mailroom.register("inbox", callable=the_inbox)

    def sign(book, slot):
        book[slot] = mp.current_process().name  # mp: the module, made again in the job

    def square(x):
        return x * x if mp.current_process().name else None

    if __name__ == "__main__":
        with Mailroom() as room:
            room.inbox().put("letter")  # the server's own inbox
            print("inbox", room.inbox().get(timeout=30), room.inbox().qsize())
        manager = mp.Manager()
        tools, mp = mp, manager  # the global now names the manager, which cannot be pickled
        book = mp.dict()
        jobs = [tools.Process(target=sign, args=(book, i), name=f"signer-{i}") for i in range(2)]
        for job in jobs:
            job.start()
        for job in jobs:
            job.join(60)
        print("exitcodes", [job.exitcode for job in jobs])
        print("book", sorted(book.items()))
        with tools.Pool(2) as pool:
            print("squares", pool.map(square, range(5)))
        manager.shutdown()
"""


def test_a_global_rebound_to_a_manager_is_made_again_by_the_jobs(tmp_path):
    done = run(tmp_path, MANAGER_AS_NAMESPACE)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "inbox letter 0" in lines
    assert "exitcodes [0, 0]" in lines
    assert "book [(0, 'signer-0'), (1, 'signer-1')]" in lines
    assert "squares [0, 1, 4, 9, 16]" in lines


@pytest.mark.docker
def test_in_containers_the_script_from_the_mounted_working_directory_makes_the_global(tmp_path):
    from docker_env import ensure_docker
    done = run(tmp_path, MANAGER_AS_NAMESPACE, backend="docker", image=ensure_docker())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exitcodes [0, 0]" in done.stdout.splitlines()
    assert "book [(0, 'signer-0'), (1, 'signer-1')]" in done.stdout.splitlines()


def test_a_global_the_script_makes_only_under_its_main_guard_is_named(tmp_path):
    done = run(tmp_path, """
        import socket
        import fiberlite

        def use_the_socket():
            print(link.fileno())

        if __name__ == "__main__":
            link = socket.socket()
            job = fiberlite.Process(target=use_the_socket)
            job.start()
            job.join(60)
            print("exitcode", job.exitcode)
    """)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exitcode 1" in done.stdout
    assert "the global 'link' of the main script (socket in the parent" in done.stderr
    assert "does not define it" in done.stderr


def test_without_a_script_file_the_error_at_start_names_the_global(tmp_path):
    done = run(tmp_path, """
        import threading
        import fiberlite

        guard = threading.Lock()

        def locked_work():
            with guard:
                pass

        try:
            fiberlite.Process(target=locked_work).start()
        except TypeError as exc:
            print("refused:", exc)
    """, as_file=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused: cannot start" in done.stdout
    assert "its global 'guard' (a lock)" in done.stdout


def test_a_script_that_starts_jobs_outside_its_main_guard_gets_the_stdlib_error(tmp_path):
    done = run(tmp_path, """
        import threading
        import fiberlite

        guard = threading.Lock()

        def locked_work():
            with guard:
                print("ran")

        job = fiberlite.Process(target=locked_work)  # no `if __name__ == "__main__":`
        job.start()
        job.join(60)
        print("exitcode", job.exitcode)
    """)
    assert "exitcode 1" in done.stdout, done.stdout + done.stderr
    assert "ran" not in done.stdout
    assert "bootstrapping phase" in done.stderr
