"""A channel lends what a job gets through the hub until the job's receipt: what is still
lent when the job's connection ends goes back to the front, in its order, for the next
reader; what was confirmed does not; the owner's own reads borrow nothing."""
from __future__ import annotations

from fiberlite.runtime.links.channel import Channel
from fiberlite.runtime.hub import LOCAL_PEER


class Answer:
    """A request from ``peer``; keeps what it is answered."""

    def __init__(self, peer: int) -> None:
        self.peer = peer
        self.value = None

    def reply(self, value=None) -> None:
        self.value = value

    def fail(self, exc) -> None:
        self.value = exc


def get(channel: Channel, peer: int) -> Answer:
    request = Answer(peer)
    for action in channel.get(request, True, None, schedule=None):
        action()
    return request


def test_items_lent_to_a_lost_reader_go_back_to_the_front_in_order():
    channel = Channel()
    for item in "abcde":
        channel.put(Answer(LOCAL_PEER), item, True, None, schedule=None)
    got = [get(channel, 7).value for _ in range(3)]  # a, b, c lent to peer 7
    assert [item for _, item in got] == ["a", "b", "c"]
    assert len({ticket for ticket, _ in got}) == 3
    channel.confirm(7, got[1][0])  # b is the job's now
    assert get(channel, LOCAL_PEER).value == "d"  # the owner borrows nothing
    waiting = get(channel, 9)  # e, then another reader waits
    assert waiting.value[1] == "e"
    waiting = get(channel, 9)
    assert waiting.value is None
    for action in channel.drop_peer(7):
        action()
    assert waiting.value[1] == "a"  # the waiting reader gets the first given back
    assert list(channel.items) == ["c"]
    assert set(channel.lent) == {9}
    assert channel.enqueued == 5  # given back, not put again (a JoinableQueue's count)
