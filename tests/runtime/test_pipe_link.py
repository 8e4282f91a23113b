"""Pipe ends linked to the job that reads them (fiberlite.runtime.links): the fast path must
keep every guarantee of a pipe read through its hub."""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading

import psutil
import pynng
import pytest

import fiberlite
import link_jobs
from fiberlite.runtime import identity
from fiberlite.runtime.links import forwarder, frames
from fiberlite.runtime.links import reader as pipelink
from fiberlite.errors import AuthenticationError
from fiberlite.runtime.hub import get_hub
from fiberlite.wire import link as links
from fiberlite.wire.link import local as local_link
from fiberlite.wire.link import nng as nng_link
from fiberlite.wire.link import tcp as tcp_link
from fiberlite.wire.link.local import SCHEME as LOCAL, available
from fiberlite.wire.link.nng import NngLink
from fiberlite.wire.tls import host_port
from interpreters import run_python
from unpickle_trap import Trace

# pipes without lanes: their links are what is tested
pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("without_lanes")]
ROUNDS = link_jobs.LINKING_READS


def _link_state(conn, end: int):
    """The owner's view of the link of ``end`` of ``conn``'s pipe (None: not linked)."""
    link = get_hub().servant(conn._ref.oid).links.get(end)
    return None if link is None else link.state


def _echo(a, items) -> None:
    for item in items:
        a.send(item)
        assert a.recv() == item


def test_reader_job_is_linked_and_both_directions_keep_order():
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=link_jobs.echo_then_report, args=(b, 200))
    p.start()
    _echo(a, range(ROUNDS))
    assert _link_state(a, 1) == forwarder.LINKED
    _echo(a, range(ROUNDS, 200))
    assert a.recv() == ("linked", True)
    p.join()
    assert p.exitcode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets are Linux's")
def test_a_job_on_this_machine_is_linked_over_a_unix_socket():
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=link_jobs.echo_then_report_transport, args=(b, ROUNDS))
    p.start()
    _echo(a, range(ROUNDS))
    assert a.recv() == "local"
    p.join()
    assert p.exitcode == 0


LINK_TRANSPORT = """
import fiberlite, link_jobs
from fiberlite.runtime.lanes import shared
shared.enabled = lambda: False  # a pipe without lanes: its link is what is tested
if __name__ == "__main__":
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=link_jobs.echo_then_report_transport, args=(b, {rounds}))
    p.start()
    for i in range({rounds}):
        a.send(i)
        assert a.recv() == i
    print(a.recv())
    p.join()
"""


@pytest.mark.skipif(not available(), reason="local links are Linux's")
def test_a_job_on_this_machine_is_linked_over_a_unix_socket_whatever_address_its_owner_has(tmp_path):
    """The machine is told by its kernel's boot and network namespace, not by a loopback
    address: an owner that listens on this machine's own address links over a Unix socket,
    and with share_machine off over the network."""
    address = next((a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                    if a.family == socket.AF_INET and not a.address.startswith("127.")), None)
    if address is None:
        pytest.skip("this machine has no address but loopback")
    script = tmp_path / "transport.py"
    script.write_text(LINK_TRANSPORT.format(rounds=ROUNDS))
    for share, transport in (("1", "local"), ("0", "tcp")):
        run = run_python(script, timeout=60, env={"FIBERLITE_LISTEN_HOST": address,
                                                  "FIBERLITE_SHARE_MACHINE": share})
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == transport


def test_linked_pipe_carries_bytes_large_objects_and_polls():
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=link_jobs.echo_many_kinds, args=(b,))
    p.start()
    _echo(a, [("obj", i) for i in range(ROUNDS)])
    assert _link_state(a, 1) == forwarder.LINKED
    big = os.urandom(300_000)  # out of band, and used in place when received
    _echo(a, [("obj", big), ("obj", [big, {"k": big[:10]}]), ("obj", None)])
    a.send(("bytes", None))
    a.send_bytes(b"raw bytes", 4)
    assert a.recv_bytes() == b"bytes"
    assert not a.poll(0)
    a.send(("obj", "late"))
    assert a.poll(30)
    assert a.recv() == ("obj", "late")
    a.send(("stop", None))
    assert a.recv() is True
    p.join()


def _idle_reader_left_unread(a, b, read: int, sent: int):
    """Send ``sent`` messages to a job that reads ``read`` of them (over its link if
    that is enough reads to be linked), then keeps its end and leaves the rest unread:
    ``(job, out, stay)``."""
    out, stay = fiberlite.Queue(), fiberlite.Event()
    job = fiberlite.Process(target=link_jobs.read_then_idle, args=(b, read, out, stay))
    job.start()
    for i in range(sent):
        a.send(i)
    assert out.get(timeout=60) == (list(range(read)), read >= ROUNDS)
    return job, out, stay


