"""Data-parallel logistic regression on a fiberlite Ring.

Each of the ranks takes an equal shard of one synthetic data set, computes the
gradient of its shard, and the ranks average their gradients with
``ring.all_reduce(..., op="mean")``: every rank then takes the same step, so the
model equals the one full-batch gradient descent trains in a single process.

    python examples/ring_training.py [--ranks 4] [--steps 200]

(``FIBERLITE_BACKEND=docker python examples/ring_training.py`` runs the ranks as containers.)
"""
from __future__ import annotations

import argparse

import numpy as np

import fiberlite


def make_data(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A linearly separable-ish binary classification problem."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    w_true = rng.standard_normal(d)
    y = (x @ w_true + 0.5 * rng.standard_normal(n) > 0).astype(np.float64)
    return x, y


def loss_and_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean logistic loss of ``(x, y)`` and its gradient."""
    z = x @ w
    loss = float(np.mean(np.logaddexp(0.0, z) - y * z))
    grad = x.T @ (1.0 / (1.0 + np.exp(-z)) - y) / len(y)
    return loss, grad


def train_rank(ring, steps: int, lr: float, n: int, d: int, seed: int) -> float:
    """One rank: gradient steps on its shard, gradients averaged over the ring."""
    if n % ring.world_size:
        raise ValueError(f"n={n} must divide evenly among {ring.world_size} ranks")
    x, y = make_data(n, d, seed)
    size = n // ring.world_size
    shard = slice(ring.rank * size, (ring.rank + 1) * size)
    x, y = x[shard], y[shard]
    w = np.zeros(d)
    for step in range(steps):
        loss, grad = loss_and_grad(w, x, y)
        mean = ring.all_reduce({"loss": loss, "grad": grad}, op="mean")
        w -= lr * mean["grad"]
        if step % max(1, steps // 5) == 0:
            ring.print(f"step {step:4d}  loss {mean['loss']:.6f}")
    final = ring.all_reduce(loss_and_grad(w, x, y)[0], op="mean")
    return final


def train_single(steps: int, lr: float, n: int, d: int, seed: int) -> float:
    """The same training, full batch, in this process."""
    x, y = make_data(n, d, seed)
    w = np.zeros(d)
    for _ in range(steps):
        w -= lr * loss_and_grad(w, x, y)[1]
    return loss_and_grad(w, x, y)[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    params = (args.steps, args.lr, args.samples, args.features, args.seed)

    losses = fiberlite.Ring(args.ranks, train_rank, args=params).run()
    single = train_single(*params)
    print(f"final loss (ring, {args.ranks} ranks): {losses[0]!r}")
    print(f"final loss (single process):   {single!r}")
    print(f"relative difference: {abs(losses[0] - single) / abs(single):.3e}")


if __name__ == "__main__":
    main()
