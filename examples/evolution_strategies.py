"""Evolution strategies on a numpy objective with a Pool: the workload Fiber was built for.

Each generation samples a population of perturbations of the parameters, evaluates
them in parallel jobs, and moves the parameters along the fitness-weighted average
of the perturbations (OpenAI-ES style, with antithetic sampling).

    python examples/evolution_strategies.py [generations]
"""
import sys

import numpy as np

import fiberlite as mp

TARGET = np.linspace(-1.0, 1.0, 16)


def fitness(params: np.ndarray) -> float:
    """Higher is better: minus the squared distance to a hidden target."""
    return -float(np.sum((params - TARGET) ** 2))


def evaluate(args) -> float:
    params, seed, sigma, sign = args
    noise = np.random.default_rng(seed).standard_normal(params.shape)
    return fitness(params + sign * sigma * noise)


def evolve(generations: int = 30, population: int = 24, sigma: float = 0.1,
           learning_rate: float = 0.05, processes: int = 4, seed: int = 0) -> tuple[np.ndarray, float]:
    rng = np.random.default_rng(seed)
    params = np.zeros_like(TARGET)
    with mp.Pool(processes) as pool:
        for _ in range(generations):
            seeds = rng.integers(0, 2**31, size=population // 2)
            tasks = [(params, int(s), sigma, sign) for s in seeds for sign in (1, -1)]
            scores = np.array(pool.map(evaluate, tasks))
            ranks = (scores.argsort().argsort() / (len(scores) - 1)) - 0.5  # rank shaping
            step = np.zeros_like(params)
            for (_, s, _, sign), weight in zip(tasks, ranks):
                step += sign * weight * np.random.default_rng(s).standard_normal(params.shape)
            params = params + learning_rate / (len(tasks) * sigma) * step
    return params, fitness(params)


if __name__ == "__main__":
    generations = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    start = fitness(np.zeros_like(TARGET))
    _, final = evolve(generations)
    print(f"fitness: {start:.3f} -> {final:.3f}")
