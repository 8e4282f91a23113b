"""What a member's job runs: :class:`_MemberMain`, the target of each member's job.

The parent (:mod:`.parent`) starts one job per rank with a ``_MemberMain``. In the
job it runs the initializer, registers the inbox (:mod:`.inbox`), opens the
neighbour link (:mod:`.link`, not with ``tls``), joins the rendezvous, makes the
:class:`~fiberlite.ring.member.Member`, connects, waits until every member is ready,
runs the target, tells its peers it is leaving and reports how it ended to the
rendezvous.
"""
from __future__ import annotations

from typing import Any, Callable

from ..meta import ATTRIBUTE as META_ATTRIBUTE
from ..runtime.dialed import flush
from ..runtime.hub import ObjectRef, get_hub
from ..runtime.machine import machine_id
from ..wire.codec import Payload
from ..wire.tls import host_port, is_tls
from .errors import describe_failure
from .inbox import RingMember
from .link import NeighbourLink
from .member import Member
from .report import CollectiveCounter, Reporter


class _MemberMain:
    """The target of a member's job: rendezvous, run ``target(ring, ...)``, report back."""

    def __init__(self, rendezvous: ObjectRef, rank: int, world_size: int, target: Callable,
                 args: tuple, kwargs: dict, initializer: Callable | None, initargs: tuple,
                 timeout: float | None, report_every: float | None = None) -> None:
        self.rendezvous = rendezvous
        self.rank = rank
        self.world_size = world_size
        self.target = target
        self.args = args
        self.kwargs = kwargs
        self.initializer = initializer
        self.initargs = initargs
        self.timeout = timeout
        self.report_every = report_every  # seconds between reports of its collectives, or None
        self._reporter: Reporter | None = None
        wants = getattr(target, META_ATTRIBUTE, None)
        if wants:  # @fiberlite.meta on the target applies to every member's job
            setattr(self, META_ATTRIBUTE, dict(wants))

    def __call__(self) -> None:
        member = None
        link = None
        try:
            if self.initializer is not None:
                self.initializer(*self.initargs)
            inbox = RingMember()
            hub = get_hub()
            ref = hub.register(inbox)
            if self.world_size > 1 and not is_tls(hub.address):  # listens where the hub does
                link = NeighbourLink(host_port(hub.address)[0])
            table = self.rendezvous.call("join", self.rank, ref, machine_id(),
                                         link.address if link is not None else None)
            member = Member(self.rank, self.world_size, table, inbox, self.rendezvous, self.timeout, link)
            if self.report_every:
                member.counter = CollectiveCounter()
                self._reporter = Reporter(self.rendezvous, self.rank, member.counter,
                                          self.report_every)
            member._connect_partners()
            member._connect_link()
            self.rendezvous.call("ready", self.rank)  # nobody starts before all are connected
            result = self.target(member, *self.args, **self.kwargs)
            member._close()
            try:
                payload = Payload.pack(result)
            except Exception as exc:
                raise TypeError(f"the return value of rank {self.rank} cannot be pickled: {exc}") from exc
        except SystemExit as exc:
            ok = exc.code in (None, 0)
            self._end(member, link, None if ok else exc)
            if ok:
                self._report(True, Payload.pack(None))
            else:
                self._report(False, describe_failure(exc, self.rank))
            raise
        except BaseException as exc:
            self._end(member, link, exc)
            self._report(False, describe_failure(exc, self.rank))
            raise
        self._end(member, link, None)
        self._report(True, payload)

    @staticmethod
    def _end(member: "Member | None", link: NeighbourLink | None, exc: BaseException | None) -> None:
        if member is not None:
            member._close()
            member._farewell(exc)
        if link is not None:
            try:
                # neighbours hear why this rank left before its streams end
                flush()
            except Exception:
                pass
            link.close()

    def _report(self, ok: bool, info: Any) -> None:
        if self._reporter is not None:
            self._reporter.stop()  # the final counts, before the member leaves
        try:
            flush()  # what this member sent has landed before it reports how it ended
        except Exception:
            pass
        try:
            self.rendezvous.call("leave", self.rank, ok, info)
        except Exception:
            pass  # the parent is gone: this job is about to end anyway
