"""fiberlite.joblib: joblib.Parallel on fiberlite workers, compared with the same calls
run serially (scikit-learn's GridSearchCV with it: tests/test_examples.py, joblib_sklearn.py)."""
from __future__ import annotations

import sys

import cloudpickle
import pytest

import fiberlite
import fiberlite.joblib
from jobs import TaskError, fail_on, square, worker_name

joblib = pytest.importorskip("joblib")
np = pytest.importorskip("numpy")

pytestmark = pytest.mark.timeout(120)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def kind_and_sum(array):
    return type(array).__name__, float(array.sum())


class TestOnFiberliteWorkers:
    """One kept executor of 2 workers serves every call (its jobs live until the class ends)."""

    jobs_kept_by_class = True

    @classmethod
    def setup_class(cls):
        fiberlite.joblib.register()

    @classmethod
    def teardown_class(cls):
        fiberlite.joblib.shutdown()
        assert fiberlite.active_children() == []

    def test_parallel_runs_on_fiberlite_workers(self):
        with joblib.parallel_config(backend="fiberlite", n_jobs=2):
            assert joblib.Parallel()(joblib.delayed(square)(i) for i in range(30)) == \
                [i * i for i in range(30)]
            names = joblib.Parallel()(joblib.delayed(worker_name)() for _ in range(4))
        assert all(name.startswith("PoolWorker-") for name in names)

    def test_return_as_generator(self):
        with joblib.parallel_config(backend="fiberlite", n_jobs=2):
            results = joblib.Parallel(return_as="generator")(joblib.delayed(square)(i) for i in range(8))
            assert not isinstance(results, list)
            assert list(results) == [i * i for i in range(8)]
            unordered = joblib.Parallel(return_as="generator_unordered")(
                joblib.delayed(square)(i) for i in range(8))
            assert sorted(unordered) == [i * i for i in range(8)]

    def test_a_tasks_exception_reaches_the_caller_and_the_next_call_works(self):
        with joblib.parallel_config(backend="fiberlite", n_jobs=2):
            with pytest.raises(TaskError, match="bad item 3"):
                joblib.Parallel()(joblib.delayed(fail_on)(i) for i in range(6))
            assert joblib.Parallel()(joblib.delayed(square)(i) for i in range(3)) == [0, 1, 4]

    def test_large_arrays_travel_by_value_not_memory_mapped(self):
        array = np.arange(500_000, dtype=np.float64)  # 4 MB: loky would memory-map it
        with joblib.parallel_config(backend="fiberlite", n_jobs=2, max_nbytes="1M"):
            results = joblib.Parallel()(joblib.delayed(kind_and_sum)(array) for _ in range(3))
        assert results == [("ndarray", float(array.sum()))] * 3


def test_one_job_runs_in_this_process_and_bad_n_jobs_is_refused():
    fiberlite.joblib.register()
    with joblib.parallel_config(backend="fiberlite", n_jobs=1):
        assert joblib.Parallel()(joblib.delayed(worker_name)() for _ in range(2)) == ["MainProcess"] * 2
    with pytest.raises(ValueError, match="n_jobs == 0"):
        with joblib.parallel_config(backend="fiberlite", n_jobs=0):
            joblib.Parallel()(joblib.delayed(square)(1) for _ in range(2))
