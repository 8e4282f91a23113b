"""Slurm's command-line tools as the backend calls them: ``sbatch`` (a ``JobSpec`` as
options), ``squeue`` (one call for many jobs, parsed into :class:`Row`), ``scancel``,
``sinfo`` (the CPUs of a partition's nodes).
Every failure is a :class:`~fiberlite.errors.BackendError` naming the command and
Slurm's own words."""
from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Any, Iterable

from ...errors import BackendError
from ..base import JobSpec

TIMEOUT = 60.0  # seconds a Slurm command may take (a busy controller answers slowly)
# squeue's fields, in this order; '|' never occurs in what fiberlite puts there
FIELDS = ("JobID", "Name:512", "State", "Reason:256", "exit_code", "StdOut:1024", "Comment:1024",
          "NodeList:1024")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT")
SIGNALLED = ("CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE")  # Slurm sent SIGTERM
NOT_RUN = 1  # exit code of a job that failed without an exit status of its own
WAITING = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD")


@dataclass(frozen=True)
class Row:
    """One job as ``squeue`` shows it."""

    id: str
    name: str
    state: str
    reason: str
    status: int | None  # the wait status Slurm recorded (code << 8 | signal)
    stdout: str
    labels: dict[str, str]
    node: str = ""  # where it runs (empty while it is pending)

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    def exitcode(self) -> int:
        """The exit code as ``multiprocessing`` reports it: ``-N`` for signal N; a job
        Slurm ended before it ran or exited (cancelled, time limit: SIGTERM) is never 0."""
        status = self.status or 0
        if status & 0x7F:
            return -(status & 0x7F)
        if status == 0 and self.state != "COMPLETED":
            return -signal.SIGTERM if self.state in SIGNALLED else NOT_RUN
        return status >> 8

    def describe(self) -> str:
        """``pending (Resources)``, ``running``, ``exited (code 1)``..."""
        if self.waiting:
            return f"pending ({self.reason})" if self.reason not in ("", "None") else "pending"
        if self.ended:
            return f"exited ({self.state.lower()}, code {self.exitcode()})"
        return "running"


def tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")
    if path is None:
        raise BackendError(f"Slurm's {name} command is not on PATH: run fiberlite on a node of the "
                           "cluster (a login node), or install Slurm's client commands (slurm-client)")
    return path


def run(args: list[str], what: str, stdin: str | None = None,
        env: dict[str, str] | None = None) -> str:
    """Run a Slurm command; its stdout, or a BackendError with its last line of stderr."""
    try:
        done = subprocess.run([tool(args[0]), *args[1:]], input=stdin, capture_output=True,
                              text=True, timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        raise BackendError(f"{what}: {args[0]} did not answer within {TIMEOUT:g} s; is slurmctld "
                           "up? (scontrol ping)") from None
    except OSError as exc:
        raise BackendError(f"{what}: cannot run {args[0]}: {exc}") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()] or [f"exit status {done.returncode}"]
        raise BackendError(f"{what}: {args[0]} said: {lines[-1].strip()}")
    return done.stdout


def encode_labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def decode_labels(text: str) -> dict[str, str]:
    pairs = (item.partition("=") for item in text.split(","))
    return {k: v for k, sep, v in pairs if sep and k.startswith("fiberlite")}


def sbatch_options(spec: JobSpec, settings: dict[str, Any], output: str) -> list[str]:
    """``sbatch`` options for ``spec`` (resources, name, labels) and the settings."""
    options = [f"--job-name={spec.name}", f"--comment={encode_labels(spec.labels)}",
               f"--output={output}", "--open-mode=append", "--export=ALL", "--parsable",
               "--ntasks=1", "--nodes=1"]
    if spec.cwd:
        options.append(f"--chdir={spec.cwd}")
    cpus = spec.cpu or (spec.workers if spec.workers > 1 else None)  # a pool host: a CPU per worker
    if cpus:
        options.append(f"--cpus-per-task={max(1, math.ceil(cpus))}")
    if spec.memory:
        options.append(f"--mem={max(1, math.ceil(spec.memory / 2**20))}M")
    if spec.gpu:
        options.append(f"--gres=gpu:{spec.gpu}")
    for setting, option in (("slurm_partition", "--partition"), ("slurm_account", "--account"),
                            ("slurm_qos", "--qos"), ("slurm_time", "--time")):
        if settings.get(setting):
            options.append(f"{option}={settings[setting]}")
    if settings.get("slurm_options"):
        options += shlex.split(settings["slurm_options"])
    return options


