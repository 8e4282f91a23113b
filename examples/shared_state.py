"""Shared state through a Manager: a dict and a list updated by several jobs under a lock.

    python examples/shared_state.py
"""
import fiberlite as mp


def count_words(words, counts, seen, lock) -> None:
    for word in words:
        with lock:
            counts[word] = counts.get(word, 0) + 1
        seen.append(word)


def run(jobs: int = 3) -> tuple[dict, int]:
    text = "the quick brown fox jumps over the lazy dog the end".split()
    with mp.Manager() as manager:
        counts, seen, lock = manager.dict(), manager.list(), manager.Lock()
        workers = [mp.Process(target=count_words, args=(text, counts, seen, lock)) for _ in range(jobs)]
        for job in workers:
            job.start()
        for job in workers:
            job.join()
        return dict(counts), len(seen)


if __name__ == "__main__":
    counts, total = run()
    print(f"{total} words seen; 'the' counted {counts['the']} times")
