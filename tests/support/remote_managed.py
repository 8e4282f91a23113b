"""What the remote-manager tests serve and register: importable by a manager's server in
a container, where pytest is not installed."""
from __future__ import annotations

import queue

from fiberlite.managers import BaseManager, BaseProxy

_queues: list = []


def shared_queue() -> queue.Queue:
    """One queue per server process, created on first use."""
    if not _queues:
        _queues.append(queue.Queue())
    return _queues[0]


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def add(self, n: int) -> int:
        self.value += n
        return self.value

    def get(self) -> int:
        return self.value

    def double(self) -> "Counter":
        return Counter(self.value * 2)

    def secret(self) -> str:
        return "not exposed"


class CounterProxy(BaseProxy):
    _exposed_ = ("add", "get", "double")

    def add(self, n: int) -> int:
        return self._callmethod("add", (n,))

    def get(self) -> int:
        return self._callmethod("get")

    def double(self):
        return self._callmethod("double")


class QueueManager(BaseManager):
    pass


QueueManager.register("get_queue", callable=shared_queue)
QueueManager.register("Counter", callable=Counter, proxytype=CounterProxy,
                      method_to_typeid={"double": "Counter"})
QueueManager.register("AutoCounter", callable=Counter, exposed=("add", "get"))
QueueManager.register("hidden", callable=Counter, create_method=False)


class QueueClient(BaseManager):
    """What a client registers: names and proxy types only, no callables."""


QueueClient.register("get_queue")
QueueClient.register("Counter", proxytype=CounterProxy)


def put_numbers(address, authkey, first, count):
    """A job of the run that connects to a manager by address and key."""
    client = QueueClient(address=address, authkey=authkey)
    client.connect()
    q = client.get_queue()
    for n in range(first, first + count):
        q.put(n)


