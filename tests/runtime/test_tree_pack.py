"""Packing a working directory: what travels (ignore rules, caches, environments,
symlinks), the archive's stable digest, and the limit's one-line error."""
from __future__ import annotations

import os
import tarfile
import io

import pytest

from fiberlite.errors import ConfigError
from fiberlite.runtime.tree import pack as tree_pack
from fiberlite.runtime.tree.ignore import Rules, parse_rules


def write(root, rel, data=b"x"):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def names(root) -> set[str]:
    return {e.rel for e in tree_pack.scan(str(root)).entries if e.kind != "dir"}


def matches(patterns: str, rel: str, is_dir: bool = False) -> bool:
    rules = Rules((("", tuple(parse_rules(patterns))),))
    return rules.ignored(rel, is_dir)


@pytest.mark.parametrize("pattern, ignored, kept", [
    ("*.log", ["a.log", "deep/b/c.log"], ["a.logx", "log"]),
    ("/top.txt", ["top.txt"], ["sub/top.txt"]),
    ("build/", ["build", "x/build"], ["buildx"]),
    ("doc/*.md", ["doc/a.md"], ["doc/sub/a.md", "x/doc/a.md"]),
    ("**/cache", ["cache", "a/b/cache"], ["cachex"]),
    ("a/**/z", ["a/z", "a/b/z", "a/b/c/z"], ["b/a/z"]),
    ("out/**", ["out/x", "out/y/z"], ["out"]),
    ("f?o", ["foo", "d/fxo"], ["fo", "f/o"]),
    ("[ab].txt", ["a.txt", "b.txt"], ["c.txt"]),
    ("[!ab].txt", ["c.txt"], ["a.txt"]),
    ("\\#hash", ["#hash"], []),
    ("# comment", [], ["# comment"]),
])
def test_gitignore_patterns(pattern, ignored, kept):
    for rel in ignored:
        assert matches(pattern, rel, is_dir=rel in ("build", "x/build")), (pattern, rel)
    for rel in kept:
        assert not matches(pattern, rel), (pattern, rel)


def test_dir_only_pattern_spares_files():
    assert matches("build/", "build", is_dir=True)
    assert not matches("build/", "build", is_dir=False)


def test_negation_last_match_wins():
    assert not matches("*.csv\n!keep.csv", "keep.csv")
    assert matches("*.csv\n!keep.csv", "drop.csv")
    assert matches("!keep.csv\n*.csv", "keep.csv")


def test_scan_honours_gitignore_fiberliteignore_and_skips_caches(tmp_path):
    write(tmp_path, "job.py")
    write(tmp_path, "mylib/__init__.py")
    write(tmp_path, "mylib/__pycache__/x.cpython-311.pyc")
    write(tmp_path, "mylib/core.pyc")
    write(tmp_path, ".git/HEAD")
    write(tmp_path, ".venv/pyvenv.cfg")
    write(tmp_path, "myenv/pyvenv.cfg")  # a venv by any name
    write(tmp_path, "myenv/lib/site.py")
    write(tmp_path, "conda/conda-meta/history")
    write(tmp_path, "data/small.csv")
    write(tmp_path, "data/big.bin")
    write(tmp_path, "logs/run.log")
    write(tmp_path, "logs/keep.log")
    write(tmp_path, "sub/.gitignore", "local.txt\n")
    write(tmp_path, "sub/local.txt")
    write(tmp_path, "sub/other.txt")
    write(tmp_path, "local.txt")  # the sub/.gitignore does not reach up
    write(tmp_path, ".gitignore", "logs/\n*.bin\n")
    write(tmp_path, ".fiberliteignore", "!data/big.bin\n")
    assert names(tmp_path) == {
        "job.py", "mylib/__init__.py", "data/small.csv", "data/big.bin", "sub/.gitignore",
        "sub/other.txt", "local.txt", ".gitignore", ".fiberliteignore"}


def test_symlinks_inside_travel_and_those_leading_out_stay(tmp_path, caplog):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    root = tmp_path / "tree"
    write(root, "data/real.txt", "r")
    os.symlink("data/real.txt", root / "alias.txt")
    os.symlink("../data", root / "data" / "self")  # a loop, inside: kept as a link
    os.symlink(str(outside / "secret"), root / "abs_link")
    os.symlink("../outside/secret", root / "rel_out")
    os.symlink("missing", root / "dangling")
    found = tree_pack.scan(str(root))
    links = {e.rel: e.target for e in found.entries if e.kind == "link"}
    assert links == {"alias.txt": "data/real.txt", "data/self": "../data"}
    assert sorted(found.skipped_links) == ["abs_link", "dangling", "rel_out"]
    assert "symlinks that lead out of it stay behind" in caplog.text


def test_archive_is_the_same_bytes_for_the_same_files(tmp_path):
    write(tmp_path, "a.py", "print(1)\n")
    write(tmp_path, "pkg/run.sh", "#!/bin/sh\n")
    os.chmod(tmp_path / "pkg/run.sh", 0o755)
    first = tree_pack.pack(str(tmp_path), 1 << 20)
    os.utime(tmp_path / "a.py", (1, 1))  # times do not count
    again = tree_pack.pack(str(tmp_path), 1 << 20)
    assert first.digest == again.digest and first.data == again.data
    with tarfile.open(fileobj=io.BytesIO(first.data), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members) == ["a.py", "pkg", "pkg/run.sh"]
    assert members["pkg/run.sh"].mode == 0o755 and members["a.py"].mode == 0o644
    assert all(m.mtime == 0 and m.uid == 0 for m in members.values())
    write(tmp_path, "a.py", "print(2)\n")
    assert tree_pack.pack(str(tmp_path), 1 << 20).digest != first.digest


def test_a_tree_over_the_limit_names_its_largest_files_and_the_ways_out(tmp_path):
    write(tmp_path, "job.py", b"x" * 10)
    write(tmp_path, "data/huge.bin", b"\0" * 300_000)
    write(tmp_path, "models/m.pt", b"\0" * 200_000)
    with pytest.raises(ConfigError) as info:
        tree_pack.pack(str(tmp_path), 400_000)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"the working directory {tmp_path} holds 488.3 KiB to send with "
                              "the run, over the limit of 390.6 KiB (setting working_dir_limit); "
                              "largest: data/huge.bin 293.0 KiB, models/m.pt 195.3 KiB, job.py 10 B;")
    assert f"exclude them in {tmp_path}/.fiberliteignore" in message
    assert "bake them into the image" in message and "volume" in message
    assert "--no-working-dir" in message
    (tmp_path / ".fiberliteignore").write_text("data/\n")
    assert tree_pack.pack(str(tmp_path), 400_000).files == 3  # job.py, m.pt, .fiberliteignore
