"""The pool's side in its jobs: what a worker runs and how it reaches the master.

- :mod:`.worker`: what runs in every worker;
- :mod:`.upstream`: how a worker reaches the master, over its own connection or
  through its host;
- :mod:`.host`: a job that runs many workers, forked from its :mod:`.template`, and
  gathers their requests into one conversation with the master (their frames are
  :mod:`fiberlite.wire.frames`).
"""
