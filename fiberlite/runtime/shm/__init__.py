"""Shared memory between the processes of one machine.

``arena`` is a process's own memory (memfd segments and blocks in them) and the slots
that name the processes using it; ``door`` hands its segments to the processes of this
machine that prove the run's key, and hears when one goes; ``attach`` is the other
side, mapping a creator's segments; ``place`` says where a block is, for any process,
and maps it; ``remote`` acts on the memory for jobs that cannot map it (another
machine); ``sync`` holds the locks and semaphores themselves (the C extension ``_sync``
on futexes through ``native``, or ``portable``: POSIX named semaphores), naming
their holders so that a dead process's holds are given back.
"""