@pytest.mark.parametrize("read", ["recv", "poll"])
def test_the_owner_reads_a_link_made_between_its_look_and_its_wait(read):
    """The owner found no link, then the job's link came up before the owner's read
    reached its hub: the read goes to the link, where the job's answer comes (and not
    only once the job ends, handing its link back)."""
    a, b = fiberlite.Pipe()
    stay = fiberlite.Event()
    p = fiberlite.Process(target=link_jobs.echo_then_stay, args=(b, ROUNDS + 1, stay))
    p.start()
    _echo(a, range(ROUNDS))
    assert _link_state(a, 1) == forwarder.LINKED
    link_jobs.looks_before_the_link_is_made(get_hub().servant(a._ref.oid))
    a.send("over the link")
    try:
        if read == "poll":
            assert a.poll(20), "the answer that came over the link was not seen"
        else:
            got = []
            reading = threading.Thread(target=lambda: got.append(a.recv()), daemon=True)
            reading.start()
            reading.join(20)
            assert got, "the answer that came over the link was not read"
        assert _link_state(a, 1) == forwarder.LINKED
    finally:
        stay.set()
    assert (got[0] if read == "recv" else a.recv()) == "over the link"
    p.join()


def test_a_second_reader_gets_exactly_what_the_linked_reader_left():
    a, b = fiberlite.Pipe()
    first, out, stay = _idle_reader_left_unread(a, b, 20, 50)
    # a new job reads the end the first one still holds, with 30 messages it was sent
    second = fiberlite.Process(target=link_jobs.read_then_idle, args=(b, 30, out, stay))
    second.start()
    items, _ = out.get(timeout=60)
    assert items == list(range(20, 50))
    stay.set()
    first.join()
    second.join()


def test_the_owner_reads_what_an_idle_linked_reader_left():
    a, b = fiberlite.Pipe()
    p, _, stay = _idle_reader_left_unread(a, b, 15, 25)
    assert [b.recv() for _ in range(10)] == list(range(15, 25))
    assert not b.poll(0)
    stay.set()
    p.join()


def test_closing_a_linked_end_leaves_its_unread_messages_in_the_pipe():
    a, b = fiberlite.Pipe()
    out = fiberlite.Queue()
    p = fiberlite.Process(target=link_jobs.read_then_close, args=(b, 12, out))
    p.start()
    for i in range(20):
        a.send(i)
    assert out.get(timeout=60) == (list(range(12)), True)
    p.join()
    assert [b.recv() for _ in range(8)] == list(range(12, 20))


def test_a_linked_reader_can_wait_and_poll_on_its_end():
    a, b = fiberlite.Pipe()
    out = fiberlite.Queue()
    p = fiberlite.Process(target=link_jobs.link_then_wait, args=(b, out))
    p.start()
    _echo(a, range(ROUNDS))
    assert out.get(timeout=60) == ("linked", True, False)
    a.send("wake")
    assert out.get(timeout=60) == ("woken", True, "wake", False)  # read through the hub now
    a.send("polled")
    assert out.get(timeout=60) == ("poll", True, "polled")
    p.join()


def test_what_a_killed_linked_job_sent_is_read_before_eof():
    a, b = fiberlite.Pipe()
    out, stay = fiberlite.Queue(), fiberlite.Event()
    p = fiberlite.Process(target=link_jobs.link_then_send_and_stall, args=(b, 5, out, stay))
    p.start()
    b.close()
    _echo(a, range(ROUNDS))
    assert out.get(timeout=60) is True  # linked, and the 5 messages are sent
    p.kill()
    p.join()
    assert [a.recv() for _ in range(5)] == [("extra", i) for i in range(5)]
    with pytest.raises(EOFError):
        a.recv()


def test_a_linked_reader_reads_the_rest_then_eof():
    a, b = fiberlite.Pipe()
    out = fiberlite.Queue()
    p = fiberlite.Process(target=link_jobs.link_then_read_to_eof, args=(b, out))
    p.start()
    b.close()
    _echo(a, range(ROUNDS))
    for i in range(3):
        a.send(("last", i))
    a.close()
    assert out.get(timeout=60) == (True, [("last", i) for i in range(3)])
    p.join()


def test_messages_beyond_what_a_link_holds_go_through_the_pipe_in_order():
    a, b = fiberlite.Pipe()
    out, go = fiberlite.Queue(), fiberlite.Event()
    p = fiberlite.Process(target=link_jobs.link_then_stall_then_read, args=(b, go, out))
    p.start()
    _echo(a, range(ROUNDS))
    assert out.get(timeout=60) is True
    block = b"x" * 4096
    sent = []
    while _link_state(a, 1) == forwarder.LINKED:  # the job reads nothing: the link fills up
        assert len(sent) < 100_000, "the link never filled up"
        sent.append(len(sent))
        a.send((sent[-1], block))
    for i in range(10):  # and more after it: through the pipe
        sent.append(len(sent))
        a.send((sent[-1], block))
    a.send(None)
    go.set()
    items, _ = out.get(timeout=60)  # (it may be linked again by the end: nobody competes)
    assert [i for i, _ in items] == sent
    p.join()


def test_an_end_held_by_another_job_is_not_linked():
    a, b = fiberlite.Pipe()
    holder, _, stay = _idle_reader_left_unread(a, b, 0, 0)
    reader = fiberlite.Process(target=link_jobs.echo_then_report, args=(b, 40))
    reader.start()
    _echo(a, range(40))
    assert a.recv() == ("linked", False)
    assert _link_state(a, 1) is None
    reader.join()
    stay.set()
    holder.join()


