"""The working directory that travels with a run to jobs that cannot see it.

A job on another machine (a pod, a container of a remote Docker engine) runs in a copy
of its creator's working directory: packed once per process (:mod:`.pack`, honouring
:mod:`.ignore`), offered by the creator's hub (:mod:`.offer`), fetched and checked by
the job before it unpickles anything of the user's (:mod:`.receive`), unpacked with
every path checked (:mod:`.unpack`). A master started by ``fiberlite run`` gets it from
its backend instead (a Kubernetes ConfigMap, a Docker archive) and enters it through
:mod:`.enter`.
"""


class TreeError(Exception):
    """A received tree cannot be used (wrong digest, refused entry); the message says why."""
