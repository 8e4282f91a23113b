"""``Ring``: N jobs that run one function as peers, with collectives between them.

- :mod:`.parent`: the parent side: ``Ring``, which starts the members, and the
  rendezvous where they meet;
- :mod:`.member`: the member side: ``Member``, the ``ring`` a member's target gets;
- :mod:`.inbox`: the servant a member's peers deliver messages to;
- :mod:`.job`: what each member's job runs;
- :mod:`.errors`: ``RingTimeoutError`` and the failure reports members send;
- :mod:`.collectives`: the algorithms, over any transport;
- :mod:`.buffers`: nested data as the flat buffers the algorithms move, and back;
- :mod:`.link` and :mod:`.stream`: the byte streams between ring neighbours.
"""
try:
    import numpy  # noqa: F401
except ImportError:  # pragma: no cover - numpy is in every training environment
    raise ImportError("fiberlite.Ring needs numpy: pip install numpy") from None

from ..errors import RingError
from .errors import RingTimeoutError
from .member import Member
from .parent import Ring

__all__ = ["Ring", "Member", "RingError", "RingTimeoutError"]
