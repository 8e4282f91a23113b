"""``Ring``: N jobs that run one function as peers, with collectives between them.

- :mod:`.ring`: the parent side (``Ring``, the rendezvous) and the member side;
- :mod:`.collectives`: the algorithms, over any transport;
- :mod:`.link` and :mod:`.stream`: the byte streams between ring neighbours.
"""
from ..errors import RingError
from .ring import Member, Ring, RingTimeoutError

__all__ = ["Ring", "Member", "RingError", "RingTimeoutError"]
