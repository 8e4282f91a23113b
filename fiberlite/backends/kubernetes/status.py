"""Reading a job's pod the way a kubelet writes it: state, exit code, why it failed.

Exit codes follow ``multiprocessing``. Kubernetes reports ``128 + N`` for a container
killed by signal N, which cannot be told apart from ``sys.exit(128 + N)``; it becomes
``-N`` only when the pod's record says a signal was sent: the job was terminated or
killed through the backend, the pod was being deleted (``deletionTimestamp``), was
evicted, or the container was ``OOMKilled``. A pod that vanished without an exit code
counts as killed (``-9``, or the signal the backend sent); a pod that can never
start (unschedulable, image pull failure, bad container config) ends with exit code
:data:`START_FAILED` and a message.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from ..base import JobState, exit_code

START_FAILED = 1
FINAL_PHASES = ("Succeeded", "Failed")
IMAGE_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CONFIG_REASONS = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")


@dataclass(frozen=True)
class Outcome:
    """How a job ended: its exit code and, when it did not simply exit, why."""

    exitcode: int
    message: str | None = None
    started: bool = True  # False: the container never ran (so there is no log)


def _container_status(pod: Any) -> Any:
    statuses = (pod.status.container_statuses if pod.status else None) or []
    return statuses[0] if statuses else None


def terminated(pod: Any) -> Any:
    status = _container_status(pod)
    return status.state.terminated if status is not None and status.state else None


def waiting(pod: Any) -> Any:
    status = _container_status(pod)
    return status.state.waiting if status is not None and status.state else None


def phase(pod: Any) -> str | None:
    return pod.status.phase if pod.status else None


def job_state(pod: Any | None, deleted: bool = False) -> JobState:
    if pod is None:
        return JobState.PENDING
    if deleted or phase(pod) in FINAL_PHASES:
        return JobState.EXITED
    return JobState.RUNNING if phase(pod) == "Running" else JobState.PENDING


def _signalled(pod: Any, term: Any, requested: int | None) -> bool:
    return bool(requested or pod.metadata.deletion_timestamp or term.reason == "OOMKilled"
                or (pod.status and pod.status.reason == "Evicted"))


def pod_exit_code(pod: Any, term: Any, requested: int | None) -> int:
    code = int(term.exit_code)
    return exit_code(code) if _signalled(pod, term, requested) else code


def outcome(pod: Any, deleted: bool, requested: int | None) -> Outcome | None:
    """The job's outcome once the pod is finished or gone, else None."""
    status = pod.status
    if not deleted and phase(pod) not in FINAL_PHASES:
        return None
    term = terminated(pod)
    evicted = bool(status and status.reason == "Evicted")
    if term is not None:
        code = pod_exit_code(pod, term, requested)
        if evicted:
            return Outcome(code, f"pod evicted: {status.message or 'no reason given'}")
        if term.reason == "OOMKilled":
            return Outcome(code, "killed for using more memory than its limit (OOMKilled); "
                           "ask for more with @fiberlite.meta(memory=...) or the memory setting")
        if term.reason in ("StartError", "ContainerCannotRun"):
            return Outcome(START_FAILED, f"container could not start: {term.message or term.reason}",
                           started=False)
        if deleted and requested is None and code != 0 and pod.metadata.deletion_timestamp:
            return Outcome(code, "pod was deleted while the job ran")
        return Outcome(code)
    if requested:
        return Outcome(-requested)
    if evicted:
        return Outcome(-signal.SIGKILL, f"pod evicted: {status.message or 'no reason given'}")
    if phase(pod) == "Succeeded":
        return Outcome(0)
    if deleted:
        return Outcome(-signal.SIGKILL, "pod was deleted before it reported an exit code")
    reason = " ".join(x for x in (status.reason, status.message) if x) if status else ""
    return Outcome(-signal.SIGKILL, f"pod failed: {reason or 'no reason given'}")


def start_problem(pod: Any) -> str | None:
    """``"unschedulable"``, an image or container-config waiting reason, or None."""
    if phase(pod) != "Pending":
        return None
    for cond in (pod.status.conditions if pod.status else None) or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return "unschedulable"
    wait = waiting(pod)
    if wait is not None and wait.reason in IMAGE_REASONS + CONFIG_REASONS:
        return wait.reason
    return None


def unschedulable_message(pod: Any) -> str:
    for cond in (pod.status.conditions if pod.status else None) or []:
        if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
            return cond.message or "no node fits it"
    return "no node fits it"


def describe(pod: Any, deleted: bool = False) -> str:
    """A short state for ``fiberlite ps``: ``running``, ``pending (ImagePullBackOff)``..."""
    state = job_state(pod, deleted).value
    term, wait = terminated(pod), waiting(pod)
    if state == "exited":
        if pod.status and pod.status.reason:
            return f"exited ({pod.status.reason})"
        if term is not None:
            return f"exited (code {term.exit_code})"
        return "exited"
    if pod.metadata.deletion_timestamp:
        return f"{state} (terminating)"
    if state == "pending":
        if start_problem(pod) == "unschedulable":
            return "pending (Unschedulable)"
        if wait is not None and wait.reason:
            return f"pending ({wait.reason})"
    return state
