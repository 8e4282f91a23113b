"""fiberlite.connection.wait: multiprocessing.connection.wait for fiberlite Connections."""
from __future__ import annotations

import pickle
import select
import selectors
import time
from multiprocessing.connection import wait as stdlib_wait

import pytest

import fiberlite
import jobs
from fiberlite.connection import wait

pytestmark = pytest.mark.timeout(60)


def test_returns_the_connections_that_have_data():
    a1, b1 = fiberlite.Pipe()
    a2, b2 = fiberlite.Pipe()
    b2.send("hello")
    assert wait([a1, a2], timeout=5) == [a2]
    assert a2.recv() == "hello"
    assert wait([a1, a2], timeout=0) == []


def test_times_out_with_an_empty_list():
    a, _b = fiberlite.Pipe()
    started = time.monotonic()
    assert wait([a], timeout=0.3) == []
    assert time.monotonic() - started >= 0.3


def test_wakes_when_a_child_sends():
    go_here, go_there = fiberlite.Pipe()
    quiet, _unused = fiberlite.Pipe()
    mine, theirs = fiberlite.Pipe()
    p = fiberlite.Process(target=jobs.send_when_told, args=(go_there, theirs, 42))
    p.start()
    assert wait([quiet, mine], timeout=0.2) == []  # nothing sent yet: the child waits for go
    go_here.send(None)
    assert wait([quiet, mine], timeout=30) == [mine]
    assert mine.recv() == 42
    p.join()


def test_eof_counts_as_ready():
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=jobs.send_then_close, args=(b, []))
    p.start()
    b.close()
    assert wait([a], timeout=30) == [a]
    with pytest.raises(EOFError):
        a.recv()
    p.join()


def test_mixes_connections_and_process_sentinels():
    a, _b = fiberlite.Pipe()
    p = fiberlite.Process(target=jobs.exit_with, args=(0,))
    p.start()
    assert wait([a, p.sentinel], timeout=30) == [p.sentinel]
    p.join()
    a.send_bytes(b"x")  # duplex: a's own send lands at b, a stays not ready
    assert wait([a, p.sentinel], timeout=5) == [p.sentinel]


def test_a_child_waits_on_connections_it_holds():
    a1, b1 = fiberlite.Pipe()
    a2, b2 = fiberlite.Pipe()
    out = fiberlite.Queue()
    p = fiberlite.Process(target=jobs.wait_for_connections, args=([b1, b2], out))
    p.start()
    a2.send("for the second")
    assert out.get(timeout=30) == [1]
    p.join()
    assert p.exitcode == 0


def test_closed_or_write_only_connections_are_rejected():
    r, w = fiberlite.Pipe(duplex=False)
    with pytest.raises(OSError, match="write-only"):
        wait([w], timeout=0)
    r.close()
    with pytest.raises(OSError, match="closed"):
        wait([r], timeout=0)


def send_later(conn, items, go):
    go.wait()
    for item in items:
        conn.send(item)


def test_fileno_is_readable_while_something_is_left_and_at_eof():
    a, b = fiberlite.Pipe()
    go = fiberlite.Event()
    p = fiberlite.Process(target=send_later, args=(b, ["x", "y"], go))
    p.start()
    b.close()
    try:
        fd = a.fileno()
        assert isinstance(fd, int) and a.fileno() == fd
        assert select.select([fd], [], [], 0.2)[0] == []
        go.set()
        assert select.select([fd], [], [], 30)[0] == [fd]     # sent by the job
        assert a.recv() == "x"
        assert select.select([fd], [], [], 30)[0] == [fd]     # "y" is still there
        assert a.recv() == "y"
        p.join(30)                                            # the job's end is gone: EOF
        assert stdlib_wait([a], 30) == [a]
        with pytest.raises(EOFError):
            a.recv()
    finally:
        a.close()
    with pytest.raises(OSError, match="closed"):
        a.fileno()


def test_fileno_with_selectors_and_a_pickled_end():
    a, b = fiberlite.Pipe()
    with selectors.DefaultSelector() as sel:
        sel.register(a, selectors.EVENT_READ)
        assert sel.select(0.1) == []
        b.send_bytes(b"abc")
        (key, _), = sel.select(30)
        assert key.fileobj is a and a.recv_bytes() == b"abc"
        assert sel.select(0.1) == []
        sel.unregister(a)
    again = pickle.loads(pickle.dumps(a))   # another Connection on the same end
    b.send(1)
    assert stdlib_wait([again], 30) == [again] and again.recv() == 1
    again.close()
    a.close()
    b.close()


def test_fileno_of_a_one_way_pipe_is_readable_only_on_the_reading_end():
    r, w = fiberlite.Pipe(duplex=False)
    try:
        w.send("x")
        assert select.select([r.fileno(), w.fileno()], [], [], 30)[0] == [r.fileno()]
        assert r.recv() == "x"
        assert select.select([r.fileno(), w.fileno()], [], [], 0.2)[0] == []
    finally:
        r.close()
        w.close()
