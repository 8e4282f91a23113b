"""A channel lends what a job gets through the hub until the job's receipt: what is still
lent when the job's connection ends goes back to the front, in its order, for the next
reader; what was confirmed does not; the owner's own reads borrow nothing; a read
interrupted by Ctrl-C keeps nothing. A job's get may take a batch of items: each receipt
confirms its next item, and what it holds counts as in the queue until then."""
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
        self.answered = False

    def reply(self, value=None) -> None:
        self.value, self.answered = value, True

    def fail(self, exc) -> None:
        self.value, self.answered = exc, True


def get(channel: Channel, peer: int, most: int = 0) -> Answer:
    request = Answer(peer)
    for action in channel.get(request, True, None, schedule=None, most=most):
        action()
    return request


def put(channel: Channel, item) -> Answer:
    request = Answer(LOCAL_PEER)
    for action in channel.put(request, item, True, None, schedule=None):
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


def test_a_batch_is_lent_under_one_ticket_and_each_receipt_confirms_its_next_item():
    channel = Channel()
    for item in "abcde":
        put(channel, item)
    ticket, batch = get(channel, 7, most=3).value
    assert batch == ["a", "b", "c"]
    assert list(channel.items) == ["d", "e"]
    assert channel.size() == 5  # what the job holds is still in the queue
    channel.confirm(7, ticket)  # a
    channel.confirm(7, ticket)  # b
    assert channel.size() == 3 and channel.batched == 1
    for action in channel.drop_peer(7):  # the job is lost holding c
        action()
    assert list(channel.items) == ["c", "d", "e"] and channel.batched == 0
    assert not channel.lent
    assert get(channel, 8, most=10).value[1] == ["c", "d", "e"]  # no more than there is


def test_a_batch_given_back_goes_to_the_front_first_lent_first():
    channel = Channel()
    for item in "abcdefg":
        put(channel, item)
    first, _ = get(channel, 7, most=2).value  # a, b
    second, _ = get(channel, 7, most=2).value  # c, d
    single = get(channel, 7).value  # e, lent alone
    channel.confirm(7, first)  # a taken
    for action in channel.give_back(7, [second, first]):
        action()
    assert list(channel.items) == ["b", "c", "d", "f", "g"]
    assert channel.lent == {7: {single[0]: "e"}}  # (not given back: not asked for)
    assert channel.batched == 0
    waiting = get(channel, 9, most=4)
    assert waiting.value[1] == ["b", "c", "d", "f"]
    for action in channel.hand_back(9, waiting.value[0]):  # an interrupted read's batch
        action()
    assert list(channel.items) == ["b", "c", "d", "f", "g"]


def test_a_bounded_channel_counts_a_held_batch_until_its_receipts():
    channel = Channel(maxsize=2)
    put(channel, "a")
    put(channel, "b")
    ticket, batch = get(channel, 7, most=2).value
    assert batch == ["a", "b"]
    waiting = put(channel, "c")
    assert not waiting.answered  # no room: the job holds both
    for action in channel.confirm(7, ticket):  # a taken: room for c
        action()
    assert waiting.answered and list(channel.items) == ["c"]
    assert channel.full()  # b, held, and c


def test_a_read_waits_for_the_items_another_job_holds_as_they_are_older():
    channel = Channel()
    for item in "abcd":
        put(channel, item)
    ticket, batch = get(channel, 7, most=2).value  # a, b held by job 7
    waiting = get(channel, 8, most=4)
    assert not waiting.answered  # c is newer than what job 7 holds
    assert channel.held_elsewhere() == [7]
    now = Answer(9)  # a get that does not wait takes what is there... unless reads wait
    for action in channel.get(now, False, None, schedule=None):
        action()
    assert isinstance(now.value, Exception)  # (as multiprocessing's: another read waits)
    channel.confirm(7, ticket)  # a taken
    for action in channel.give_back(7, [ticket]):  # b given back: to the waiting read first
        action()
    assert waiting.value[1] == ["b", "c", "d"]
    assert channel.held_elsewhere() == []


def test_a_get_that_does_not_wait_takes_what_is_there_past_held_items():
    channel = Channel()
    for item in "abc":
        put(channel, item)
    get(channel, 7, most=2)  # a, b held by job 7
    now = Answer(9)
    for action in channel.get(now, False, None, schedule=None):
        action()
    assert now.value[1] == "c"


class RecallRef:
    """Stands for a job's ref for recalls: notes what it is asked."""

    def __init__(self) -> None:
        self.asked: list = []

    def cast(self, method: str, *args) -> None:
        self.asked.append(method)


def test_the_owner_asks_a_holder_once_for_its_batch_when_a_read_waits_for_it():
    servant = QueueServant(0)
    for item in "abc":
        servant.op_put(Answer(LOCAL_PEER), item)
    holder_ref, other_ref = RecallRef(), RecallRef()
    holder = Answer(7)
    servant.op_receive_many(holder, GET, holder_ref, 2)
    assert holder.value[1] == ["a", "b"] and holder_ref.asked == []
    waiting, also_waiting = Answer(8), Answer(LOCAL_PEER)
    servant.op_receive_many(waiting, GET, other_ref, 4)
    servant.op_get(also_waiting, True, None)
    assert holder_ref.asked == ["recall"] and other_ref.asked == []  # once, and only the holder
    assert not waiting.answered and not also_waiting.answered
    servant.op_give_back(Answer(7), GET, [holder.value[0]])  # a, b: it took neither
    assert waiting.value[1] == ["a", "b", "c"]
    servant.op_put(Answer(LOCAL_PEER), "d")
    assert not also_waiting.answered  # job 8 holds a, b, c now: asked in turn
    assert other_ref.asked == ["recall"]
    for _ in range(3):
        servant.op_received(Answer(8), GET, waiting.value[0])  # job 8 took all three
    assert also_waiting.value == "d"
