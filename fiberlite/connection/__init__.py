"""Connections between jobs (``multiprocessing.connection``).

- :mod:`.pipe`: ``Pipe()`` and ``Connection``, two ends that may live in any two jobs;
  :mod:`.servant`: the pipe's side in the hub of the process that created it;
- :mod:`.waiting`: ``wait()``, for several connections (and other waitable objects) at
  once; :mod:`.readiness`: how a process learns that an end has become readable;
- :mod:`.listener`: ``Listener`` and ``Client``, jobs that find each other by address.
"""
from ..errors import AuthenticationError, BufferTooShort
from .listener import Client, Listener, SocketConnection, default_family, families
from .pipe import Connection, Pipe
from .waiting import wait

__all__ = ["Pipe", "Connection", "wait", "Listener", "Client", "SocketConnection",
           "AuthenticationError", "BufferTooShort", "families", "default_family"]
