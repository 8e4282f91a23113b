"""Helpers every backend shares (fiberlite.backends.base)."""
from __future__ import annotations

from fiberlite.backends.base import decode_stream


def test_job_output_decoding_keeps_characters_cut_between_chunks():
    data = "héllo → wörld".encode()
    chunks = [data[i:i + 1] for i in range(len(data))] + [b"\xff"]
    assert "".join(decode_stream(chunks)) == "héllo → wörld\ufffd"
