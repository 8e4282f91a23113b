"""Helpers every backend shares (fiberlite.backends.base)."""
from __future__ import annotations

from fiberlite.backends.base import decode_stream, exit_code


def test_job_output_decoding_keeps_characters_cut_between_chunks():
    data = "héllo → wörld".encode()
    chunks = [data[i:i + 1] for i in range(len(data))] + [b"\xff"]
    assert "".join(decode_stream(chunks)) == "héllo → wörld\ufffd"


def test_exit_statuses_of_signalled_processes_become_negative():
    statuses = (0, 1, 3, 127, 128, 129, 137, 143, 192, 193, 255)
    assert [exit_code(s) for s in statuses] == [0, 1, 3, 127, 128, -1, -9, -15, -64, 193, 255]
