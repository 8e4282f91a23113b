"""Producers and consumers in separate jobs, joined by a JoinableQueue.

    python examples/producer_consumer.py
"""
import fiberlite as mp

STOP = None


def producer(tasks, first: int, count: int) -> None:
    for n in range(first, first + count):
        tasks.put(n)


def consumer(tasks, results) -> None:
    while True:
        n = tasks.get()
        try:
            if n is STOP:
                return
            results.put((n, sum(i * i for i in range(n))))
        finally:
            tasks.task_done()


def run(producers: int = 2, consumers: int = 3, per_producer: int = 50) -> dict[int, int]:
    tasks, results = mp.JoinableQueue(), mp.Queue()
    workers = [mp.Process(target=consumer, args=(tasks, results)) for _ in range(consumers)]
    makers = [mp.Process(target=producer, args=(tasks, i * per_producer, per_producer))
              for i in range(producers)]
    for job in workers + makers:
        job.start()
    for job in makers:
        job.join()
    tasks.join()  # every task produced so far has been processed
    for _ in workers:
        tasks.put(STOP)
    for job in workers:
        job.join()
    total = producers * per_producer
    return dict(results.get() for _ in range(total))


if __name__ == "__main__":
    answers = run()
    print(f"{len(answers)} results; sum of squares below 99 is {answers[99]}")
