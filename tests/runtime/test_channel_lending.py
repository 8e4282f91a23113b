"""A channel lends what a job gets through the hub until the job's receipt: what is still
lent when the job's connection ends goes back to the front, in its order, for the next
reader; what was confirmed does not; the owner's own reads borrow nothing; a read
interrupted by Ctrl-C keeps nothing."""
from __future__ import annotations

from fiberlite.queues import GET, QueueServant
from fiberlite.runtime.links.channel import Channel
from fiberlite.runtime.links.frames import RETRY
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


def test_a_read_interrupted_through_the_hub_is_answered_and_its_item_handed_back():
    """Ctrl-C in a job's read through the hub: the servant answers the job's waiting
    reads RETRY at once (``withdraw``); an item lent to the read meanwhile goes back to
    the front (``hand_back``), so the next reader gets it."""
    servant = QueueServant(0)
    interrupted, other_job = Answer(7), Answer(8)
    servant.op_get(interrupted, True, None)
    servant.op_get(other_job, True, None)
    servant.op_withdraw(Answer(7), GET)
    assert interrupted.value is RETRY and other_job.value is None  # only job 7's read
    servant.op_put(Answer(LOCAL_PEER), "a")
    assert other_job.value[1] == "a"
    servant.op_put(Answer(LOCAL_PEER), "b")
    servant.op_put(Answer(LOCAL_PEER), "c")
    lent = Answer(7)
    servant.op_get(lent, True, None)
    assert lent.value[1] == "b"
    servant.op_hand_back(Answer(7), GET, lent.value[0])
    assert 7 not in servant.channel.lent
    assert [get(servant.channel, 9).value[1] for _ in range(2)] == ["b", "c"]  # in order
    assert servant.channel.enqueued == 3  # handed back, not put again