def batch_script(command: list[str]) -> str:
    """The job's batch script: ``exec`` the command, so that its exit status and the
    signal that killed it are the job's."""
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(part) for part in command) + "\n"


def job_environment(spec_env: dict[str, str]) -> dict[str, str]:
    """This process's environment (``--export=ALL`` hands it to the job) without the
    variables of the Slurm job this process may run in, plus the job's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env.update(spec_env)
    return env


def submit(spec: JobSpec, command: list[str], settings: dict[str, Any], output: str,
           env: dict[str, str]) -> str:
    """``sbatch`` the job; its Slurm job id."""
    out = run(["sbatch", *sbatch_options(spec, settings, output)], f"cannot submit Slurm job {spec.name}",
              stdin=batch_script(command), env=job_environment(env))
    return out.strip().split(";")[0]


def parse_rows(text: str) -> list[Row]:
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < len(FIELDS):
            continue
        jid, name, state, reason, status, stdout, comment, node = parts[:len(FIELDS)]
        try:
            code = int(status)
        except ValueError:
            code = None
        rows.append(Row(jid, name, state.split()[0] if state else "", reason, code, stdout,
                        decode_labels(comment), node))
    return rows


def squeue(ids: Iterable[str] | None = None, user_only: bool = True) -> list[Row]:
    """The jobs ``ids`` (this user's jobs when None), finished ones included while Slurm
    keeps them (``MinJobAge``). One call, whatever the number of jobs."""
    args = ["squeue", "--noheader", "--states=all", "--Format=" + ",".join(f + ("|" if ":" in f else ":|") for f in FIELDS)]
    wanted = list(ids) if ids is not None else None
    if wanted is not None:
        if not wanted:
            return []
        args.append("--jobs=" + ",".join(wanted))
    elif user_only:
        args.append("--me")
    try:
        return parse_rows(run(args, "cannot list Slurm jobs"))
    except BackendError as exc:
        if wanted is not None and "Invalid job id" in str(exc):
            return []  # none of them is known any more
        raise


def node_cpus(partition: str | None) -> int | None:
    """The CPUs of the smallest node of ``partition`` (of the default partition when
    None), as ``sinfo`` counts them; None when it names no node."""
    args = ["sinfo", "--noheader", "--format=%c|%P"] + ([f"--partition={partition}"] if partition else [])
    counts = []
    for line in run(args, "cannot read the CPUs of the Slurm partition's nodes").splitlines():
        cpus, _, name = line.partition("|")
        digits = re.match(r"\s*(\d+)", cpus)  # "8", or "8+" for nodes of 8 and more
        if digits and (partition or name.strip().endswith("*")):  # '*': the default partition
            counts.append(int(digits.group(1)))
    return min(counts) if counts else None


def scancel(ids: list[str], signal_name: str | None = None) -> None:
    """Cancel jobs (``signal_name``: only signal the running ones, e.g. ``TERM``)."""
    if not ids:
        return
    args = ["scancel", *(["--signal=" + signal_name, "--full"] if signal_name else []), *ids]
    try:
        run(args, "cannot cancel Slurm job" + ("s " if len(ids) > 1 else " ") + ",".join(ids))
    except BackendError as exc:
        if "Invalid job id" in str(exc) or "already completing or completed" in str(exc):
            return
        raise
