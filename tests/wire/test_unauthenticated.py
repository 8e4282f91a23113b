"""A peer without the run's key costs a listening process bounded memory and descriptors.

The victim is a script mapping on a ``Pool(2)`` (local backend). With raw sockets the
test opens thousands of silent connections to its hub (and goes on opening more) and, on a few more, does nng's
own greeting and announces a message of 1 GiB that it then streams. Meanwhile the
victim maps (the results must be exact) and starts a new job, which must connect. The
victim's memory and descriptors are watched from outside (psutil).
"""
from __future__ import annotations

import collections
import socket
import struct
import subprocess
import textwrap
import threading
import time

import psutil
import pytest

from fiberlite.wire import tls
from interpreters import start_python

pytestmark = pytest.mark.timeout(180)
MiB = 1 << 20
LIMIT = 64             # auth_pending_limit of the victim
SILENT = 3000          # silent connections opened
HUGE = 4               # connections announcing a huge message
ANNOUNCED = 1 << 30    # the size they announce
STREAMED = 128 * MiB   # what each of them tries to send
MEMORY_BOUND = 64 * MiB
JOB_DESCRIPTORS = 16   # what a job the victim starts during the flood may hold meanwhile
SETTLING = 4           # the victim's own descriptors still closing after the job ended

VICTIM = textwrap.dedent("""
    import sys
    import fiberlite
    from fiberlite.runtime.hub import get_hub
    from fiberlite.wire.pickling import dumps_bytes

    def square(x):
        return x * x

    def answer(q):
        q.put("connected")

    if __name__ == "__main__":
        with fiberlite.Pool(2) as pool:
            assert pool.map(square, range(100)) == [x * x for x in range(100)]
            q = fiberlite.Queue()  # (its lane and shared memory, and the door that hands
            dumps_bytes(q)         # them to this machine's jobs, are there before the attack)
            print(get_hub().address, flush=True)
            sys.stdin.readline()                       # the attack is under way
            results = pool.map(square, range(20000), chunksize=50)
            job = fiberlite.Process(target=answer, args=(q,))
            job.start()                                # a job connecting during the flood
            got = q.get(timeout=60)
            job.join(60)
            print("mapped", results == [x * x for x in range(20000)], got, job.exitcode, flush=True)
            sys.stdin.readline()                       # measured
""")


