"""Receiving a tree: the digest is checked before anything is unpacked, and an archive
that would write outside its directory is refused and leaves nothing behind."""
from __future__ import annotations

import hashlib
import io
import os
import tarfile

import pytest

from fiberlite.backends.base import TREE_ENV
from fiberlite.runtime.tree import TreeError, pack as tree_pack, receive
from fiberlite.runtime.tree.unpack import extract


def tar_of(*members) -> bytes:
    """A gzipped tar of ``(name, kind, payload)``: kind file/dir/sym/hard/fifo."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE,
                         "hard": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            if kind in ("sym", "hard"):
                info.linkname = payload
            tar.addfile(info)
    return raw.getvalue()


@pytest.fixture
def unpack_into(tmp_path):
    def run(data: bytes):
        archive = tmp_path / "a.tar.gz"
        archive.write_bytes(data)
        dest = tmp_path / "dest"
        dest.mkdir()
        extract(str(archive), str(dest))
        return dest
    return run


@pytest.mark.parametrize("members, reason", [
    ([("/etc/evil", "file", b"x")], "an absolute or malformed path"),
    ([("../evil", "file", b"x")], "a path that leaves the tree"),
    ([("a/../../evil", "file", b"x")], "a path that leaves the tree"),
    ([("link", "sym", "/etc/passwd")], "an absolute target"),
    ([("a/link", "sym", "../../etc")], "it leads out of the tree"),
    ([("hard", "hard", "/etc/passwd")], "only files, directories and symlinks travel"),
    ([("pipe", "fifo", "")], "only files, directories and symlinks travel"),
    ([("x", "file", b"1"), ("x", "file", b"2")], "given twice"),
    # a link that stays inside by itself, until another one turns it outward
    ([("a", "sym", "b/c/../.."), ("b", "sym", ".")], "it leads out of the tree"),
])
def test_refused_archives_leave_nothing(tmp_path, unpack_into, members, reason):
    with pytest.raises(TreeError, match=reason):
        unpack_into(tar_of(("ok.txt", "file", b"fine"), *members))
    assert not (tmp_path / "dest").exists()
    assert not (tmp_path.parent / "evil").exists() and not (tmp_path / "evil").exists()


def test_a_file_is_never_written_through_a_link(tmp_path, unpack_into):
    with pytest.raises(TreeError, match="refused entry 'd': a file, directory or link of "
                                        "that name is there already"):
        # the link comes first in the archive, a file "through" it after
        unpack_into(tar_of(("inner", "dir", ""), ("d", "sym", "inner"), ("d/x", "file", b"boom")))
    assert not (tmp_path / "dest").exists()


def test_files_dirs_and_inner_links_unpack(unpack_into):
    dest = unpack_into(tar_of(("pkg", "dir", ""), ("pkg/m.py", "file", b"X = 1\n"),
                              ("alias.py", "sym", "pkg/m.py")))
    assert (dest / "alias.py").read_text() == "X = 1\n"
    assert os.readlink(dest / "alias.py") == "pkg/m.py"


def test_receive_checks_the_digest_before_unpacking(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("X = 1\n")
    tree = tree_pack.pack(str(tmp_path / "src"), 1 << 20)
    tampered = bytearray(tree.data)
    tampered[-9] ^= 0xFF
    offer = {"digest": tree.digest, "size": len(tree.data), "root": "/home/me/proj", "oid": 1}
    with pytest.raises(TreeError, match="does not match its digest"):
        receive.receive(offer, lambda offset: bytes(tampered[offset:offset + 7]))
    assert [p.name for p in tmp_path.iterdir()] == ["src"]  # nothing unpacked, nothing kept

    monkeypatch.delenv(TREE_ENV, raising=False)
    got = receive.receive(offer, lambda offset: tree.data[offset:offset + 7])
    assert got.root == str(tmp_path / f"fiberlite-tree-{tree.digest[:16]}")
    assert open(os.path.join(got.root, "m.py")).read() == "X = 1\n"
    assert hashlib.sha256(open(got.archive, "rb").read()).hexdigest() == tree.digest
    assert receive.installed() == got  # its own jobs are offered this archive
    second = receive.receive(offer, lambda offset: tree.data[offset:offset + 1000])
    assert second.root != got.root  # the shared path was taken: a path of its own
    receive.discard()
    assert [p.name for p in tmp_path.iterdir()] == ["src"]


def test_relocate_moves_the_creators_paths_into_the_copy():
    prep = {"sys_path": ["", "/home/me/proj", "/home/me/proj/src", "/usr/lib/python3.11",
                         "/home/me/project2"],
            "cwd": "/home/me/proj/sub", "settings": {"working_dir": None}}
    tree = receive.Installed("/tmp/fiberlite-tree-abc", "abc", "/tmp/fiberlite-tree-abc.tar.gz")
    receive.relocate(prep, {"root": "/home/me/proj"}, tree)
    assert prep["sys_path"] == ["", "/tmp/fiberlite-tree-abc", "/tmp/fiberlite-tree-abc/src",
                                "/usr/lib/python3.11", "/home/me/project2"]
    assert prep["cwd"] == "/tmp/fiberlite-tree-abc/sub"
    assert prep["settings"]["working_dir"] == "/tmp/fiberlite-tree-abc"
    prep["cwd"] = "/elsewhere"
    receive.relocate(prep, {"root": "/home/me/proj"}, tree)
    assert prep["cwd"] == "/tmp/fiberlite-tree-abc"


CLAIMER = """
import os, sys
from fiberlite.runtime.tree.claim import Claim
claim = Claim.take("ab" * 32, sys.argv[1])
tree = os.path.join(sys.argv[1], "fiberlite-tree-abababababababab")
os.mkdir(tree)
claim.own(tree)
print("claimed", flush=True)
sys.stdin.read()  # until told to die
"""


def test_a_tree_whose_job_died_is_swept_and_a_live_one_is_not(tmp_path, monkeypatch, capsys):
    import subprocess
    import sys
    from fiberlite.runtime.tree.claim import sweep
    job = subprocess.Popen([sys.executable, "-c", CLAIMER, str(tmp_path)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline() == "claimed\n"
        assert sweep(str(tmp_path)) == 0
        assert (tmp_path / "fiberlite-tree-abababababababab").is_dir()
    finally:
        job.kill()  # no clean-up of its own
        job.wait()
    (tmp_path / "fiberlite-tree-not-listed").mkdir()  # not in any claim: left alone
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    from fiberlite.cli import main  # fiberlite clean sweeps what jobs of this machine left
    assert main(["clean", "--backend", "local", "--run", "no-such-run"]) == 0
    assert "removed 0 jobs of run no-such-run" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fiberlite-tree-not-listed"]
