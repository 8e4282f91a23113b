"""fiberlite.failure: an exception raised in one job, as pools, managers and rings report it."""
from __future__ import annotations

import pickle
import threading

from fiberlite.errors import RemoteTraceback
from fiberlite.failure import Failure


class HoldsALock(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()  # cannot be pickled


class BreaksWhenLoaded(Exception):
    def __reduce__(self):
        return (_refuse, (str(self),))


def _refuse(message):
    raise RuntimeError(f"cannot make {message!r} here")


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def travelled(failure: Failure) -> Failure:
    return pickle.loads(pickle.dumps(failure))


def test_an_exception_comes_back_with_its_type_and_remote_traceback():
    failure = travelled(Failure.of(_raised(KeyError("missing key"))))
    exc = failure.rebuild()
    assert type(exc) is KeyError and exc.args == ("missing key",)
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "_raised" in exc.__cause__.tb and "KeyError: 'missing key'" in exc.__cause__.tb
    assert (failure.type_name, failure.message) == ("KeyError", "'missing key'")


def test_one_that_cannot_be_pickled_becomes_the_stand_in_saying_why():
    failure = travelled(Failure.of(_raised(HoldsALock("held"))))
    assert failure.pickled is None and "lock" in failure.why
    stand_in = failure.rebuild(lambda f: RuntimeError(f"{f.type_name}: {f.message}"))
    assert type(stand_in) is RuntimeError and str(stand_in) == "HoldsALock: held"
    assert isinstance(stand_in.__cause__, RemoteTraceback)
    alone = failure.rebuild()  # no stand-in: the remote traceback itself
    assert isinstance(alone, RemoteTraceback) and "HoldsALock: held" in alone.tb


def test_one_that_cannot_be_unpickled_here_says_so():
    failure = travelled(Failure.of(_raised(BreaksWhenLoaded("fragile"))))
    assert failure.pickled is not None
    assert failure.exception() is None
    assert "could not be unpickled here" in failure.why and "fragile" in failure.why
    assert "BreaksWhenLoaded" in failure.shown
