"""Every test here runs against the one-node Slurm cluster ``.ci/slurm_setup.sh``
starts on this machine (see ``support/slurm_env.py``)."""
from __future__ import annotations

import os
import warnings

import pytest
from slurm_env import SlurmUnavailable, ensure_slurm


def pytest_collection_modifyitems(items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The test cluster's slurm.conf path, in ``SLURM_CONF`` for this process and its jobs."""
    try:
        conf = ensure_slurm()
    except SlurmUnavailable as exc:
        message = f"THE SLURM TESTS CANNOT RUN ON THIS MACHINE: {exc}"
        warnings.warn(message)
        pytest.skip(message)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous


@pytest.fixture
def slurm(slurm_cluster, monkeypatch, tmp_path):
    """A context whose jobs are Slurm jobs; ``slurm.settings(**values)`` sets settings
    for this test only (its jobs inherit them)."""
    import fiberlite
    from fiberlite import config
    monkeypatch.setattr(config, "_overrides", dict(config._overrides, slurm_dir=str(tmp_path / "slurm")))
    monkeypatch.setattr(config, "_resolved", None)
    ctx = fiberlite.get_context("slurm")

    def settings(**values):
        for name, value in values.items():
            config._overrides[name] = config._check(name, value, "test")
        config._resolved = None
    ctx.settings = settings
    return ctx
