"""A local job's output: always on the master's own stdout and stderr, every line once
and in order; with the ``dashboard`` setting on, its end is also kept for ``logs()``."""
from __future__ import annotations


import pytest

from interpreters import run_python

pytestmark = pytest.mark.timeout(90)

SCRIPT = '''
import sys, fiberlite as mp

def talk(lines):
    for i in range(lines):
        print(f"out {i}")
        print(f"err {i}", file=sys.stderr)

if __name__ == "__main__":
    p = mp.Process(target=talk, args=(int(sys.argv[1]),))
    p.start()
    p.join()
    print("joined", flush=True)
    tail = p._popen.backend.logs(p._popen.job)
    print("TAIL", repr(tail), file=sys.stderr)
'''


def run(tmp_path, lines: int, dashboard: str) -> tuple[list[str], list[str], str]:
    script = tmp_path / "talks.py"
    script.write_text(SCRIPT)
    done = run_python(script, lines, timeout=60, env={"FIBERLITE_DASHBOARD": dashboard}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    err = [line for line in done.stderr.splitlines() if not line.startswith("fiberlite: ")]
    tail = [line for line in err if line.startswith("TAIL ")]
    assert len(tail) == 1, done.stderr
    return out, [line for line in err if not line.startswith("TAIL ")], eval(tail[0][5:])


@pytest.mark.parametrize("dashboard", ["127.0.0.1:0", "off"])
def test_every_line_reaches_the_masters_output_before_join_returns(tmp_path, dashboard):
    out, err, _ = run(tmp_path, 2000, dashboard)
    assert out == [f"out {i}" for i in range(2000)] + ["joined"]
    assert err == [f"err {i}" for i in range(2000)]


def test_the_end_of_the_output_is_kept_with_the_dashboard_on(tmp_path):
    _, _, tail = run(tmp_path, 20000, "127.0.0.1:0")
    lines = tail.splitlines()
    assert 0 < len(tail.encode()) <= 64 * 1024
    # whole lines only, the last ones of each stream, each once
    assert all(line.startswith(("out ", "err ")) and line[4:].isdigit() for line in lines)
    assert {"out 19999", "err 19999"} <= set(lines)
    assert len(set(lines)) == len(lines)
    for kind in ("out", "err"):
        numbers = [int(line[4:]) for line in lines if line.startswith(kind)]
        assert numbers == list(range(numbers[0], 20000))


def test_nothing_is_kept_with_the_dashboard_off(tmp_path):
    assert run(tmp_path, 10, "off")[2] == ""


def test_copied_output_is_written_in_whole_lines_no_other_writer_can_cut(monkeypatch):
    """The copier reads a job's pipe in large pieces; it writes them on in pieces no
    larger than a pipe writes at once (``PIPE_BUF``), cut where lines end, so that the
    master's own messages on the same stderr never land inside a job's line (a run once
    saw ``err 1287fiberlite: dashboard at ...``)."""
    from fiberlite.backends.local import output
    pieces: list[bytes] = []
    monkeypatch.setattr(output, "write_all", lambda fd, data: pieces.append(bytes(data)))
    data = b"".join(f"err {i}\n".encode() for i in range(3000)) + b"x" * (3 * output.ATOMIC) + b"\nend"
    output.write_lines(2, data)
    assert b"".join(pieces) == data
    assert len(pieces) > 3 and all(len(piece) <= output.ATOMIC for piece in pieces)
    for piece in pieces[:-1]:  # whole lines, but where one line is longer than a piece
        assert piece.endswith(b"\n") or (len(piece) == output.ATOMIC and b"\n" not in piece)
