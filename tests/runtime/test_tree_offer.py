"""The creator's side of a travelling working directory: packed once per process, the
same tree for every job of the run, read out by the hub's servant; a process running
in a copy passes on the archive it received instead of packing again."""
from __future__ import annotations

import hashlib

import pytest

from fiberlite import config
from fiberlite.backends.base import TREE_ENV
from fiberlite.backends.local import LocalBackend
from fiberlite.runtime.hub import ObjectRef, get_hub
from fiberlite.runtime.tree import offer, pack as tree_pack, receive


class FarBackend(LocalBackend):
    """Jobs that do not see this process's files (as pods do)."""

    def shares_working_dir(self) -> bool:
        return False


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.delenv(TREE_ENV, raising=False)
    monkeypatch.setattr(offer, "_offers", {})
    monkeypatch.setattr(config, "_overrides", dict(config._overrides))
    monkeypatch.setattr(config, "_resolved", None)
    monkeypatch.delenv("FIBERLITE_WORKING_DIR", raising=False)
    (tmp_path / "tmp").mkdir()
    root = tmp_path / "project"
    (root / "mylib").mkdir(parents=True)
    (root / "mylib" / "__init__.py").write_text("VERSION = 1\n")
    monkeypatch.chdir(root)
    packed = []
    real_pack = tree_pack.pack
    monkeypatch.setattr(tree_pack, "pack", lambda *a: packed.append(a) or real_pack(*a))
    yield root, packed
    receive.discard()


def read_all(made: dict) -> bytes:
    ref = ObjectRef(get_hub("local").address, made["oid"])
    data = b""
    while len(data) < made["size"]:
        data += ref.call("read", len(data))
    return data


def test_the_tree_is_packed_once_and_every_job_gets_the_same(project):
    root, packed = project
    far = FarBackend()
    first = offer.offer_for(far, "local")
    assert first["root"] == str(root) and len(packed) == 1
    (root / "mylib" / "__init__.py").write_text("VERSION = 2\n")  # an edit during the run
    assert offer.offer_for(far, "local") is first  # not packed, not offered anew
    assert len(packed) == 1
    data = read_all(first)
    assert hashlib.sha256(data).hexdigest() == first["digest"]
    with pytest.raises(ValueError, match="bad offset -1"):
        ObjectRef(get_hub("local").address, first["oid"]).call("read", -1)


def test_nothing_is_offered_to_jobs_that_see_the_files_or_when_off(project):
    root, packed = project
    assert offer.offer_for(LocalBackend(), "local") is None
    config.init(working_dir="off")
    assert offer.offer_for(FarBackend(), "local") is None
    assert not packed


def test_a_process_in_a_copy_passes_on_the_archive_it_received(project, monkeypatch):
    root, packed = project
    made = offer.offer_for(FarBackend(), "local")
    data = read_all(made)
    tree = receive.receive(made, lambda offset: data[offset:offset + 1000])
    monkeypatch.chdir(tree.root)
    monkeypatch.setattr(offer, "_offers", {})  # as in the job that received it
    passed_on = offer.offer_for(FarBackend(), "local")
    assert len(packed) == 1  # not packed again
    assert passed_on["digest"] == made["digest"] and passed_on["root"] == tree.root
    assert read_all(passed_on) == data
