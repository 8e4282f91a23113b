"""The pool's side in the process that made it (the master).

- :mod:`.pool`: the user's ``Pool`` (protocol in its docstring);
- :mod:`.core`: the machinery of one pool: workers, result thread, imap feeders;
- :mod:`.dispatch`: the servant in the master's hub: pending chunks, who holds what,
  retries, with the calls and chunks it keeps (:mod:`.work`), its workers
  (:mod:`.roster`) and their records (:mod:`.records`);
- :mod:`.results`: ``AsyncResult``, ``MapResult`` and the ``imap`` iterators;
- :mod:`.feeding`: how a call's input is cut into chunks and queued;
- :mod:`.packing`: how many workers one job runs; :mod:`.relay`: the master's end of
  the host jobs (:mod:`fiberlite.pool.job.host`).
"""
