"""Value, Array, RawValue and RawArray, in one process and across jobs: mapped in the jobs
of the creator's machine, reached through its hub from the others (``machine_path``)."""
from __future__ import annotations

import ctypes
import os
import queue
import threading

import pytest

import fiberlite
from fiberlite.synchronize import Lock, RLock

pytestmark = pytest.mark.timeout(60)

WAIT = 30


class Point(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_double)]


# -- targets run by child jobs ----------------------------------------------------------------
def increment(v, n):
    for _ in range(n):
        with v.get_lock():
            v.value += 1


def double_all(arr, text, out):
    arr[:] = [x * 2 for x in arr[:]]
    text.value = b"from child"
    out.put((len(arr), arr[-1], text.raw[:10]))


def set_value(v, value, out):
    v.value = value
    out.put("done")


def hold_lock_then_set(v, held, go):
    with v.get_lock():
        held.put("held")
        go.wait(WAIT)
        v.value = 5


def _start(target, *args):
    p = fiberlite.Process(target=target, args=args)
    p.start()
    return p


# -- in one process ---------------------------------------------------------------------------
def test_value_typecodes_and_ctypes_semantics():
    assert fiberlite.Value("i").value == 0
    assert fiberlite.Value("d", 1.5).value == 1.5
    assert fiberlite.Value(ctypes.c_int, 7).value == 7
    assert fiberlite.Value("c", b"x").value == b"x"
    small = fiberlite.Value("b", 127)
    small.value += 1
    assert small.value == -128  # wraps as the ctypes type does
    v = fiberlite.Value("i", 3)
    assert repr(v) == "<Synchronized wrapper for c_int(3)>"
    with pytest.raises(TypeError):
        v.value = 1.5
    with pytest.raises(TypeError, match="typecode"):
        fiberlite.Value("x")
    with pytest.raises(AttributeError, match="has no method 'acquire'"):
        fiberlite.Value("i", lock=5)
    p = fiberlite.Value(Point, 1, 2.5)
    assert (p.x, p.y) == (1, 2.5)
    p.x = 4
    assert p.x == 4


def test_locks_of_value_and_array():
    v = fiberlite.Value("i")
    lock = v.get_lock()
    assert isinstance(lock, RLock) and v.get_lock() is lock
    with v.get_lock():
        with v:  # the wrapper's own acquire/release use the same lock
            v.value += 1  # an RLock: the holder may access
    assert v.get_obj().value == 1
    raw = fiberlite.Value("i", lock=False)
    assert not hasattr(raw, "get_lock")
    raw.value = 9
    assert raw.value == 9
    mine = Lock()
    arr = fiberlite.Array("i", 3, lock=mine)
    assert arr.get_lock() is mine
    other = threading.Lock()  # a lock the hub cannot see is held around each access
    w = fiberlite.Value("i", lock=other)
    w.value = 2
    assert w.value == 2 and not other.locked()


def test_array_indexing_slicing_and_strings():
    arr = fiberlite.Array("i", 5)
    assert len(arr) == 5 and arr[:] == [0] * 5
    arr[0] = 3
    arr[-1] = 4
    arr[1:3] = [7, 8]
    assert arr[:] == [3, 7, 8, 0, 4] and arr[1:4:2] == [7, 0] and list(arr) == arr[:]
    with pytest.raises(IndexError):
        arr[5]
    init = fiberlite.Array(ctypes.c_double, [1.0, 2.0])
    assert init[:] == [1.0, 2.0] and len(init) == 2
    s = fiberlite.Array("c", b"hello")
    assert s.value == b"hello" and s.raw == b"hello" and s[1] == b"e" and list(s)[0] == b"h"
    s.value = b"hi"
    assert s.value == b"hi" and s.raw == b"hi\x00lo"
    raw = fiberlite.RawArray("d", 3)
    assert raw[:] == [0.0, 0.0, 0.0] and not hasattr(raw, "get_lock")
    assert fiberlite.RawValue("i", 4).value == 4
    assert "c_int" in repr(fiberlite.RawValue("i", 4))


