"""fiberlite quick start: the multiprocessing API, every process a job.

Run it as it is (local backend), or with FIBERLITE_BACKEND=docker to make every
process a container.
"""
import fiberlite as mp


def square_all(numbers, results):
    """Runs in a job: squares what it is given and sends the results back."""
    for n in numbers:
        results.put((n, n * n))
    results.put(None)


def ping(conn):
    conn.send(f"pong from {mp.current_process().name}")
    conn.close()


if __name__ == "__main__":
    results = mp.Queue()
    jobs = [mp.Process(target=square_all, args=(range(i, 20, 4), results)) for i in range(4)]
    for job in jobs:
        job.start()
    squares, finished = {}, 0
    while finished < len(jobs):
        item = results.get()
        if item is None:
            finished += 1
        else:
            squares[item[0]] = item[1]
    for job in jobs:
        job.join()
    print("squares:", [squares[n] for n in range(20)])

    here, there = mp.Pipe()
    job = mp.Process(target=ping, args=(there,))
    job.start()
    print("pipe:", here.recv())
    job.join()
    print("exit codes:", [j.exitcode for j in jobs + [job]])