class Watch:
    """The highest RSS and descriptor count of a process, sampled on a thread."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.rss = self.proc.memory_info().rss
        self.fds = self.proc.num_fds()
        self.max_rss, self.max_fds = self.rss, self.fds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.max_rss = max(self.max_rss, self.proc.memory_info().rss)
                self.max_fds = max(self.max_fds, self.proc.num_fds())
            except psutil.Error:
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def silent_flood(address: str, count: int) -> list[socket.socket]:
    """``count`` connections that never send anything (kept open by this side)."""
    host, port = tls.host_port(address)
    opened = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, port))
        opened.append(s)
    return opened


def keep_flooding(address: str, stop: threading.Event, opened: collections.deque, count: list[int]) -> None:
    """New silent connections, a hundred at a time, until ``stop`` (this side keeps the
    last ``SILENT`` open)."""
    while not stop.is_set():
        opened.extend(silent_flood(address, 100))
        count[0] += 100
        while len(opened) > SILENT:
            opened.popleft().close()
        time.sleep(0.01)   # (pacing the attacker: two cores are shared with the victim)


def announce_huge(address: str, sent: list[int]) -> None:
    """nng's greeting as a REQ peer, a 1 GiB message announced, and its bytes streamed
    until the connection ends or ``STREAMED`` went out."""
    chunk = bytes(MiB)
    try:
        with socket.create_connection(tls.host_port(address), timeout=10) as s:
            s.sendall(b"\x00SP\x00\x00\x30\x00\x00" + struct.pack(">Q", ANNOUNCED))
            while sent[0] < STREAMED:
                s.sendall(chunk)
                sent[0] += len(chunk)
    except OSError:
        pass   # closed by the victim


def test_a_flood_without_the_key_costs_bounded_memory_and_descriptors(tmp_path):
    script = tmp_path / "victim.py"
    script.write_text(VICTIM)
    victim = start_python(script, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env={"FIBERLITE_BACKEND": "local", "FIBERLITE_AUTH_PENDING_LIMIT": str(LIMIT)})
    flood: collections.deque[socket.socket] = collections.deque()
    stop = threading.Event()
    flooding = threading.Thread()
    try:
        address = victim.stdout.readline().strip()
        assert address.startswith("tcp://"), address
        watch = Watch(victim.pid)
        sent = [[0] for _ in range(HUGE)]
        senders = [threading.Thread(target=announce_huge, args=(address, s), daemon=True) for s in sent]
        for t in senders:
            t.start()
        flood.extend(silent_flood(address, SILENT))
        opened = [SILENT]
        flooding = threading.Thread(target=keep_flooding, args=(address, stop, flood, opened), daemon=True)
        flooding.start()   # the flood goes on while the victim maps and starts a job
        victim.stdin.write("go\n")
        victim.stdin.flush()
        report = victim.stdout.readline().split()
        stop.set()
        flooding.join(30)
        for t in senders:
            t.join(60)
        fds_now = watch.proc.num_fds()
        watch.stop()
        assert report == ["mapped", "True", "connected", "0"], report
        grown = watch.max_rss - watch.rss
        print(f"{opened[0]} silent connections; victim: RSS +{grown / MiB:.1f} MiB at most, descriptors +{watch.max_fds - watch.fds} "
              f"at most, +{fds_now - watch.fds} with the flood open; streamed before being cut off: "
              f"{max(s[0] for s in sent) / MiB:.0f} MiB")
        assert grown < MEMORY_BOUND, f"RSS grew by {grown / MiB:.0f} MiB"
        assert max(s[0] for s in sent) < STREAMED, "a peer without the key streamed its whole message"
        assert fds_now - watch.fds <= LIMIT + SETTLING, \
            f"{fds_now - watch.fds} more descriptors with the flood open"
        assert watch.max_fds - watch.fds <= LIMIT + JOB_DESCRIPTORS, \
            f"descriptors grew by {watch.max_fds - watch.fds}"
        assert opened[0] > SILENT
    finally:
        stop.set()
        if flooding.is_alive():
            flooding.join(30)
        for s in flood:
            s.close()
        try:
            victim.stdin.write("done\n")
            victim.stdin.close()
        except OSError:
            pass
        victim.wait(60)
    assert victim.returncode == 0


def test_more_clients_at_once_than_the_bound_all_get_in():
    """Peers under way are not cut off to make room for newer ones: those wait in the
    kernel's queue until one is done (and a client cut off before it said anything,
    as a silent connection would be, connects again)."""
    import secrets
    import fiberlite
    from fiberlite import config
    from fiberlite.wire.client import Client
    from fiberlite.wire.server import Server

    key = secrets.token_bytes(32)
    before = config.get("auth_pending_limit")
    fiberlite.init(auth_pending_limit=2)
    server = Server(key, "127.0.0.1", lambda request, message: request.reply(message),
                    lambda peer: None, lambda fn: fn())
    outcomes: list = []

    def connect(i: int) -> None:
        try:
            client = Client(server.address, key)
            outcomes.append(client.request(i))
            client.close()
        except BaseException as exc:
            outcomes.append(exc)
    try:
        threads = [threading.Thread(target=connect, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        assert not failed, failed
        assert sorted(outcomes) == [(True, i) for i in range(40)]
    finally:
        server.close()
        fiberlite.init(auth_pending_limit=before)


def test_a_proven_peer_that_never_hands_over_its_end_is_closed(monkeypatch):
    """After the handshake the listening side's nng greets and waits for the peer's
    greeting; a peer that never sends it is closed after ``HANDOVER_SECONDS``."""
    import secrets
    from fiberlite.wire import auth, doorman, handover
    from fiberlite.wire.server import Server
    from raw_peer import say_hello

    monkeypatch.setattr(doorman, "HANDOVER_SECONDS", 0.5)
    key = secrets.token_bytes(32)
    server = Server(key, "127.0.0.1", lambda request, message: None, lambda peer: None, lambda fn: fn())
    try:
        with socket.create_connection(tls.host_port(server.address), timeout=20) as s:
            nonce, challenge = say_hello(s)
            server_nonce = auth.check_challenge(key, challenge, nonce)
            s.sendall(auth.proof(key, nonce, server_nonce))
            got = b""
            while True:   # WELCOME, nng's greeting, then the end of the connection
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        assert got.startswith(auth.WELCOME + handover.SP_HEADER)
    finally:
        server.close()
