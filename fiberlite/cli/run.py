"""``fiberlite run script.py``: the script as the master job of a new run.

local: a child process of this command (its output is shown and kept for
``fiberlite logs``); docker / kubernetes: a container / pod created through the
backend with ``python script.py args...``, whose log is streamed here; slurm: a
batch job, whose output file is streamed here. The master's
environment names the run (``FIBERLITE_RUN_ID``, ``FIBERLITE_JOB_NAME``) and the
backend (``FIBERLITE_BACKEND``), so that the jobs it starts belong to the run.
The command exits with the master's exit code (128 + N when a signal N killed it).
Ctrl-C or SIGTERM removes every job of the run and exits with 130 / 143.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
from typing import Any, BinaryIO

from .. import config
from ..backends import JobSpec, JobState, known_backends
from ..units import parse_count, parse_cpu, parse_memory
from .common import CliError, apply_settings, backend, cluster_options
from .page_hint import forward_page, kubernetes_hint
from .progress import Progress
from .workdir import add_options as add_working_dir_options
from .workdir import apply as apply_working_dir
from .workdir import master_command


def _argtype(parse, what: str):
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"invalid {what}: {exc}") from None
    return convert


def _pair(separator: str, what: str):
    def convert(text: str) -> tuple[str, str]:
        key, sep, value = text.partition(separator)
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return key, value
    return convert


def add_parser(commands) -> None:
    p = commands.add_parser(
        "run", parents=[cluster_options()], help="run a script as the master job of a new run",
        description="Start SCRIPT as the master job of a new run on a backend, stream its\n"
                    "output and exit with its exit code. The jobs the script starts belong\n"
                    "to the run; Ctrl-C (or SIGTERM) removes them all.",
        epilog="examples:\n"
               "  fiberlite run train.py --epochs 3\n"
               "  fiberlite run --backend docker --image fiberlite:latest --build train.py\n"
               "  fiberlite run --backend kubernetes --image registry/me/app:1 --cpu 2 "
               "--memory 4Gi train.py\n"
               "  fiberlite run --backend slurm --cpu 4 train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=sorted(known_backends()),
                   help="where the run's jobs go (default: the backend setting)")
    p.add_argument("--image", help="container image of the master job, and by default of its "
                                   "jobs (docker, kubernetes)")
    p.add_argument("--build", action="store_true",
                   help="first build --image from ./Dockerfile with Docker")
    p.add_argument("--cpu", type=_argtype(parse_cpu, "cpu"), help="CPUs for the master job (2, 0.5, 500m)")
    p.add_argument("--memory", type=_argtype(parse_memory, "memory"), help="memory for the master job (4Gi)")
    p.add_argument("--gpu", type=_argtype(parse_count, "gpu count"), help="GPUs for the master job")
    p.add_argument("--env", action="append", default=[], metavar="K=V", type=_pair("=", "K=V"),
                   help="environment variable of the master job (repeatable)")
    p.add_argument("--volume", action="append", default=[], metavar="SRC:DST", type=_pair(":", "SRC:DST"),
                   help="mount SRC (a host path for docker; a PVC name for kubernetes) at DST "
                        "(repeatable)")
    p.add_argument("--service-account", metavar="NAME",
                   help="kubernetes: service account of the master pod (see docs/kubernetes/rbac.yaml); "
                        "the same as --option service_account=NAME")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", type=_pair("=", "KEY=VALUE"),
                   help="an option of the master job that its backend takes (repeatable); a "
                        "backend refuses one it does not know, naming those it takes")
    p.add_argument("--dashboard", metavar="[HOST:]PORT", type=_argtype(config.parse_address, "address"),
                   help="the master serves the run's live page there (setting dashboard; a port "
                        "alone: loopback; on kubernetes, how to open it is printed)")
    add_working_dir_options(p)
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(func=main)


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def main(args: argparse.Namespace) -> int:
    apply_settings(args)
    apply_working_dir(args)
    name = args.backend or config.get("backend")
    run_id = secrets.token_hex(4)
    job_name = f"fl-{run_id}-master"
    env = {"FIBERLITE_BACKEND": name, "FIBERLITE_RUN_ID": run_id, "FIBERLITE_JOB_NAME": job_name,
           "PYTHONUNBUFFERED": "1"}
    if args.dashboard:
        env["FIBERLITE_DASHBOARD"] = "{}:{}".format(*args.dashboard)
    if args.build:
        if not args.image:
            raise CliError("--build needs --image (the tag to build)", 2)
        build_image(args.image)
    target = backend(name)
    target.check_options(JobSpec(command=[], options=job_options(args)))  # before anything starts
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if name == "local":
            return run_local(args, env, run_id, job_name)
        return run_remote(args, target, name, env, run_id, job_name)
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        for s in previous:
            signal.signal(s, signal.SIG_IGN)  # let the clean-up finish
        sys.stderr.write(f"\nfiberlite: {signal.Signals(signum).name}: removing the jobs of run {run_id}\n")
        try:
            target.cleanup_run(run_id)
        except Exception as error:  # still exit with the signal's status
            sys.stderr.write(f"fiberlite: clean-up of run {run_id} failed: {error}; "
                             f"run `fiberlite clean --run {run_id} --backend {name}`\n")
        return 128 + signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def job_options(args: argparse.Namespace) -> dict[str, str]:
    """The master job's backend options: ``--option KEY=VALUE``, and the flags that stand
    for one (``--service-account``)."""
    options = dict(args.option)
    if args.service_account:
        options["service_account"] = args.service_account
    return options


def exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


# -- local ------------------------------------------------------------------------------------
def run_local(args: argparse.Namespace, env: dict[str, str], run_id: str, job_name: str) -> int:
    from ..backends.local import runs as local_runs
    ignored = [o for o, v in (("--image", args.image), ("--cpu", args.cpu), ("--memory", args.memory),
                              ("--gpu", args.gpu), ("--volume", args.volume),
                              ("--working-dir", args.working_dir)) if v]
    if ignored:
        sys.stderr.write(f"fiberlite: {', '.join(ignored)} do(es) not apply to the local backend; ignored\n")
    env = {**os.environ, **env, **dict(args.env)}
    try:
        local_runs.private_log_dir()
    except OSError as exc:
        raise CliError(f"cannot keep the run's log: {exc}") from None
    local_runs.done_path(job_name).unlink(missing_ok=True)
    with local_runs.open_private(local_runs.log_path(job_name)) as log:
        try:
            proc = subprocess.Popen([sys.executable, args.script, *args.args], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            raise CliError(f"cannot start {args.script}: {exc}") from None
        progress = Progress(f"fiberlite: run {run_id} [local]",
                            lambda: local_runs.list_jobs(run_id)).start()
        lock = threading.Lock()
        pumps = [threading.Thread(target=_pump, args=(pipe, out, log, lock, progress), daemon=True)
                 for pipe, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
        for pump in pumps:
            pump.start()
        try:
            code = proc.wait()
            for pump in pumps:
                pump.join()
        finally:
            progress.stop()
            if proc.poll() is None:  # interrupted: the caller removes the run's processes
                threading.Thread(target=_finish_log, args=(proc, pumps, job_name), daemon=True).start()
    if proc.poll() is not None:
        _mark_done(job_name, code)
    return exit_status(code)


def _pump(pipe: BinaryIO, out: Any, log: BinaryIO, lock: threading.Lock, progress: Progress) -> None:
    """Copy the master's output to our stream and to its log, as it comes."""
    target = getattr(out, "buffer", None)
    fd = pipe.fileno()
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        progress.stop()
        with lock:
            try:
                if target is not None:
                    target.write(data)
                else:
                    out.write(data.decode(errors="replace"))
                out.flush()
            except (OSError, ValueError):
                pass
            log.write(data)
            log.flush()
    pipe.close()


