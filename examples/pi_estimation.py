"""Estimate pi with a Pool: each task throws darts at the unit square.

    python examples/pi_estimation.py [tasks] [darts_per_task]
    FIBERLITE_BACKEND=docker FIBERLITE_IMAGE=fiberlite python examples/pi_estimation.py
"""
import random
import sys

import fiberlite as mp


def darts_inside(args):
    """How many of ``n`` random darts land inside the quarter circle."""
    seed, n = args
    rng = random.Random(seed)
    return sum(1 for _ in range(n) if rng.random() ** 2 + rng.random() ** 2 <= 1.0)


def estimate_pi(tasks: int = 40, darts: int = 20_000, processes: int = 4) -> float:
    with mp.Pool(processes) as pool:
        inside = sum(pool.imap_unordered(darts_inside, ((seed, darts) for seed in range(tasks))))
    return 4.0 * inside / (tasks * darts)


if __name__ == "__main__":
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    darts = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    print(f"pi is about {estimate_pi(tasks, darts):.4f}")
