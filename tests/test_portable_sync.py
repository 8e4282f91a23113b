"""The portable path of the shared primitives (POSIX semaphores, no C extension): chosen
where the extension is not built, or when ``portable_sync`` asks for it, and tested by
running the primitives' tests again with it forced (:mod:`portable_leg`, started when
the suite is collected, beside the rest of it). An install into a fresh virtualenv
with no working C compiler (``CC=/bin/false``) succeeds and uses it.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import portable_leg
import side_run
from paths import ROOT

CHOICE = ("from fiberlite.runtime.shm import sync, portable; import fiberlite; "
          "print(sync.PORTABLE, sync.Mutex is portable.Mutex, repr(sync.REASON)); "
          "lock = fiberlite.Lock(); print(lock.acquire(timeout=5), lock)")


@pytest.fixture(scope="module")
def leg():
    """The portable leg's run (started by conftest.py when the suite was collected, or now
    when this file runs alone)."""
    started = portable_leg.start()
    yield started
    started.stop()


@pytest.mark.timeout(portable_leg.RUN_SECONDS + 60)
def test_the_portable_leg_passes(leg):
    if not side_run.wait_for(leg.process, portable_leg.RUN_SECONDS, "portable leg"):
        pytest.fail(f"the portable leg did not finish within {portable_leg.RUN_SECONDS} s:\n"
                    f"{leg.output()[-6000:]}")
    output = leg.output()
    assert leg.process.returncode == 0, f"the portable leg failed:\n{output[-6000:]}"
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) >= portable_leg.MIN_PASSED, f"too few tests ran:\n{output[-3000:]}"


def _run(python: str, env: dict[str, str], cwd: str) -> list[str]:
    done = subprocess.run([python, "-c", CHOICE], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_setting_forces_the_portable_path(tmp_path):
    env = {**os.environ, portable_leg.ENV: "1", "PYTHONPATH": ROOT}
    chosen, lock = _run(sys.executable, env, str(tmp_path))
    assert chosen == "True True 'the portable_sync setting asks for it'"
    assert lock == "True <Lock(owner=MainProcess)>"


WAITS = {  # a blocking wait of each primitive that nothing will end
    "lock": "x = fiberlite.Lock(); x.acquire(); x.acquire()",
    "semaphore": "fiberlite.Semaphore(0).acquire()",
    "event": "fiberlite.Event().wait()",
    "condition": "c = fiberlite.Condition(); c.acquire(); c.wait()",
    "barrier": "fiberlite.Barrier(2).wait()",
}


@pytest.mark.parametrize("what", ["lock", "semaphore", "event", "condition", "barrier"])
def test_ctrl_c_ends_a_blocking_wait_at_once(what, tmp_path):
    """As the standard library's waits: SIGINT raises KeyboardInterrupt in the waiting
    thread, within a moment."""
    script = ("import fiberlite\n"
              f"try:\n    print('waiting', flush=True)\n    {WAITS[what]}\n"
              "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n")
    env = {**os.environ, portable_leg.ENV: "1", "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=str(tmp_path), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.3)  # (to be inside the wait: nothing says when a thread sleeps)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=5)
    finally:
        proc.kill()
        proc.wait()
    assert out.strip() == "interrupted", err[-2000:]


def _source_copy(to: str) -> str:
    """The checkout's tracked files (none of its builds) at ``to``."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in (f.decode() for f in files if f):
        if name.endswith((".so", ".pyd")) or not os.path.isfile(os.path.join(ROOT, name)):
            continue
        os.makedirs(os.path.dirname(os.path.join(to, name)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), os.path.join(to, name))
    return to


@pytest.mark.timeout(300)
def test_an_install_without_a_c_compiler_succeeds_and_uses_the_portable_path(tmp_path):
    """``CC=/bin/false pip install``: the extension's build fails, the install does not. The
    virtualenv sees this Python's packages (the dependencies, setuptools) so that nothing
    is downloaded: pip runs without build isolation."""
    source = _source_copy(str(tmp_path / "source"))
    venv = str(tmp_path / "venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
                   check=True, timeout=120)
    python = os.path.join(venv, "bin", "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FIBERLITE_", "PYTHON"))}
    done = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-v", "--no-deps",
                           "--no-build-isolation", "--no-index", source],
                          env={**env, "CC": "/bin/false"}, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    said = [line.strip() for line in (done.stdout + done.stderr).splitlines() if "was not built" in line]
    assert said and "portable path" in said[0], (done.stdout + done.stderr)[-4000:]
    chosen, lock = _run(python, env, str(tmp_path))
    assert chosen.startswith("True True ") and "the C extension is not built" in chosen, chosen
    assert lock == "True <Lock(owner=MainProcess)>"
    where = subprocess.run([python, "-c", "import fiberlite; print(fiberlite.__file__)"], env=env,
                           cwd=str(tmp_path), capture_output=True, text=True, timeout=60).stdout
    assert where.startswith(venv), where


UNREACHABLE = """
import _multiprocessing, sys
import fiberlite
from fiberlite.runtime.shm import arena, portable

def add(value, times, maps):
    from fiberlite.runtime.shm import attach
    for _ in range(times):
        with value.get_lock():
            value.value += 1
    maps.put(sum(len(a._maps) for a in attach._attachments.values() if a is not None))

if __name__ == "__main__":
    value, maps = fiberlite.Value("i", 0), fiberlite.Queue()
    for segment in arena.arena()._segments.values():  # as seen from a /dev/shm of its own
        _multiprocessing.sem_unlink(portable._name(segment.map, 0, b"S"))
    jobs = [fiberlite.Process(target=add, args=(value, 200, maps)) for _ in range(2)]
    for job in jobs:
        job.start()
    mapped = [maps.get(timeout=60) for _ in jobs]
    for job in jobs:
        job.join(60)
    print(value.value, mapped, [job.exitcode for job in jobs])
"""


def test_a_job_that_cannot_open_the_named_semaphores_goes_through_the_hub(tmp_path):
    """A job of this machine that maps the memory but cannot open its creator's named
    semaphores (a container with a /dev/shm of its own) leaves the memory unmapped and
    reaches the value through the creator's hub: the count stays exact."""
    script = tmp_path / "unreachable.py"
    script.write_text(UNREACHABLE)
    env = {**os.environ, portable_leg.ENV: "1", "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "400 [0, 0] [0, 0]", done.stdout + done.stderr
