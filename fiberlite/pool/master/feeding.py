"""Cutting a call's input into chunks and queueing them: the one chunker of ``map`` and ``imap``.

:func:`pieces` cuts an input into ``(start, items)`` pieces of ``chunksize`` items: a
list, tuple or range by slicing (a range's slice is a range, which pickles in a few
bytes), anything else by reading it only as far as the pieces are asked for.
:func:`feed` pickles the pieces (:func:`~fiberlite.pool.chunks.pack_items`) and queues
them on the pool's dispatcher, as many at a time as ``allowance()`` says:

- ``map`` feeds in the caller's thread, 1, 2, 4... chunks at a time
  (:func:`doubling`), so that workers start on the first chunks while the rest are
  pickled; an item that cannot be pickled raises there;
- ``imap`` feeds on a thread of its own, as far as its consumer has made room in its
  window (``IMapIterator._reserve``); an item that cannot be pickled, or an input that
  raises, becomes the result at that position.

An input that is not a list, tuple or range may take its time to give its next item (a
generator reading a stream): each chunk read from it is queued before the next is asked
for, so that the work already read runs meanwhile, as with the stdlib's pool.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..chunks import pack_items

SLICEABLE = (list, tuple, range)  # cut by slicing: their length is exact, slices are cheap


def pieces(source: Iterable, chunksize: int) -> Iterator[tuple[int, Sequence]]:
    """``(start, items)`` for each chunk of ``chunksize`` items of ``source``, in order."""
    if type(source) in SLICEABLE:
        for start in range(0, len(source), chunksize):  # type: ignore[arg-type]
            yield start, source[start:start + chunksize]  # type: ignore[index]
        return
    reader = iter(source)
    start = 0
    while True:
        items = list(itertools.islice(reader, chunksize))
        if not items:
            return
        yield start, items
        start += len(items)
        if len(items) < chunksize:
            return


def doubling() -> Callable[[], int]:
    """An allowance of 1, 2, 4... chunks (``map``'s)."""
    batch = [1]

    def allowance() -> int:
        now = batch[0]
        batch[0] = 2 * now
        return now
    return allowance


def feed(dispatcher: Any, group: Any, source: Iterable, chunksize: int, method: str,
         allowance: Callable[[], int],
         failed: Callable[[int, int, Exception], None] | None = None) -> int | None:
    """Queue the chunks of ``source`` for ``group`` (already submitted, unsealed), then
    seal it; the number of items, or None if ``allowance()`` said stop (0).

    ``failed(start, count, exc)``: items that cannot be pickled, or an input that raised
    (then it is the last result); without it, the error is raised here (the chunks
    already queued still run)."""
    cut = pieces(source, chunksize)
    read_ahead = type(source) in SLICEABLE  # (an iterator's next item may be slow to come)
    start = 0
    exhausted = False
    while not exhausted:
        allowed = allowance()
        if not allowed:
            return None
        chunks = []
        for _ in range(allowed):
            if chunks and not read_ahead:  # what was read runs while the input waits
                dispatcher.submit(group, chunks, seal=False)
                chunks = []
            try:
                piece = next(cut, None)
            except Exception as exc:  # the input raised: that is the result at this position
                if failed is None:
                    raise
                failed(start, 1, exc)
                start += 1
                exhausted = True
                break
            if piece is None:
                exhausted = True
                break
            start, items = piece
            try:
                data = pack_items(items, start, method)
            except Exception as exc:
                if failed is None:
                    raise
                failed(start, len(items), exc)
            else:
                chunks.append(dispatcher.make_chunk(group, start, len(items), data))
            start += len(items)
        if chunks:
            dispatcher.submit(group, chunks, seal=False)
    dispatcher.seal(group)
    return start
