"""A backend of another package brings its own ``fiberlite run`` and ``fiberlite clean``
through the ``Backend`` hooks, without a line of ``fiberlite/cli/`` knowing it; and the
default ``run_master`` runs a master job through the seam's methods alone."""
from __future__ import annotations

import pytest

from fiberlite import backends, config, plugins
from fiberlite.backends.base import Backend, Job, JobState, MasterRun
from fiberlite.cli import main

pytestmark = pytest.mark.timeout(60)


class _Page:
    closed = False

    def close(self) -> None:
        self.closed = True


class ToyBackend(Backend):
    """Jobs that exist only in this object: what each hook was asked is kept."""

    name = "toy"

    def __init__(self) -> None:
        self.asked: dict[str, object] = {}
        self.page = _Page()
        self._states = iter([JobState.PENDING])

    def create_job(self, spec):
        self.asked["create_job"] = spec
        return Job(self, "toy-master", spec)

    def status(self, job):
        return next(self._states, JobState.RUNNING)

    def wait(self, job, timeout=None):
        return None if timeout is not None else -9  # killed by SIGKILL once waited for

    def terminate(self, job, force=False):
        pass

    def logs(self, job):
        return ""

    def listen_host(self):
        return "127.0.0.1"

    def list_jobs(self, run_id=None):
        return []

    def stream_logs(self, job_name, follow=False):
        self.asked["stream_logs"] = (job_name, follow)
        return iter(["hello ", "from the master\n"])

    def cleanup_run(self, run_id=None):
        self.asked["cleanup_run"] = run_id
        return 1

    def open_page(self, job, address):
        self.asked["open_page"] = (job.id, address)
        return self.page


class ToyWithItsOwnMaster(ToyBackend):
    """Runs the master its own way, here: not at all, exiting 7."""

    def shares_working_dir(self) -> bool:
        return True

    def run_master(self, run: MasterRun) -> int:
        self.asked["run_master"] = run
        return 7

    def clean(self, run_id=None):
        self.asked["clean"] = run_id
        return 3


@pytest.fixture
def toy(monkeypatch, tmp_path):
    """``toy`` and ``toy_own``: the two backends above, found through their entry points."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "script.py").write_text("print('never run here')\n")
    monkeypatch.setattr(config, "_overrides", {})
    monkeypatch.setattr(config, "_inherited", None)
    monkeypatch.setattr(config, "_resolved", None)
    monkeypatch.setattr(plugins, "_entry_points", lambda: {
        "toy": f"{__name__}:ToyBackend", "toy_own": f"{__name__}:ToyWithItsOwnMaster"})
    for name in ("toy", "toy_own"):
        monkeypatch.delitem(backends._instances, name, raising=False)
    yield lambda name: backends.get_backend(name)
    config._resolved = None
    for name in ("toy", "toy_own"):
        backends._instances.pop(name, None)


def test_a_plugin_backend_runs_its_own_master(toy):
    status = main(["run", "--backend", "toy_own", "--cpu", "2", "--env", "K=V",
                   "--dashboard", "8123", "script.py", "a", "b"])
    assert status == 7
    run = toy("toy_own").asked["run_master"]
    spec = run.spec
    assert spec.command == ["python", "script.py", "a", "b"] and spec.cpu == 2
    assert spec.name == f"fl-{run.run_id}-master" and spec.labels["fiberlite/run"] == run.run_id
    assert spec.env["FIBERLITE_BACKEND"] == "toy_own" and spec.env["K"] == "V"
    assert spec.env["FIBERLITE_RUN_ID"] == run.run_id and spec.env["FIBERLITE_DASHBOARD"].endswith(":8123")
    assert run.dashboard[1] == 8123 and run.given == ("--cpu",)
    assert main(["clean", "--backend", "toy_own", "--run", "abc"]) == 0
    assert toy("toy_own").asked["clean"] == "abc"


def test_the_default_run_master_goes_through_the_seam(toy, capsys):
    status = main(["run", "--backend", "toy", "--no-working-dir", "--dashboard", "0.0.0.0:8124",
                   "script.py"])
    assert status == 128 + 9  # the master's -9, as a shell reports it
    backend = toy("toy")
    spec = backend.asked["create_job"]
    run_id = spec.env["FIBERLITE_RUN_ID"]
    assert spec.command == ["python", "script.py"] and spec.env["FIBERLITE_WORKING_DIR"] == "off"
    assert backend.asked["open_page"] == ("toy-master", ("0.0.0.0", 8124)) and backend.page.closed
    assert backend.asked["stream_logs"] == ("toy-master", True)
    assert capsys.readouterr().out == "hello from the master\n"
    assert backend.asked["cleanup_run"] == run_id  # the whole run is removed at its end
    assert main(["clean", "--backend", "toy", "--run", run_id]) == 0  # clean: cleanup_run by default
    assert "toy: removed 1 job of run" in capsys.readouterr().out


def test_build_on_a_backend_without_images_is_one_line(toy, capsys):
    assert main(["run", "--backend", "toy", "--build", "--image", "x:1", "script.py"]) == 1
    assert capsys.readouterr().err == ("fiberlite: error: --build: the toy backend runs no "
                                       "container image\n")
    assert "create_job" not in toy("toy").asked