def _finish_log(proc: subprocess.Popen, pumps: list, job_name: str) -> None:
    code = proc.wait()
    _mark_done(job_name, code)


def _mark_done(job_name: str, code: int) -> None:
    from ..backends.local import runs as local_runs
    try:
        with local_runs.open_private(local_runs.done_path(job_name)) as done:
            done.write(f"{code}\n".encode())
    except OSError:
        pass


# -- docker / kubernetes / slurm ----------------------------------------------------------------------
def run_remote(args: argparse.Namespace, target: Any, name: str, env: dict[str, str],
               run_id: str, job_name: str) -> int:
    image = args.image or config.get("image")
    if image:
        env["FIBERLITE_IMAGE"] = image  # the jobs of the run use it too
    if name == "kubernetes" and config.get("namespace"):
        env["FIBERLITE_NAMESPACE"] = config.get("namespace")
    command, tree, working_env = master_command(args, target, run_id)
    env.update(working_env)
    env.update(dict(args.env))
    spec = JobSpec(command=command, name=job_name, image=image, env=env, tree=tree,
                   cpu=args.cpu, memory=args.memory, gpu=args.gpu, volumes=dict(args.volume),
                   labels={"fiberlite/run": run_id, "fiberlite/job": job_name, "fiberlite/parent": "cli"},
                   options=job_options(args))
    job = target.create_job(spec)  # an option the backend does not take: a ConfigError, one line
    forward = None
    if args.dashboard and name == "kubernetes":
        sys.stderr.write(kubernetes_hint(target, job.id, args.dashboard))
        forward = forward_page(target, job.id, args.dashboard)
        if forward is not None:
            sys.stderr.write(f"fiberlite: the master's page, through the API server: {forward.url}\n")
    progress = Progress(f"fiberlite: run {run_id} [{name}]", lambda: target.list_jobs(run_id),
                        interval=1.0).start()
    try:
        code = None
        while code is None and target.status(job) is JobState.PENDING:
            code = target.wait(job, 0.25)
        _stream(target, job.id, progress, quiet=code is not None)
        code = target.wait(job)
    finally:
        progress.stop()
        if forward is not None:
            forward.close()
    try:
        try:
            target.cleanup_run(run_id)  # the master's pod/container and anything left of the run
        except NotImplementedError:
            target.cleanup(job)
    except Exception as exc:
        sys.stderr.write(f"fiberlite: clean-up of run {run_id} failed: {exc}\n")
    return exit_status(code)


