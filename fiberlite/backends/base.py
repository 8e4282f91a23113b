"""The backend seam: what every place that can run a job must provide, and what the
backends share: the labels of a run's jobs, exit statuses, the decoding of job output."""
from __future__ import annotations

import abc
import codecs
import enum
import importlib
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ..errors import BackendError, ConfigError

# labels on every job of a run (``JobSpec.labels``): backends find a run's jobs by them
RUN_LABEL = "fiberlite/run"
JOB_LABEL = "fiberlite/job"
PARENT_LABEL = "fiberlite/parent"
WATCHED_LABELS = (RUN_LABEL, PARENT_LABEL)  # backends watch their jobs by these: one watch per run and parent

# Where a job finds its ``JobSpec.secret_env`` when a backend does not put it in the
# environment (where /proc/PID/environ, ``docker inspect`` and a pod spec show it): a
# descriptor to read it from, or a file to read and remove.
SECRETS_FD_ENV = "FIBERLITE_SECRETS_FD"
SECRETS_FILE_ENV = "FIBERLITE_SECRETS_FILE"

# A job started in a packed working directory (``JobSpec.tree``): the backend puts the
# archive's parts, in order, as files ``part-0000``, ``part-0001``... in a directory it
# names in TREE_PARTS_ENV, and the digest in TREE_DIGEST_ENV; the job checks and enters
# it (``fiberlite.runtime.tree.enter``). A process that runs in a tree it received has
# TREE_ENV set (where the tree and its archive are).
TREE_PARTS_ENV = "FIBERLITE_TREE_PARTS"
TREE_DIGEST_ENV = "FIBERLITE_TREE_DIGEST"
TREE_ENV = "FIBERLITE_TREE"
TREE_PART_NAME = "part-{:04d}"


def encode_secrets(secret_env: dict[str, str]) -> bytes:
    """``secret_env`` as a job reads it from :data:`SECRETS_FD_ENV` or :data:`SECRETS_FILE_ENV`."""
    return json.dumps(secret_env).encode()


@dataclass(frozen=True)
class TreeArchive:
    """A packed working directory (a gzipped tar) and its SHA-256 ``digest`` (hex)."""

    digest: str
    data: bytes = field(repr=False)

    def parts(self, size: int) -> list[bytes]:
        """The archive cut into parts of at most ``size`` bytes."""
        return [self.data[i:i + size] for i in range(0, len(self.data), size)] or [b""]


@dataclass
class JobSpec:
    """Everything a backend needs to start one job.

    ``command[0] == "python"`` means the job's own Python interpreter (the parent's
    ``sys.executable`` locally, the image's ``python`` in a container).
    """

    command: list[str]
    name: str = "fiberlite-job"
    image: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, str] = field(default_factory=dict)  # the run's key: delivered unseen where the backend can
    cpu: float | None = None
    memory: int | None = None  # bytes
    gpu: int | None = None
    volumes: dict[str, str] = field(default_factory=dict)  # source -> path inside the job
    labels: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    # one of many jobs sharing work (a pool's): on a cluster without room for it yet, it
    # waits (up to the start_timeout setting) instead of failing as unschedulable at once
    waits_for_capacity: bool = False
    # the working directory to start in, for a backend whose ``delivers_tree`` is true
    tree: TreeArchive | None = None
    # the pool workers the job runs (a pool host's count; 1 for any other job): a backend
    # may size the job by it (Slurm asks for a CPU per worker when ``cpu`` is unset)
    workers: int = 1
    # options for this job that only some backends take (``Backend.job_options``), such as
    # kubernetes' ``service_account``; a backend refuses one it does not take
    options: dict[str, str] = field(default_factory=dict)


@dataclass
class MasterRun:
    """What ``fiberlite run`` asks of a backend's :meth:`Backend.run_master`: run
    ``spec`` as the master job of run ``run_id`` and show its output here."""

    run_id: str
    # the master job: its command runs the script (``python SCRIPT ARGS...``, or the
    # entry into the working directory it is given), its env names the run and backend
    spec: JobSpec
    # the start-up view: ``progress(label, jobs, interval)`` shows how many of ``jobs()``
    # (as :meth:`Backend.list_jobs` gives them) are pending, running and done, every
    # ``interval`` seconds, until its ``stop()``, called before the master's output shows
    progress: Callable[[str, Callable[[], list], float], Any]
    # where the master serves the run's page (setting ``dashboard``), if asked
    dashboard: tuple[str, int] | None = None
    # the command's options that shape the master job and were given (``--image``,
    # ``--cpu``...): a backend that ignores some says so
    given: tuple[str, ...] = ()


class JobState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    EXITED = "exited"


@dataclass
class Job:
    """A backend's handle on one job."""

    backend: "Backend"
    id: str
    spec: JobSpec
    pid: int | None = None
    handle: Any = None  # backend-specific
    exitcode: int | None = None