# -- across jobs ------------------------------------------------------------------------------
def test_four_jobs_incrementing_under_get_lock_count_exactly(machine_path):
    v = fiberlite.Value("i", 0)
    jobs = [_start(increment, v, 200) for _ in range(4)]
    for p in jobs:
        p.join(WAIT)
        assert p.exitcode == 0
    assert v.value == 800


def test_child_reads_and_writes_arrays(machine_path):
    arr, text, out = fiberlite.RawArray("i", range(10)), fiberlite.Array("c", 16), fiberlite.Queue()
    p = _start(double_all, arr, text, out)
    assert out.get(timeout=WAIT) == (10, 18, b"from child")
    p.join(WAIT)
    assert arr[:] == [2 * i for i in range(10)]
    assert text.value == b"from child"


def test_synchronized_access_from_child_waits_for_the_lock(machine_path):
    v, out = fiberlite.Value("i", 0), fiberlite.Queue()
    with v.get_lock():
        p = _start(set_value, v, 1, out)
        with pytest.raises(queue.Empty):
            out.get(timeout=0.5)  # the child's write waits for the parent's lock
        assert v.value == 0
    assert out.get(timeout=WAIT) == "done"
    assert v.value == 1
    p.join(WAIT)


def test_creator_access_waits_while_a_child_holds_the_lock(machine_path):
    v, held, go = fiberlite.Value("i", 0), fiberlite.Queue(), fiberlite.Event()
    p = _start(hold_lock_then_set, v, held, go)
    assert held.get(timeout=WAIT) == "held"
    seen = []
    reader = threading.Thread(target=lambda: seen.append(v.value))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive() and v.get_obj().value == 0  # the raw object never waits
    go.set()
    reader.join(WAIT)
    assert seen == [5]
    p.join(WAIT)


def test_value_travels_through_a_queue(machine_path):
    v, q, out = fiberlite.Value("d", 0.5), fiberlite.Queue(), fiberlite.Queue()
    q.put(v)
    same = q.get(timeout=WAIT)
    assert ctypes.addressof(same.get_obj()) == ctypes.addressof(v.get_obj()) and same.value == 0.5
    p = _start(set_value, same, 2.5, out)
    assert out.get(timeout=WAIT) == "done"
    p.join(WAIT)
    assert v.value == 2.5


def copy_in_child(arr, point, out, done):
    from fiberlite.sharedctypes import copy
    arr_copy, point_copy = copy(arr), copy(point)
    arr[:] = [0] * len(arr)             # the copies do not follow the originals
    point.x = 0
    out.put((arr_copy[:], point_copy.x, point_copy.y, arr_copy, isinstance(arr_copy, ctypes.Array)))
    done.wait(WAIT)                     # what it made lives as long as it does


def test_copy_here_and_in_a_job(machine_path):
    from fiberlite.sharedctypes import copy
    arr = fiberlite.Array("i", [1, 2, 3])
    point = fiberlite.RawValue(Point, 4, 2.5)
    here = copy(arr)
    arr[0] = 9
    assert here[:] == [1, 2, 3] and not hasattr(here, "get_lock")
    plain = copy(Point(7, 1.5))            # a plain ctypes object, as the stdlib allows
    assert (plain.x, plain.y) == (7, 1.5)
    out, done = fiberlite.Queue(), fiberlite.Event()
    p = fiberlite.Process(target=copy_in_child, args=(arr, point, out, done))
    p.start()
    items, x, y, copy_here, real = out.get(timeout=WAIT)
    # the job's copies are made where it stands: in its own memory when it maps the
    # parent's, in the parent (the proxy asks its creator) when it cannot
    assert (items, x, y, real) == ([9, 2, 3], 4, 2.5, machine_path == "shared")
    assert copy_here[:] == [9, 2, 3]        # the copy made by the job reached this process
    done.set()
    p.join(WAIT)
    assert arr[:] == [0, 0, 0] and point.x == 0
    with pytest.raises(TypeError, match="ctypes object or a shared Value/Array"):
        copy([1, 2, 3])


