"""The double's scheduler and kubelet: each pod's life, in one thread per pod.

Pending (scheduling, image pull, container config) -> Running (the runner's
process) -> Succeeded/Failed, with the container statuses, conditions and
events a real kubelet reports.  Graceful deletion is SIGTERM, then SIGKILL
when the grace period is over, then the pod object is removed.
"""

from __future__ import annotations

import dataclasses
import itertools
import signal
import threading
import time
import traceback
from typing import Callable, Optional

from .env import HOST_IP, NODE, ConfigError, container_env, expand
from .runner import ContainerStart, Handle, LogBuffer, StartError
from .store import now
from .volumes import MountError, container_files

RESTART_BACKOFF = 0.2   # seconds (10 s and growing on a real node)
PULL_BACKOFF = 0.3


@dataclasses.dataclass
class PodRun:
    """What the kubelet knows about one pod besides the stored object."""
    namespace: str
    name: str
    uid: str
    containers: list
    handles: dict = dataclasses.field(default_factory=dict)
    exits: dict = dataclasses.field(default_factory=dict)      # name -> exit code
    restart_at: dict = dataclasses.field(default_factory=dict)  # name -> monotonic time
    logs: dict = dataclasses.field(default_factory=dict)       # name -> [LogBuffer]
    states: dict = dataclasses.field(default_factory=dict)     # name -> containerStatus
    conditions: dict = dataclasses.field(default_factory=dict)
    deadline: Optional[float] = None   # set by a graceful delete
    termed: bool = False
    evicted: bool = False
    gone: bool = False                 # removed from the store
    placed: bool = False               # holds one of the node's places (see Api.capacity)
    queued: bool = True                # waits in the scheduler's queue (first come, first placed)
    order: int = 0                     # its place in that queue
    propagation: str = "Background"
    envs: dict = dataclasses.field(default_factory=dict)       # name -> env
    files: dict = dataclasses.field(default_factory=dict)      # name -> mounted files