def _stream(target: Any, job_id: str, progress: Progress, quiet: bool) -> None:
    """Print the master's log as it comes (``quiet``: it never started, errors are expected)."""
    from ..errors import BackendError
    try:
        for text in target.stream_logs(job_id, follow=True):
            progress.stop()
            sys.stdout.write(text)
            sys.stdout.flush()
    except LookupError:
        pass  # gone already: its exit code tells the rest
    except NotImplementedError:
        sys.stderr.write(f"fiberlite: this backend cannot stream the output of {job_id}\n")
    except BackendError as exc:
        if not quiet:
            sys.stderr.write(f"fiberlite: cannot show the output of {job_id}: {exc}\n")


def build_image(tag: str, context: str = ".") -> None:
    """``docker build -t tag context`` through the Docker SDK, its output on stderr."""
    if not os.path.isfile(os.path.join(context, "Dockerfile")):
        raise CliError(f"--build: no Dockerfile in {os.path.abspath(context)}")
    try:
        import docker
        from docker.errors import APIError, DockerException
    except ImportError:
        raise CliError("--build needs the Docker SDK: pip install 'fiberlite[docker]'") from None
    try:
        client = docker.from_env()
        for chunk in client.api.build(path=context, tag=tag, rm=True, decode=True):
            if "stream" in chunk:
                sys.stderr.write(chunk["stream"])
            if "error" in chunk:
                raise CliError(f"docker build of {tag} failed: {chunk['error'].strip()}")
    except (APIError, DockerException) as exc:
        raise CliError(f"cannot build {tag} with Docker: {' '.join(str(exc).split())}; "
                       "is the Docker daemon running?") from None