# -- the link's own handshake, on each transport a link uses ----------------------------------
@pytest.fixture(params=["local", "tcp"])
def transport(request, monkeypatch):
    """Links between jobs of one machine are Unix sockets, the others TCP. A Unix
    socket's or a TCP link's listener waits for a peer that proves the key until its
    handshake time is up (shortened here: the tests wait for that end)."""
    if request.param == "local":
        if not available():
            pytest.skip("local links are Linux's")
        monkeypatch.setattr(local_link, "HANDSHAKE_TIMEOUT", 1.0)
    else:
        monkeypatch.setattr(tcp_link, "HANDSHAKE_TIMEOUT", 1.0)
        monkeypatch.setattr(nng_link, "HANDSHAKE_TIMEOUT_MS", 1000)
    return request.param


def _listen(key: bytes, transport: str):
    link = links.listen("127.0.0.1", key, use_tls=False, same_machine=transport == "local")
    assert link.address.startswith(LOCAL if transport == "local" else "tcp://")
    return link


def _accept_in_thread(link, key: bytes) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(link.accept(key)))
    thread.start()
    return thread, result


def test_a_link_peer_without_the_key_is_refused_both_ways(transport):
    key = identity.key()
    listener = _listen(key, transport)
    thread, accepted = _accept_in_thread(listener, key)
    with pytest.raises(AuthenticationError):
        links.dial(listener.address, os.urandom(32))
    thread.join()
    assert accepted == [False]
    listener.close()

    impostor = _listen(os.urandom(32), transport)
    thread, accepted = _accept_in_thread(impostor, os.urandom(32))
    with pytest.raises(AuthenticationError):
        links.dial(impostor.address, key)  # it cannot prove the run's key: nothing is sent to it
    thread.join()
    impostor.close()


def test_a_link_never_unpickles_what_an_unauthenticated_peer_sends(tmp_path, transport):
    key = identity.key()
    marker = tmp_path / "unpickled"
    frame = frames.item_frame(fiberlite.wire.codec.Payload(pickle.dumps(Trace(str(marker)))))
    if transport == "tcp":   # nng's link too (what links with TLS are), dialed by nng itself
        listener = NngLink.listen("127.0.0.1", key, False)
        thread, accepted = _accept_in_thread(listener, key)
        with pytest.raises(pynng.NNGException):   # an nng peer is closed before nng's greeting
            with pynng.Pair0(dial=listener.address.removeprefix("nng+")) as attacker:
                attacker.send(frame)
        thread.join()
        assert accepted == [False]
        listener.close()

    listener = _listen(key, transport)
    thread, accepted = _accept_in_thread(listener, key)
    with _raw_connection(listener.address) as attacker:   # the frame alone, on a plain socket
        attacker.sendall(frame)
        thread.join()
        try:
            assert attacker.recv(1) == b""   # closed, nothing answered
        except ConnectionResetError:
            pass   # closed with the frame unread
    assert accepted == [False]
    assert not marker.exists()
    listener.close()


def _raw_connection(address: str) -> socket.socket:
    if address.startswith(LOCAL):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect("\0" + address[len(LOCAL):])
        return sock
    return socket.create_connection(host_port(address.removeprefix("nng+")), timeout=10)


TLS_SCRIPT = """
import fiberlite
from fiberlite.runtime.lanes import shared
from fiberlite.runtime.links import reader as pipelink
shared.enabled = lambda: False  # a pipe without lanes: its link is what is tested

def echo(conn):
    for _ in range(30):
        conn.send(conn.recv())
    reader = pipelink.reader_of(conn._ref, conn._end)
    conn.send(None if reader is None else reader.link.address.split(":")[0])

if __name__ == "__main__":
    a, b = fiberlite.Pipe()
    p = fiberlite.Process(target=echo, args=(b,))
    p.start()
    for i in range(30):
        a.send(i)
        assert a.recv() == i
    print(a.recv(), flush=True)
    p.join(60)
"""


def test_with_tls_the_link_uses_tls_too(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(TLS_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], env=dict(os.environ, FIBERLITE_TLS="1"),
                         capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tls+tcp"


def test_a_job_whose_pipe_owner_is_gone_drops_its_link_without_waiting():
    key = identity.key()
    listener = links.listen("127.0.0.1", key, use_tls=False, same_machine=available())
    thread, accepted = _accept_in_thread(listener, key)
    owner_side = links.dial(listener.address, key)
    thread.join()
    assert accepted == [True]
    gone = fiberlite.runtime.hub.ObjectRef("tcp://127.0.0.1:9", 1)  # nothing listens there
    reader = pipelink.LinkedReader(gone, 0, listener, token=12345)
    pipelink._readers[(gone.address, gone.oid, 0)] = reader
    owner_side.send(frames.item_frame(fiberlite.wire.codec.Payload.pack("unread")))
    pipelink.unlink_own(gone, 0)  # the owner cannot be asked: the job ends the link itself
    assert pipelink.reader_of(gone, 0) is None
    owner_side.close()