# -- the memory itself ------------------------------------------------------------------------
def fill_through_numpy(arr, value, out):
    import numpy
    view = numpy.frombuffer(arr.get_obj(), dtype=numpy.float64)
    view[:] = value
    out.put(float(view.sum()))


def test_a_child_writes_through_a_numpy_view_and_the_parent_sees_it():
    numpy = pytest.importorskip("numpy")
    arr, out = fiberlite.Array("d", 1000), fiberlite.Queue()
    p = _start(fill_through_numpy, arr, 2.5, out)
    assert out.get(timeout=WAIT) == 2500.0
    p.join(WAIT)
    assert p.exitcode == 0
    mine = numpy.frombuffer(arr.get_obj(), dtype=numpy.float64)
    assert (mine == 2.5).all() and arr[0] == 2.5
    raw = fiberlite.RawArray("i", 4)
    memoryview(raw).cast("B")[0] = 7        # the buffer protocol, on shared memory
    assert raw[0] == 7


def report_kind(obj, out):
    out.put((isinstance(obj, ctypes.Array), len(obj), obj[:]))


def test_a_raw_array_is_a_ctypes_array_in_a_child_of_this_machine(machine_path):
    arr, out = fiberlite.RawArray("i", [1, 2, 3]), fiberlite.Queue()
    p = _start(report_kind, arr, out)
    # mapped: a real ctypes array; through the hub: a proxy that reads the same memory
    assert out.get(timeout=WAIT) == (machine_path == "shared", 3, [1, 2, 3])
    p.join(WAIT)


def test_a_plain_ctypes_object_still_travels_by_value():
    shared = fiberlite.RawValue("i", 5)  # (its type is now pickled by the shared reduction)
    q = fiberlite.Queue()
    q.put(ctypes.c_int(9))
    got = q.get(timeout=WAIT)
    assert got.value == 9 and ctypes.addressof(got) != ctypes.addressof(shared)


def test_an_array_larger_than_the_memory_left_is_refused_at_once():
    """The stdlib zero-fills an Array as it makes it: one larger than the machine's memory
    fails then (or never finishes). Its memory here comes as it is written, so without a
    check it would be made at once, and its process killed by SIGBUS at a later write."""
    from fiberlite.runtime.shm import room
    left = room.available()
    assert left is not None, "Linux tells the memory available"
    items = (left // ctypes.sizeof(ctypes.c_int)) * 4  # four times what is left
    with pytest.raises(MemoryError, match=r"cannot allocate .* of shared memory.*available"):
        fiberlite.Array("i", items)
    with pytest.raises(MemoryError, match="Make it smaller"):
        fiberlite.RawArray("b", left + (1 << 30))


def test_a_large_array_gets_its_memory_as_it_is_made():
    """What it will be written to is reserved now: a machine short of memory fails here,
    with an error, not later at a write."""
    from fiberlite.runtime.shm.arena import arena
    size = 8 << 20
    arr = fiberlite.RawArray("b", size)
    (segment,) = [s for s in arena()._segments.values() if s.size >= size]
    assert os.fstat(segment.fd).st_blocks * 512 >= size, "the memory was left to come at writes"
    assert arr[0] == 0 and arr[size - 1] == 0
    arr[size - 1] = 7
    assert arr[size - 1] == 7


def test_a_small_value_s_segment_gets_its_memory_as_it_is_made():
    """A small Value comes from a shared 1 MiB segment: all of it is reserved when the
    segment is made, so that later blocks cut from it never fault for want of memory."""
    from fiberlite.runtime.shm.arena import SEGMENT_SIZE, arena
    value = fiberlite.Value("i", 5)
    small = [s for s in arena()._small if s.fd >= 0]
    assert small, "no shared small-block segment was made"
    for segment in small:
        assert segment.size == SEGMENT_SIZE
        assert os.fstat(segment.fd).st_blocks * 512 >= SEGMENT_SIZE, "the memory was left to come at writes"
    value.value += 1
    assert value.value == 6
