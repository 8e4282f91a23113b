"""A script meant for ``fiberlite run``: it becomes the master job of a run, and its
Pool's workers become jobs on the same backend.

    fiberlite run --backend docker --image fiberlite examples/cluster_run.py 8
    fiberlite run --backend kubernetes --image registry.example/fiberlite:1 examples/cluster_run.py 8

(Build the image from the project's Dockerfile; on Kubernetes apply
docs/kubernetes/rbac.yaml first.)
"""
import os
import socket
import sys

import fiberlite as mp


def where(n: int) -> tuple[int, str]:
    """Square ``n`` and say which job did it."""
    return n * n, socket.gethostname()


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    backend = os.environ.get("FIBERLITE_BACKEND", "local")
    with mp.Pool(2) as pool:
        results = pool.map(where, range(count))
    print(f"backend {backend}: squares {[square for square, _ in results]}")
    print(f"master {socket.gethostname()}, workers {len({host for _, host in results})} distinct hosts")
