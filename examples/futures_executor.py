"""concurrent.futures on fiberlite: the standard library's ProcessPoolExecutor API, every
worker a job on the configured backend (FIBERLITE_BACKEND=docker: containers)."""
import concurrent.futures

import fiberlite
from fiberlite.futures import ProcessPoolExecutor


def collatz_steps(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def check_positive(x):
    if x <= 0:
        raise ValueError(f"{x} is not positive")
    return x


if __name__ == "__main__":
    # mp_context picks the backend, e.g. fiberlite.get_context("kubernetes")
    with ProcessPoolExecutor(max_workers=4, mp_context=fiberlite.get_context()) as executor:
        steps = list(executor.map(collatz_steps, range(1, 10_001), chunksize=500))
        print("longest chain below 10000 starts at", steps.index(max(steps)) + 1)
        futures = {executor.submit(collatz_steps, n): n for n in (27, 97, 871)}
        for future in concurrent.futures.as_completed(futures):
            print(f"collatz_steps({futures[future]}) = {future.result()}")
        try:
            executor.submit(check_positive, -1).result()
        except ValueError as exc:
            print("raised in a worker:", exc, "| remote traceback attached:", exc.__cause__ is not None)
