"""``fiberlite run script.py``: the script as the master job of a new run.

The backend runs it (``Backend.run_master``): by default a job created through the
backend with ``python script.py args...``, whose output is streamed here (a container,
a pod, a batch job); a backend may run it otherwise (on this machine: a child process
of this command, its output shown and kept for ``fiberlite logs``). The master's
environment names the run (``FIBERLITE_RUN_ID``, ``FIBERLITE_JOB_NAME``) and the
backend (``FIBERLITE_BACKEND``), so that the jobs it starts belong to the run.
The command exits with the master's exit code (128 + N when a signal N killed it).
Ctrl-C or SIGTERM removes every job of the run and exits with 130 / 143.
"""
from __future__ import annotations

import argparse
import secrets
import signal
import sys
from typing import Any, Callable

from .. import config
from ..backends import Backend, JobSpec, known_backends
from ..backends.base import JOB_LABEL, PARENT_LABEL, RUN_LABEL, MasterRun
from ..units import parse_count, parse_cpu, parse_memory
from .common import CliError, apply_settings, backend, cluster_options
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
    if args.build and not args.image:
        raise CliError("--build needs --image (the tag to build)", 2)
    target = backend(name)
    target.check_options(JobSpec(command=[], options=job_options(args)))  # before anything starts
    if args.build:
        target.build_image(args.image, ".")
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        spec = master_spec(args, target, env, run_id, job_name)
        return target.run_master(MasterRun(run_id, spec, _progress, dashboard=args.dashboard,
                                           given=given_options(args)))
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


def given_options(args: argparse.Namespace) -> tuple[str, ...]:
    """The options given that shape the master job (a backend may ignore some, and say so)."""
    shaping = (("--image", args.image), ("--cpu", args.cpu), ("--memory", args.memory),
               ("--gpu", args.gpu), ("--volume", args.volume), ("--working-dir", args.working_dir))
    return tuple(option for option, value in shaping if value)


def master_spec(args: argparse.Namespace, target: Backend, env: dict[str, str], run_id: str,
                job_name: str) -> JobSpec:
    """The master job: the script in its working directory, named and labelled as the
    run's, with the options given."""
    image = args.image or config.get("image")
    if image:
        env["FIBERLITE_IMAGE"] = image  # the jobs of the run use it too
    command, tree, working_env = master_command(args, target, run_id)
    env.update(working_env)
    env.update(dict(args.env))
    return JobSpec(command=command, name=job_name, image=image, env=env, tree=tree,
                   cpu=args.cpu, memory=args.memory, gpu=args.gpu, volumes=dict(args.volume),
                   labels={RUN_LABEL: run_id, JOB_LABEL: job_name, PARENT_LABEL: "cli"},
                   options=job_options(args))


def _progress(label: str, jobs: Callable[[], list], interval: float) -> Progress:
    return Progress(label, jobs, interval=interval).start()
