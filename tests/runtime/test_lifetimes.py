"""How long shared objects stay in their creator's hub (fiberlite.runtime.handles)."""
from __future__ import annotations

import gc
import pickle

import pytest

import fiberlite
import jobs
from fiberlite.runtime.hub import get_hub
from fiberlite.sharedctypes.raw import shared

pytestmark = pytest.mark.timeout(60)


def _served(ref) -> bool:
    return get_hub().servant(ref.oid) is not None


def _ref_of(obj):
    """The servant's reference of a shared object (a Value's: its raw object's)."""
    if hasattr(obj, "get_obj"):
        return shared(obj.get_obj())[1]
    return obj._ref


@pytest.mark.parametrize("make", [fiberlite.Queue, fiberlite.SimpleQueue, fiberlite.JoinableQueue,
                                  fiberlite.Lock, fiberlite.Event, lambda: fiberlite.Value("i", 3)])
def test_dropped_when_the_last_local_handle_goes(make):
    obj = make()
    ref = _ref_of(obj)
    assert _served(ref)
    del obj
    gc.collect()
    assert not _served(ref)


def test_kept_for_a_running_job_then_dropped_when_it_ends():
    q, out = fiberlite.Queue(), fiberlite.Queue()
    go_here, go_there = fiberlite.Pipe()
    p = fiberlite.Process(target=jobs.use_after_go, args=(go_there, q, out))
    p.start()
    ref = q._ref
    del q
    gc.collect()
    assert _served(ref)  # the job may still use it
    go_here.send(None)
    assert out.get(timeout=30) == "through q"
    p.join()
    assert not _served(ref)  # nobody can reach it any more: items and memory freed


def test_a_queue_sent_on_a_queue_is_kept():
    carrier = fiberlite.Queue()
    q = fiberlite.Queue()
    carrier.put(q)  # where it goes next cannot be followed
    ref = q._ref
    del q
    gc.collect()
    assert _served(ref)
    again = carrier.get()
    again.put(5)
    assert again.get() == 5


def test_a_copy_loaded_in_the_creator_counts_as_a_handle():
    lock = fiberlite.Lock()
    copy = pickle.loads(pickle.dumps(lock))
    ref = lock._ref
    del lock
    gc.collect()
    assert _served(ref)
    with copy:
        pass


def test_dropped_after_a_job_that_could_not_start():
    import threading
    q = fiberlite.Queue()
    ref = q._ref
    p = fiberlite.Process(target=jobs.take_args, args=(q, threading.Lock()))
    with pytest.raises(TypeError, match="argument 1"):
        p.start()  # q was pickled, then the lock failed
    del q, p
    gc.collect()
    assert not _served(ref)
