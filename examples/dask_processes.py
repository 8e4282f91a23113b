"""dask on fiberlite: its "processes" scheduler runs on a fiberlite executor.

Set PYTHONHASHSEED before the workers start when a computation hashes strings across
workers (a bag's groupby): dask does so for the pool it makes itself, not for a pool it
is given."""
import dask
import dask.array as da

from fiberlite.futures import ProcessPoolExecutor

if __name__ == "__main__":
    with ProcessPoolExecutor(max_workers=2) as executor:
        with dask.config.set(scheduler="processes", pool=executor):
            x = da.arange(1_000_000, chunks=100_000)
            print("sum of squares:", int((x ** 2).sum().compute()))
            y = da.ones((2000, 2000), chunks=(500, 500))
            print("trace of y @ y.T:", float((y @ y.T).trace().compute()))
