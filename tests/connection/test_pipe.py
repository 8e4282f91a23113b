"""Pipe and Connection across jobs."""
from __future__ import annotations

import array

import pytest

import fiberlite
import jobs

pytestmark = pytest.mark.timeout(60)


def test_duplex_echo_with_child():
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=jobs.echo, args=(b,))
    p.start()
    b.close()
    for item in [1, "two", [3], {"four": 4}, None]:
        a.send(item)
        assert a.recv() == item
    a.close()
    p.join()
    assert p.exitcode == 0


def test_eof_after_other_end_closed_and_drained():
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=jobs.send_then_close, args=(b, [1, 2, 3]))
    p.start()
    b.close()
    assert [a.recv(), a.recv(), a.recv()] == [1, 2, 3]
    with pytest.raises(EOFError):
        a.recv()
    assert a.poll(0)  # EOF is readable, as with multiprocessing
    p.join()


def test_eof_when_holder_is_killed():
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=jobs.echo, args=(b,))
    p.start()
    b.close()
    a.send("ping")
    assert a.recv() == "ping"
    p.kill()
    p.join()
    with pytest.raises(EOFError):
        a.recv()


def test_poll_timeout_and_data():
    a, b = fiberlite.Pipe()
    assert not a.poll()
    assert not a.poll(0.1)
    b.send(5)
    assert a.poll(1)
    assert a.recv() == 5


def test_poll_refuses_a_timeout_that_is_no_number():
    a, b = fiberlite.Pipe()
    with pytest.raises(TypeError, match="must be real number, not str"):
        a.poll("soon")
    b.send(5)
    with pytest.raises(TypeError, match="must be real number, not str"):
        a.poll("soon")
    assert a.poll(None) and a.recv() == 5


def test_bytes_api_offsets_and_buffer_too_short():
    a, b = fiberlite.Pipe()
    b.send_bytes(b"hello world", 6)
    assert a.recv_bytes() == b"world"
    b.send_bytes(b"hello world", 0, 5)
    buf = bytearray(10)
    assert a.recv_bytes_into(buf, 2) == 5
    assert bytes(buf[2:7]) == b"hello"
    arr = array.array("i", [1, 2, 3])
    b.send_bytes(arr)
    assert a.recv_bytes() == arr.tobytes()
    b.send_bytes(b"x" * 20)
    with pytest.raises(fiberlite.BufferTooShort) as info:
        a.recv_bytes_into(bytearray(4))
    assert info.value.args[0] == b"x" * 20
    with pytest.raises(ValueError):
        b.send_bytes(b"abc", 4)
    with pytest.raises(ValueError):
        b.send_bytes(b"abc", 1, 5)


def test_send_bytes_from_child_recv_bytes():
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=jobs.send_bytes, args=(b, b"\x00\x01payload"))
    p.start()
    assert a.recv_bytes() == b"\x00\x01payload"
    p.join()


def test_simplex_pipe_ends_are_one_way():
    r, w = fiberlite.Pipe(duplex=False)
    assert r.readable and not r.writable and w.writable and not w.readable
    with pytest.raises(OSError):
        r.send(1)
    with pytest.raises(OSError):
        w.recv()
    w.send("one way")
    assert r.recv() == "one way"


def test_closed_connection_raises_and_write_to_closed_pipe_breaks():
    a, b = fiberlite.Pipe()
    a.close()
    assert a.closed
    with pytest.raises(OSError, match="closed"):
        a.send(1)
    with pytest.raises(BrokenPipeError):
        b.send(1)
        b.recv()  # a cast's failure is reported by the next call at the latest


def test_context_manager_closes():
    a, b = fiberlite.Pipe()
    with a:
        b.send(1)
        assert a.recv() == 1
    assert a.closed


def test_eof_when_the_job_never_unpickled_its_end():
    """The end passed to a job that fails before loading its arguments does not keep the
    pipe open (multiprocessing: the child's descriptor closes when it dies)."""
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=jobs.take_args, args=(jobs.LoadsBadly(), b))
    p.start()
    b.close()
    assert a.poll(30)  # EOF, not a wait for ever
    with pytest.raises(EOFError):
        a.recv()
    p.join()
    assert p.exitcode != 0


@pytest.mark.parametrize("kind", ["numpy", "bytearray"])
@pytest.mark.parametrize("via", ["pipe", "queue"])
def test_what_was_sent_does_not_change_when_the_sender_changes_it(kind, via):
    """Large objects travel out of band as views of the sender's memory; one kept for a
    reader that has not asked yet is a copy made at send time."""
    import numpy as np
    data = np.ones(256 * 1024, dtype=np.uint8) if kind == "numpy" else bytearray(b"\x01" * 256 * 1024)
    out = fiberlite.Queue()
    if via == "pipe":
        mine, source = fiberlite.Pipe()
        mine.send(data)
    else:
        source = fiberlite.Queue()
        source.put(data)
    data[:] = b"\x00" * len(data) if kind == "bytearray" else 0  # before anyone received it
    p = fiberlite.Process(target=jobs.report_sum, args=(source, out))
    p.start()
    assert out.get(timeout=30) == 256 * 1024
    p.join()


def _start_sender(items):
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=jobs.send_then_close, args=(b, items))
    p.start()
    return a, p  # b goes out of scope here, as in many multiprocessing scripts


def test_eof_when_the_parent_dropped_its_copy_without_closing_it():
    import gc
    a, p = _start_sender([1, 2])
    gc.collect()
    assert [a.recv(), a.recv()] == [1, 2]
    assert a.poll(30)
    with pytest.raises(EOFError):
        a.recv()
    p.join()


def test_a_pipe_is_freed_once_both_ends_are_closed():
    from fiberlite.runtime.hub import get_hub
    a, b = fiberlite.Pipe()
    oid = a._ref.oid
    a.close()
    assert get_hub().servant(oid) is not None  # b is still held
    b.close()
    assert get_hub().servant(oid) is None


def test_closing_one_copy_keeps_the_other_copy_of_an_end_open():
    import pickle
    a, b = fiberlite.Pipe()
    b2 = pickle.loads(pickle.dumps(b))
    b.close()
    b2.send("still open")
    assert a.recv() == "still open"
    assert not a.poll(0)
