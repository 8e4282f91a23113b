"""What every job runs, whatever its API: the hub that serves its objects, launching
a child job and bootstrapping inside one, the run's identity, direct links, and the
bookkeeping of shared objects' lifetimes."""