class Backend(abc.ABC):
    """Creates jobs and reports on them. Exit codes follow ``multiprocessing``:
    0 for success, the process's code otherwise, ``-N`` when killed by signal N."""

    name: str = "abstract"
    # create_job puts ``JobSpec.tree`` in the job (see TREE_PARTS_ENV)
    delivers_tree: bool = False
    # the ``JobSpec.options`` this backend takes: name -> what it does
    job_options: Mapping[str, str] = {}

    @abc.abstractmethod
    def create_job(self, spec: JobSpec) -> Job:
        """Start a job; raise :class:`~fiberlite.errors.BackendError` with a fix when it
        cannot, and :class:`~fiberlite.errors.ConfigError` for an option it does not take
        (:meth:`check_options`)."""

    @abc.abstractmethod
    def status(self, job: Job) -> JobState:
        """The job's state now."""

    @abc.abstractmethod
    def wait(self, job: Job, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds (forever if None); the exit code, or None if still running."""

    @abc.abstractmethod
    def terminate(self, job: Job, force: bool = False) -> None:
        """Ask the job to stop (SIGTERM), or kill it (SIGKILL) when ``force``."""

    @abc.abstractmethod
    def logs(self, job: Job) -> str:
        """What the job printed, as far as the backend keeps it."""

    @abc.abstractmethod
    def listen_host(self) -> str:
        """The address at which jobs of this backend can reach the current process."""

    def shares_working_dir(self) -> bool:
        """True when this backend's jobs see the working directory of this process as it
        is here (a process of this machine, a bind mount, the same image): nothing need
        travel with them. Otherwise each job gets a copy (setting ``working_dir``)."""
        return False

    def preflight(self) -> None:
        """Raise :class:`~fiberlite.errors.BackendError` now if no job could be created
        (no daemon, no cluster configuration...), before anything is sent anywhere."""

    def check_options(self, spec: JobSpec) -> None:
        """Raise ConfigError, in one line, if ``spec`` has an option this backend does not take."""
        unknown = sorted(set(spec.options) - set(self.job_options))
        if unknown:
            takes = ", ".join(sorted(self.job_options)) or "none"
            raise ConfigError(f"the {self.name} backend does not take the job option {unknown[0]!r} "
                              f"(the options it takes: {takes})")

    def workers_per_job(self, processes: int, cpu: float | None) -> int:
        """How many of a pool's ``processes`` workers one job runs when the
        ``workers_per_job`` setting is unset; ``cpu``: what each job asks for (setting
        ``cpu``), if anything. By default a job runs a worker per CPU it asks for (a pod
        with ``cpu=16`` runs 16), and one when it asks for none."""
        return max(1, int(cpu or 1))

    def sample(self, job: Job, forked: Sequence[int] = ()) -> tuple[float, int] | None:
        """The CPU seconds the job used so far and the bytes it holds in memory now, for
        the run's page; ``forked``: the pids, as the job sees them, of the pool workers it
        forked. None when this backend cannot measure its jobs (the default)."""
        return None

    def location(self, job: Job) -> str | None:
        """Where the job runs (a machine, a node, a container), for the run's page; None
        when the backend does not know."""
        return None

    def sentinel(self, job: Job) -> int | None:
        """A file descriptor that becomes readable when the job ends, if the backend has one."""
        return None

    def cleanup(self, job: Job) -> None:
        """Release what the backend keeps for a finished job (container, pod...)."""

    def close(self) -> None:
        """Release the backend's own resources."""

    # -- optional: what the ``fiberlite`` command line needs ---------------------------
    def list_jobs(self, run_id: str | None = None) -> list[tuple[str, str, str]]:
        """Jobs of run ``run_id`` (of every run when None) that this backend can see.

        Each is ``(job name, run id, state)``; ``state`` starts with a :class:`JobState`
        value (``pending``, ``running``, ``exited``), optionally followed by a detail in
        parentheses, e.g. ``"exited (code 1)"`` or ``"pending (ImagePullBackOff)"``.
        """
        raise NotImplementedError(f"the {self.name} backend cannot list jobs")

    def cleanup_run(self, run_id: str | None = None) -> int:
        """Stop and remove every job of run ``run_id`` (of every run when None), whoever
        started it; returns how many jobs were removed."""
        raise NotImplementedError(f"the {self.name} backend cannot clean up runs")

    def stream_logs(self, job_name: str, follow: bool = False) -> Iterator[str]:
        """What job ``job_name`` printed, as text chunks; with ``follow``, keep yielding
        until the job ends. Raise :class:`LookupError` when the backend does not know
        the job (so that a caller can try another backend)."""
        raise NotImplementedError(f"the {self.name} backend keeps no logs")

    def clean(self, run_id: str | None = None) -> int:
        """``fiberlite clean``: :meth:`cleanup_run`, and whatever else the command line
        kept of the run (local: the master's log); returns how many jobs were removed."""
        return self.cleanup_run(run_id)

    def build_image(self, tag: str, context: str) -> None:
        """``fiberlite run --build``: build image ``tag`` from ``context``'s Dockerfile
        for the run's jobs, its output on stderr; a backend whose jobs run no image refuses."""
        raise ConfigError(f"--build: the {self.name} backend runs no container image")

    def open_page(self, job: Job, address: tuple[str, int]) -> Any:
        """``fiberlite run --dashboard``: the master job ``job`` serves the run's page at
        ``address`` in its own network; say on stderr how to open it from here, and
        return what makes it reachable here (its ``close()`` is called when the run
        ends), or None. By default nothing: the page is as reachable as the job."""
        return None

    def run_master(self, run: MasterRun) -> int:
        """``fiberlite run``: run the master job ``run.spec`` to its end, its output shown
        here as it comes; the command's exit status (128 + N when signal N killed it).
        By default: :meth:`create_job`, :meth:`open_page`, :meth:`stream_logs` and
        :meth:`wait`, then :meth:`cleanup_run` of the whole run. A backend whose master
        runs otherwise (local: a child process of the command) overrides it."""
        job = self.create_job(run.spec)  # an option it does not take: a ConfigError, one line
        page = self.open_page(job, run.dashboard) if run.dashboard else None
        progress = run.progress(f"fiberlite: run {run.run_id} [{self.name}]",
                                lambda: self.list_jobs(run.run_id), 1.0)
        try:
            code = None
            while code is None and self.status(job) is JobState.PENDING:
                code = self.wait(job, 0.25)
            self._show_output(job.id, progress, quiet=code is not None)
            code = self.wait(job)
        finally:
            progress.stop()
            if page is not None:
                page.close()
        try:
            try:
                self.cleanup_run(run.run_id)  # the master's job and anything left of the run
            except NotImplementedError:
                self.cleanup(job)
        except Exception as exc:
            sys.stderr.write(f"fiberlite: clean-up of run {run.run_id} failed: {exc}\n")
        return exit_status(code)

    def _show_output(self, job_name: str, progress: Any, quiet: bool) -> None:
        """Print the master's output as it comes (``quiet``: it never started, errors
        are expected)."""
        try:
            for text in self.stream_logs(job_name, follow=True):
                progress.stop()
                sys.stdout.write(text)
                sys.stdout.flush()
        except LookupError:
            pass  # gone already: its exit code tells the rest
        except NotImplementedError:
            sys.stderr.write(f"fiberlite: this backend cannot stream the output of {job_name}\n")
        except BackendError as exc:
            if not quiet:
                sys.stderr.write(f"fiberlite: cannot show the output of {job_name}: {exc}\n")


def lazy_exports(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A ``__getattr__`` for a backend's package: each of ``names`` is imported from its
    submodule (e.g. ``{"SlurmBackend": ".backend"}``) when first asked for, so that
    reading the package's ``SETTINGS`` imports nothing else."""
    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(names[name], package), name)
    return __getattr__


def decode_stream(chunks: Iterable[bytes]) -> Iterator[str]:
    """Text of a job's output arriving as byte chunks (a UTF-8 character may be cut
    between two chunks; undecodable bytes become U+FFFD)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    for chunk in chunks:
        text = decoder.decode(chunk)
        if text:
            yield text
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def build_with_docker(tag: str, context: str) -> None:
    """``docker build -t tag context`` with this machine's Docker engine (the Docker SDK),
    its output on stderr: :meth:`Backend.build_image` of the backends that run images."""
    if not os.path.isfile(os.path.join(context, "Dockerfile")):
        raise ConfigError(f"--build: no Dockerfile in {os.path.abspath(context)}")
    try:
        import docker
        from docker.errors import APIError, DockerException
    except ImportError:
        raise BackendError("--build needs the Docker SDK: pip install 'fiberlite[docker]'") from None
    try:
        client = docker.from_env()
        for chunk in client.api.build(path=context, tag=tag, rm=True, decode=True):
            if "stream" in chunk:
                sys.stderr.write(chunk["stream"])
            if "error" in chunk:
                raise BackendError(f"docker build of {tag} failed: {chunk['error'].strip()}")
    except (APIError, DockerException) as exc:
        raise BackendError(f"cannot build {tag} with Docker: {' '.join(str(exc).split())}; "
                           "is the Docker daemon running?") from None


def exit_status(code: int) -> int:
    """A job's exit code (``-N``: killed by signal N) as a command's exit status, as a
    shell reports it (128+N)."""
    return 128 - code if code < 0 else code


def exit_code(status: int) -> int:
    """An exit status as ``multiprocessing`` reports it: 128+N, the shell's and container
    engines' code for a process killed by signal N, becomes -N."""
    return -(status - 128) if 128 < status <= 128 + 64 else status