class Kubelet:
    """Runs admitted pods with ``runner``; ``api`` is the double's API layer."""

    def __init__(self, api, runner: Callable[[ContainerStart], Handle]):
        self.api = api
        self.store = api.store
        self.runner = runner
        self.runs: dict[tuple[str, str], PodRun] = {}
        self.admitted = itertools.count()

    # -- entry points -------------------------------------------------------
    def admit(self, pod: dict) -> PodRun:
        meta = pod["metadata"]
        run = PodRun(meta["namespace"], meta["name"], meta["uid"],
                     [c["name"] for c in pod["spec"]["containers"]], order=next(self.admitted))
        self.runs[(run.namespace, run.name)] = run
        threading.Thread(target=self._life, args=(run,), daemon=True,
                         name=f"kubelet-{run.name}").start()
        return run

    def signal(self, run: PodRun, sig: int) -> None:
        for handle in list(run.handles.values()):
            handle.signal(sig)

    def evict(self, run: PodRun) -> None:
        """Kill the pod's containers and fail it with reason ``Evicted``."""
        with self.store.cond:
            pod = self._pod(run)
            if pod is None or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return
            run.evicted = True
            self.api.record_event(pod, "Evicted", "The node was low on resource: memory.",
                                  "Warning")
            if run.handles or run.restart_at:
                run.restart_at.clear()
                self.signal(run, signal.SIGKILL)
            else:
                self._finish(run, pod)

    # -- the pod's life ------------------------------------------------------
    def _life(self, run: PodRun) -> None:
        try:
            if self._schedule(run) and self._prepare(run):
                self._run(run)
        except Exception:  # surfaced by the fixture at teardown
            if not self.store.closed:
                self.api.errors.append(traceback.format_exc())
        finally:
            run.queued = False
            self.api.free_place(run)
            if run.gone or self.store.closed:
                self.signal(run, signal.SIGKILL)

    def _pod(self, run: PodRun) -> Optional[dict]:
        pod = self.store.get("pods", run.namespace, run.name)
        alive = pod and pod["metadata"]["uid"] == run.uid and not (run.gone or self.store.closed)
        return pod if alive else None

    def _wait_for(self, run: PodRun, ready: Callable[[], bool], seconds=None) -> bool:
        """Wait until ``ready()`` (or ``seconds``); False if the pod is going away."""
        end = None if seconds is None else time.monotonic() + seconds
        with self.store.cond:
            while True:
                if self.store.closed or not self._pod(run) or run.deadline or run.evicted:
                    return False
                if ready() or (end is not None and time.monotonic() >= end):
                    return True
                left = 0.2 if end is None else end - time.monotonic()
                self.store.cond.wait(max(0.0, min(0.2, left)))

    def _schedule(self, run: PodRun) -> bool:
        pod = self._pod(run)
        if pod is None:
            return False
        def admitted() -> bool:  # (under the store's lock)
            return not self.api.unschedulable_message(pod) and self.api.take_place(run)

        with self.store.cond:
            message = None if admitted() else (self.api.unschedulable_message(pod)
                                               or self.api.no_place_message())
        if message:
            self._set_condition(run, "PodScheduled", "False", "Unschedulable", message)
            self._publish(run, "Pending")
            self.api.record_event(pod, "FailedScheduling", message, "Warning", "default-scheduler")
            if not self._wait_for(run, admitted):
                return False
        with self.store.cond:
            if not (pod := self._pod(run)):
                return False
            pod["spec"]["nodeName"] = NODE
            self._set_condition(run, "PodScheduled", "True")
            self._publish(run, "Pending")
            self.api.record_event(pod, "Scheduled", f"Successfully assigned {run.namespace}/"
                                  f"{run.name} to {NODE}", "Normal", "default-scheduler")
            self._set_condition(run, "Initialized", "True")
            self._set_condition(run, "Ready", "False")       # _set_state refines it
            for name in run.containers:
                self._set_state(run, name, {"waiting": {"reason": "ContainerCreating"}})
            self._publish(run, "Pending")
        return True

    def _prepare(self, run: PodRun) -> bool:
        """Image pulls, then the containers' volumes and env; retried like a kubelet."""
        pod = self._pod(run)
        if pod is None:
            return False
        for c in pod["spec"]["containers"]:
            image = c["image"]
            self.api.record_event(pod, "Pulling", f'Pulling image "{image}"', field_path=c["name"])
            while (failure := self.api.pull_failure(image)) is not None:
                self._pull_failed(run, pod, c["name"], image, failure)
                if not self._wait_for(run, lambda: self.api.pull_failure(image) is None, 1.0):
                    return False
            self.api.record_event(pod, "Pulled", f'Container image "{image}" already present '
                                  "on machine", field_path=c["name"])
        reported = None
        while True:
            try:
                run.files = {c["name"]: container_files(self.store, pod, c)
                             for c in pod["spec"]["containers"]}
                break
            except MountError as exc:
                if str(exc) != reported:
                    reported = str(exc)
                    self.api.record_event(pod, "FailedMount", reported, "Warning")
            if not self._wait_for(run, lambda: False, 0.2):
                return False
        reported = None
        while True:
            try:
                if pod["spec"].get("initContainers"):
                    raise ConfigError("initContainers are not supported by the API server double")
                run.envs = {c["name"]: container_env(self.store, pod, c)
                            for c in pod["spec"]["containers"]}
                return True
            except ConfigError as exc:
                if str(exc) != reported:
                    reported = str(exc)
                    for name in run.containers:
                        self._set_state(run, name, {"waiting": {
                            "reason": "CreateContainerConfigError", "message": reported}})
                    self._publish(run, "Pending")
                    self.api.record_event(pod, "Failed", f"Error: {reported}", "Warning")
            if not self._wait_for(run, lambda: False, 0.2):
                return False

    def _pull_failed(self, run, pod, name, image, message) -> None:
        for reason, text in (("ErrImagePull", message), ("ImagePullBackOff",
                                                         f'Back-off pulling image "{image}"')):
            self._set_state(run, name, {"waiting": {"reason": reason, "message": text}})
            self._publish(run, "Pending")
            if reason == "ErrImagePull":
                self.api.record_event(pod, "Failed", f'Failed to pull image "{image}": {message}',
                                      "Warning", field_path=name)
            else:
                self.api.record_event(pod, "BackOff", text, "Normal", field_path=name)
            self.api.record_event(pod, "Failed", f"Error: {reason}", "Warning", field_path=name)
            if reason == "ErrImagePull":
                self._wait_for(run, lambda: False, PULL_BACKOFF)

    def _run(self, run: PodRun) -> None:
        with self.store.cond:
            pod = self._pod(run)
            if not pod or run.deadline or run.evicted:
                return
            status = pod.setdefault("status", {})
            status["podIP"], status["podIPs"] = HOST_IP, [{"ip": HOST_IP}]
            for c in pod["spec"]["containers"]:
                self._start(run, pod, c)
            self._publish(run, "Running" if run.handles else None)
        policy = pod["spec"].get("restartPolicy", "Always")
        with self.store.cond:
            while True:
                if run.gone or self.store.closed:
                    self.signal(run, signal.SIGKILL)
                    return
                self._reap(run, pod, policy)
                if not run.handles and not run.restart_at:
                    break
                self._enforce_deadline(run, pod)
                self.store.cond.wait(0.1)
            self._finish(run, pod)

    def _start(self, run: PodRun, pod: dict, c: dict) -> None:
        name = c["name"]
        log = LogBuffer(self.store.notify)
        run.logs.setdefault(name, []).append(log)
        env = run.envs[name]
        command = [expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
        state = run.states[name]
        try:
            handle = self.runner(ContainerStart(pod, c, env, command, log, run.files.get(name, {})))
        except StartError as exc:
            log.close()
            run.exits[name] = None
            self._set_state(run, name, {"terminated": {
                "exitCode": 128, "reason": "StartError", "message": str(exc),
                "startedAt": now(), "finishedAt": now()}})
            self.api.record_event(pod, "Failed", f"Error: {exc}", "Warning", field_path=name)
            return
        run.handles[name] = handle
        self.api.record_event(pod, "Created", f"Created container: {name}", field_path=name)
        self.api.record_event(pod, "Started", f"Started container {name}", field_path=name)
        state.update(containerID=handle.container_id, started=True, ready=True)
        self._set_state(run, name, {"running": {"startedAt": now()}})
        threading.Thread(target=self._waiter, args=(run, name, handle), daemon=True).start()

    def _waiter(self, run: PodRun, name: str, handle: Handle) -> None:
        code = handle.wait()
        with self.store.cond:
            if run.handles.get(name) is handle:
                run.exits[name] = code
                self.store.cond.notify_all()

    def _reap(self, run: PodRun, pod: dict, policy: str) -> None:
        """Record exited containers; restart them as ``restartPolicy`` says."""
        for name, code in list(run.exits.items()):
            del run.exits[name]
            run.handles.pop(name, None)
            state = run.states[name]
            if code is not None:   # None: StartError, already recorded
                started = state["state"].get("running", {}).get("startedAt", now())
                self._set_state(run, name, {"terminated": {
                    "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                    "startedAt": started, "finishedAt": now(),
                    "containerID": state.get("containerID", "")}}, ready=False)
            final_code = 128 if code is None else code
            if (policy == "Always" or (policy == "OnFailure" and final_code != 0)) \
                    and not (run.deadline or run.evicted):
                state["lastState"] = state["state"]
                state["restartCount"] += 1
                self._set_state(run, name, {"waiting": {
                    "reason": "CrashLoopBackOff", "message":
                    f"back-off 10s restarting failed container={name} pod={run.name}"}})
                run.restart_at[name] = time.monotonic() + RESTART_BACKOFF
            if run.handles or run.restart_at:   # else _finish publishes the final status
                self._publish(run, "Running")
        for name, at in list(run.restart_at.items()):
            if time.monotonic() >= at:
                del run.restart_at[name]
                self._start(run, pod, next(c for c in pod["spec"]["containers"]
                                           if c["name"] == name))
                self._publish(run, "Running")

    def _enforce_deadline(self, run: PodRun, pod: dict) -> None:
        if run.deadline is None:
            return
        run.restart_at.clear()
        if not run.termed:
            run.termed = True
            for name in run.handles:
                self.api.record_event(pod, "Killing", f"Stopping container {name}",
                                      field_path=name)
            self.signal(run, signal.SIGTERM)
        if time.monotonic() >= run.deadline:
            self.signal(run, signal.SIGKILL)

    def _finish(self, run: PodRun, pod: dict) -> None:
        codes = [s["state"].get("terminated", {}).get("exitCode", 1)
                 for s in run.states.values()]
        phase = "Succeeded" if all(c == 0 for c in codes) and not run.evicted else "Failed"
        reason = "PodCompleted" if phase == "Succeeded" else "ContainersNotReady"
        for cond in ("Ready", "ContainersReady"):
            self._set_condition(run, cond, "False", reason,
                                None if phase == "Succeeded" else
                                f"containers with unready status: [{' '.join(run.containers)}]")
        extra = {}
        if run.evicted:
            extra = {"reason": "Evicted", "message": "The node was low on resource: memory. "
                     "Threshold quantity: 100Mi, available: 50Mi. "}
        self._publish(run, phase, extra)
        if run.deadline is not None:
            self.api.finish_delete(run)

    # -- status ----------------------------------------------------------------
    def _set_condition(self, run, ctype, status, reason=None, message=None) -> None:
        old = run.conditions.get(ctype)
        cond = {"type": ctype, "status": status,
                "lastTransitionTime": old["lastTransitionTime"]
                if old and old["status"] == status else now()}
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        run.conditions[ctype] = cond

    def _set_state(self, run, name, state, ready=None) -> None:
        pod = self._pod(run)
        image = next((c["image"] for c in pod["spec"]["containers"] if c["name"] == name), "") \
            if pod else ""
        entry = run.states.setdefault(name, {"name": name, "image": image, "imageID": "",
                                             "ready": False, "restartCount": 0,
                                             "started": False, "state": {}})
        entry["state"] = state
        if "running" not in state:
            entry["ready"] = entry["started"] = False
        if ready is not None:
            entry["ready"] = ready
        if "Ready" in run.conditions:
            unready = [n for n in run.containers if not run.states.get(n, {}).get("ready")]
            for cond in ("Ready", "ContainersReady"):
                if unready:
                    self._set_condition(run, cond, "False", "ContainersNotReady",
                                        f"containers with unready status: [{' '.join(unready)}]")
                else:
                    self._set_condition(run, cond, "True")

    def _publish(self, run: PodRun, phase: Optional[str], extra: Optional[dict] = None) -> None:
        """Write the pod's status from ``run`` (a MODIFIED event if it changed)."""
        with self.store.cond:
            pod = self._pod(run)
            if pod is None:
                return
            old = pod.get("status") or {}
            status = {"phase": phase or old.get("phase", "Pending"),
                      "qosClass": old.get("qosClass"),
                      "conditions": list(run.conditions.values())}
            if pod["spec"].get("nodeName"):
                status.update(hostIP=HOST_IP, hostIPs=[{"ip": HOST_IP}],
                              startTime=old.get("startTime") or now())
            for key in ("podIP", "podIPs"):
                if key in old:
                    status[key] = old[key]
            if run.states:
                status["containerStatuses"] = [
                    {k: v for k, v in run.states[n].items() if k != "lastState" or v}
                    for n in run.containers if n in run.states]
            status.update(extra or {})
            status = {k: v for k, v in status.items() if v is not None}
            if status != old:
                pod["status"] = status
                self.store.update("pods", pod)
