"""dask's "processes" scheduler with a fiberlite executor as its pool computes what its
synchronous scheduler computes, on fiberlite workers."""
from __future__ import annotations

import sys

import cloudpickle
import pytest

import fiberlite
from fiberlite.futures import ProcessPoolExecutor
from jobs import TaskError, worker_name

dask = pytest.importorskip("dask")
np = pytest.importorskip("numpy")
import dask.array as da  # noqa: E402
import dask.bag as db  # noqa: E402

pytestmark = pytest.mark.timeout(120)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def refuse(x):
    raise TaskError(f"refused {x}")


class TestProcessesSchedulerOnAFiberliteExecutor:
    jobs_kept_by_class = True

    @classmethod
    def setup_class(cls):
        cls.executor = ProcessPoolExecutor(2)

    @classmethod
    def teardown_class(cls):
        cls.executor.shutdown()
        assert fiberlite.active_children() == []

    def compute(self, *collections):
        with dask.config.set(scheduler="processes", pool=self.executor):
            return dask.compute(*collections)

    def test_arrays_bags_and_delayed_give_the_synchronous_results(self):
        x = da.random.RandomState(0).random_sample((400, 30), chunks=(100, 30))
        gram = x.T @ x
        words = db.from_sequence(["a", "bb", "a", "ccc", "bb", "a"] * 20, npartitions=4)
        lengths = words.map(len).sum()
        counts = words.frequencies()
        names = [dask.delayed(worker_name)(i) for i in range(4)]
        expected = dask.compute(gram, lengths, counts, scheduler="synchronous")
        got_gram, got_lengths, got_counts, got_names = self.compute(gram, lengths, counts, names)
        assert np.allclose(got_gram, expected[0])
        assert got_lengths == expected[1] and sorted(got_counts) == sorted(expected[2])
        assert all(name.startswith("PoolWorker-") for name in got_names)

    def test_a_tasks_exception_reaches_the_caller(self):
        with pytest.raises(TaskError, match="refused 3"):
            self.compute(dask.delayed(refuse)(3))
