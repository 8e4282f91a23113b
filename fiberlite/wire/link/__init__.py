"""Links: a direct, authenticated connection between two processes, carrying frames.

The reading process listens (:func:`listen`), the writing one dials it (:func:`dial`);
both prove the run's key (:mod:`fiberlite.wire.auth`) before any frame passes. Two
transports carry links behind one interface (:class:`Link`), and the caller chooses
(:mod:`fiberlite.runtime.machine` knows whether the peer shares this machine):

- :mod:`.nng`: an nng PAIR socket, over TCP (TLS with the ``tls`` setting): any two
  processes that reach each other;
- :mod:`.local`: a Unix stream socket in Linux's abstract namespace, read and written
  by the calling threads themselves: two processes of one machine.

A frame is ``bytes``, or a tuple of bytes-like parts sent as one frame (out-of-band
buffers that are not copied into one message first). The reader acknowledges each
frame it consumed (:meth:`Link.acknowledge`): nng carries acknowledgements in line, a
local link counts them in memory both processes map, so that they wake nobody. A
receive raises
:class:`LinkTimeout`, :class:`LinkCanceled` or :class:`LinkClosed`, never a transport's
own error.
"""
from __future__ import annotations

from .base import ACK, Link, LinkCanceled, LinkClosed, LinkError, LinkTimeout

__all__ = ["ACK", "Link", "LinkError", "LinkTimeout", "LinkCanceled", "LinkClosed", "listen", "dial"]


def listen(host: str, key: bytes, use_tls: bool = False, same_machine: bool = False) -> Link:
    """A listening end for a writer that reaches this process at ``host``: a Unix socket
    when the writer is on this machine (``same_machine``, and no ``use_tls``), else nng."""
    if same_machine and not use_tls:
        from .local import LocalLink, available
        if available():
            return LocalLink.listen(key)
    from .nng import NngLink
    return NngLink.listen(host, key, use_tls)


def dial(address: str, key: bytes) -> Link:
    """Dial the listening end at ``address`` and prove ``key`` (``ConnectionError`` or
    :class:`~fiberlite.errors.AuthenticationError` when that fails)."""
    from .local import SCHEME, LocalLink
    if address.startswith(SCHEME):
        return LocalLink.dial(address, key)
    from .nng import NngLink
    return NngLink.dial(address, key)
