"""Connections between jobs (``multiprocessing.connection``).

- :mod:`.pipe`: ``Pipe()`` and ``Connection``, two ends that may live in any two jobs,
  and ``wait()``;
- :mod:`.listener`: ``Listener`` and ``Client``, jobs that find each other by address.
"""
from ..errors import AuthenticationError, BufferTooShort
from .listener import Client, Listener, SocketConnection
from .pipe import Connection, Pipe, wait

__all__ = ["Pipe", "Connection", "wait", "Listener", "Client", "SocketConnection",
           "AuthenticationError", "BufferTooShort"]
