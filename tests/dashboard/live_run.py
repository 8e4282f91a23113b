"""A run with the dashboard on, driven line by line from stdin so that a test can
watch the page between steps. Each command answers with one line on stdout."""
import os
import signal
import sys
import time

import fiberlite as mp


def slow_square(x):
    time.sleep(0.01)
    return x * x


def fails_on_threes(x):
    if x % 10 == 3:
        raise KeyError(f"no luck with {x}")
    return x


def sleeps(x):
    time.sleep(0.05)
    return x


def talks(lines):
    for i in range(lines):
        print(f"line {i} of a job", file=sys.stderr, flush=True)  # stdout answers the test


def main() -> None:
    mp.init(dashboard="127.0.0.1:0")
    queue = mp.Queue()
    with mp.Pool(4) as pool:
        print("ready", flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "map":
                results = pool.map(slow_square, range(1000))
                print("map", "exact" if results == [x * x for x in range(1000)] else "WRONG", flush=True)
            elif command == "talk":
                job = mp.Process(target=talks, args=(300,))
                job.start()
                job.join()
                print("talked", job._popen.job.spec.name, flush=True)
            elif command == "put":
                queue.put("item")
                print("put", flush=True)
            elif command == "fail":
                try:
                    pool.map(fails_on_threes, range(20), chunksize=1)
                except KeyError:
                    print("failed", flush=True)
            elif command == "kill":
                pending = pool.map_async(sleeps, range(80), chunksize=1)
                time.sleep(0.3)  # let the workers hold tasks (the kill is the test, not a sync)
                os.kill(pool._pool[0].pid, signal.SIGKILL)
                print("kill", "exact" if pending.get(60) == list(range(80)) else "WRONG", flush=True)
            elif command == "quit":
                break
    queue.close()


if __name__ == "__main__":
    main()
