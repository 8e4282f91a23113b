"""What a job sees of its parent before it runs anything, as the stdlib's spawn hands it
over (``multiprocessing.spawn.get_preparation_data``): ``sys.argv``, the logger's level
and its stderr handler, the authkey, ``sys.path``, the working directory, and the main
module's name when it was run with ``python -m``.

Each test runs a script of its own as ``__main__`` in a new interpreter, so that the
parent's ``sys.argv`` and logger are the script's."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from paths import ROOT

pytestmark = pytest.mark.timeout(120)


def run(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "main_script.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=100)


# the main part of the scripts below: a job runs report(q), the parent prints what it put
REPORT_FROM_A_JOB = """
    if __name__ == "__main__":
        q = mp.Queue()
        job = mp.Process(target=report, args=(q,))
        job.start()
        print(q.get(timeout=30))
        job.join(30)
        print("exitcode", job.exitcode)
"""

ARGV_AT_MODULE_LEVEL = """
    import importlib
    import sys
    import threading
    import fiberlite as mp

    codec = importlib.import_module(sys.argv[1])  # at module level: runs again in the job
    guard = threading.Lock()  # cannot be pickled: the job runs this script again to make it

    def report(q):
        with guard:
            q.put((sys.argv, codec.__name__))
""" + REPORT_FROM_A_JOB


def test_a_script_reading_argv_at_module_level_runs_in_jobs(tmp_path):
    done = run(tmp_path, ARGV_AT_MODULE_LEVEL, "json", "--flag")
    assert done.returncode == 0, done.stderr
    script = str(tmp_path / "main_script.py")
    assert done.stdout.splitlines() == [str(([script, "json", "--flag"], "json")), "exitcode 0"]


LOGGER_AND_KEY = """
    import logging
    import os
    import sys
    import fiberlite as mp
    from fiberlite import util

    def report(q):
        logger = util.get_logger()
        util.debug("debug from the job")
        q.put((logger.getEffectiveLevel(), util.logs_to_stderr(),
               mp.current_process().authkey, os.getcwd(), sys.path[:2]))

    if __name__ == "__main__":
        mp.log_to_stderr(logging.DEBUG)  # before fiberlite read its settings
        mp.current_process().authkey = b"the parent's own key"
        sys.path.insert(0, "/nonexistent-but-kept")
        os.chdir("sub")
        q = mp.Queue()
        job = mp.Process(target=report, args=(q,))
        job.start()
        print(q.get(timeout=30))
        job.join(30)
        print("parent level", util.get_logger().getEffectiveLevel(), "exitcode", job.exitcode)
"""


def test_a_job_logs_at_the_parents_level_with_its_key_and_directory(tmp_path):
    (tmp_path / "sub").mkdir()
    done = run(tmp_path, LOGGER_AND_KEY)
    assert done.returncode == 0, done.stderr
    level, to_stderr, key, cwd, path = eval(done.stdout.splitlines()[0])
    assert (level, to_stderr, key) == (10, True, b"the parent's own key")
    assert cwd == str(tmp_path / "sub")
    assert done.stdout.splitlines()[1] == "parent level 10 exitcode 0"
    assert "[DEBUG/Process-1] debug from the job" in done.stderr


RUN_AS_MODULE = """
    import sys
    import threading
    import fiberlite as mp
    from .helper import VALUE  # a relative import: the job runs this as a module of pkg

    guard = threading.Lock()  # cannot be pickled: the job runs this module again to make it

    def report(q):
        with guard:
            q.put((VALUE, sys.argv[1:]))
""" + REPORT_FROM_A_JOB


def test_a_main_module_run_with_dash_m_is_run_again_as_that_module(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("VALUE = 42\n")
    (package / "main.py").write_text(textwrap.dedent(RUN_AS_MODULE))
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "pkg.main", "x"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str((42, ["x"])), "exitcode 0"]
