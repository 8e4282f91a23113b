"""The submodules scripts import: ``fiberlite.util``, ``fiberlite.dummy``,
``fiberlite.shared_memory``, ``fiberlite.pool``'s extras."""
from __future__ import annotations

import logging
import time

import pytest

import fiberlite
import fiberlite.dummy
import fiberlite.pool
import fiberlite.util
from fiberlite.shared_memory import ShareableList, SharedMemory, SharedMemoryUnreachable

pytestmark = pytest.mark.timeout(60)


def fill(block, list_, count):
    """In a job: write into a shared block and a shareable list made by the parent."""
    for i in range(count):
        block.buf[i] = i
    list_[0] = "written by the job"
    list_[1] = count


def fill_named(block_name, list_name, count):
    """In a job: attach (by name, with fiberlite's classes) and fill."""
    block, items = SharedMemory(block_name), ShareableList(name=list_name)
    fill(block, items, count)
    block.close()
    items.shm.close()


def report_level(q):
    q.put(fiberlite.util.get_logger().getEffectiveLevel())


def test_shared_memory_is_shared_with_a_job_and_outlives_it():
    block = SharedMemory(create=True, size=256)
    items = ShareableList(["placeholder text here", 0])
    try:
        job = fiberlite.Process(target=fill, args=(block, items, 200))
        job.start()
        job.join(30)
        assert job.exitcode == 0
        assert bytes(block.buf[:200]) == bytes(range(200))       # all 200 written, in place
        assert items[0] == "written by the job" and items[1] == 200
        again = SharedMemory(block.name)    # the job's exit did not unlink the block
        assert bytes(again.buf[:3]) == b"\x00\x01\x02"
        again.close()
    finally:
        items.shm.close()
        items.shm.unlink()
        block.close()
        block.unlink()


def test_a_block_out_of_reach_is_a_clear_error():
    started = time.monotonic()
    with pytest.raises(SharedMemoryUnreachable, match="only jobs on the machine that made it"):
        SharedMemory("fiberlite-no-such-block")
    with pytest.raises(FileNotFoundError):  # still what the stdlib raises
        ShareableList(name="fiberlite-no-such-block")
    assert time.monotonic() - started < 5


def test_the_loggers_level_reaches_jobs():
    logger = fiberlite.util.get_logger()
    saved = logger.level
    q = fiberlite.Queue()
    try:
        logger.setLevel(fiberlite.util.SUBWARNING)
        assert fiberlite.get_logger() is logger and logger.name == "fiberlite"
        job = fiberlite.Process(target=report_level, args=(q,))
        job.start()
        assert q.get(timeout=30) == fiberlite.util.SUBWARNING
        job.join(30)
        assert logging.getLevelName(fiberlite.util.SUBDEBUG) == "SUBDEBUG"
    finally:
        logger.setLevel(saved)
    handler_count = len(logger.handlers)
    fiberlite.log_to_stderr()
    fiberlite.util.log_to_stderr()
    assert len(logger.handlers) <= handler_count + 1   # one stderr handler, however often


def test_thread_backed_api_and_pool_names():
    with fiberlite.dummy.Pool(3) as pool:
        assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
    with fiberlite.pool.ThreadPool(2) as pool:
        assert pool.apply(sum, ([1, 2],)) == 3
    q = fiberlite.dummy.Queue()
    q.put("thread")
    assert q.get() == "thread"
    assert issubclass(fiberlite.pool.RemoteTraceback, Exception)


def test_a_shared_memory_manager_hands_blocks_to_jobs_and_unlinks_them():
    from fiberlite.managers import SharedMemoryManager
    with SharedMemoryManager() as smm:
        block, items = smm.SharedMemory(size=64), smm.ShareableList(["placeholder text here", 0])
        job = fiberlite.Process(target=fill_named, args=(block.name, items.shm.name, 10))
        job.start()
        job.join(30)
        assert job.exitcode == 0
        assert bytes(block.buf[:10]) == bytes(range(10)) and items[1] == 10
        name = block.name
    with pytest.raises(FileNotFoundError):  # unlinked when the manager shut down
        SharedMemory(name)
