"""The master's machinery of one pool: its workers, its result thread, its imap feeders.

:class:`Core` holds the state and threads behind a :class:`~fiberlite.pool.Pool` (the
user's facade, in :mod:`.pool`); the servant that hands out chunks is its
:class:`~fiberlite.pool.master.dispatch.Dispatcher`. Threads in the master: the hub's
(dispatch), the one that reads the sockets of workers of this machine (:mod:`.nearby`),
a supervisor (waits on the workers' sentinels, starts replacements), a result thread
(unpickles results, runs callbacks), and one feeder per ``imap`` call (:mod:`.feeding`).
"""
from __future__ import annotations

import concurrent.futures
import itertools
import math
import os
import threading
import weakref
from dataclasses import replace
from multiprocessing.connection import wait as wait_for
from typing import Any

from ... import config, observe
from ...errors import BrokenPoolError, ProcessError
from ...runtime import exit_order, identity
from ...runtime.hub import get_hub, unregister
from ...runtime.limits import check_room
from ...runtime.machine import machine_id
from ..chunks import encoding_error, unpack, unpack_failure
from ..job.host import host_main
from ..job.upstream import HubUpstream, NearbyUpstream
from ..job.worker import worker_main
from . import nearby
from .dispatch import Dispatcher
from .packing import DESCRIPTORS_PER_JOB, workers_per_job
from .records import BROKEN, CLOSE, REMOTE_ERROR, RUN, TERMINATE, VALUE
from .relay import HostedWorker, HostRelay
from .results import IMapIterator

START_CONCURRENCY = 16  # jobs being created at once
PIDS_TIMEOUT = 30.0  # seconds worker_processes waits for the pids of hosted workers being forked
# a pool of at most this many workers: those hosted on this machine reach the dispatcher
# over the nearby socket, a hop shorter; a larger one pays per host's message, not per worker's
NEARBY_HOSTED_MAX = 64
_cores: "weakref.WeakSet[Core]" = weakref.WeakSet()


class Core:
    """The state and threads of one pool; the ``Pool`` object is its facade."""

    def __init__(self, processes: int, initializer: Any, initargs: tuple,
                 maxtasks: int | None, process_type: type) -> None:
        self.processes = processes  # workers wanted while there is work (resize changes it)
        self.idle_timeout = float(config.get("idle_timeout") or 0)  # 0: keep them
        self.initializer = initializer
        self.initargs = tuple(initargs)
        self.maxtasks = maxtasks
        self.process_type = process_type  # the context's Process: a job on its backend
        self.state = RUN
        self.results: dict[int, Any] = {}
        self._job_ids = itertools.count()
        self.procs: dict[int, Any] = {}
        self._wids = itertools.count(1)
        self._state_lock = threading.Lock()
        self._results_cond = threading.Condition()
        self._deliveries: list = []
        self._results_stop = False
        self.dispatcher = Dispatcher(self._deliver,
                                     on_idle_change=self.wake if self.idle_timeout else None)
        self.ref = get_hub().register(self.dispatcher)
        self._wake_r, self._wake_w = os.pipe()
        self._retry_delay = 0.0
        self.per_job = workers_per_job(processes, process_type)
        self.relay: HostRelay | None = None
        if self.per_job > 1:  # workers run in hosts, forked there: procs are the hosts
            self.relay = HostRelay(self.dispatcher, self._replacement, self.wake)
            self.relay_ref = get_hub().register(self.relay)
            self._hids = itertools.count(1)
        small = processes <= NEARBY_HOSTED_MAX
        self.nearby = self._listen_nearby() if self.per_job == 1 or small else None
        check_room(DESCRIPTORS_PER_JOB * math.ceil(processes / self.per_job), f"Pool({processes})")
        try:  # the first round here, so that an error is raised by Pool(); the supervisor
            self._start_jobs(min(processes, self._round()))  # starts the rest as it runs
        except BaseException:
            self.terminate()
            raise
        self._result_thread = threading.Thread(target=self._result_loop, daemon=True,
                                               name="fiberlite-pool-results")
        self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                            name="fiberlite-pool-supervisor")
        self._result_thread.start()
        self._supervisor.start()
        _cores.add(self)
        if self.dispatcher.staying() < processes:
            self.wake()

    # -- results ---------------------------------------------------------------------------
    def register_result(self, sink: Any) -> int:
        job = next(self._job_ids)
        self.results[job] = sink
        return job

    def forget_result(self, job: int) -> None:
        sink = self.results.pop(job, None)
        if sink is not None and observe.watchers:
            observe.notice("finished", sink)

    def _deliver(self, results: list) -> None:
        """Results of chunks, ``(values, entries)`` each, for the result thread."""
        with self._results_cond:
            idle = not self._deliveries
            self._deliveries.extend(results)
            if idle:
                self._results_cond.notify()

    def _result_loop(self) -> None:
        cond = self._results_cond
        while True:
            with cond:
                while not self._deliveries:
                    if self._results_stop:
                        return
                    cond.wait()
                batch, self._deliveries = self._deliveries, []
            for values, entries in batch:
                self._apply(values, entries)
            # nothing of the results just delivered is kept while waiting for the next
            batch = values = entries = None

    @staticmethod
    def _apply(values: Any, entries: list) -> None:
        """Hand results to their sinks; a watcher of the run hears of each failure (the
        tasks done, it reads from the sinks: nothing is counted here)."""
        loaded: Any = None
        error: BaseException | None = None
        if values is not None:
            try:
                loaded = unpack(values)
            except Exception as exc:
                error = encoding_error(repr(exc), "results sent by a worker")
        for sink, start, count, status, data in entries:
            ok, value = False, None
            try:
                if status == VALUE:
                    ok, value = (True, loaded[data]) if error is None else (False, error)
                elif status == REMOTE_ERROR:
                    value = unpack_failure(data)
                else:
                    value = data
                sink._set(start, count, ok, value)
            except Exception:  # a sink must never stop the result thread
                import traceback
                traceback.print_exc()
            if not ok and observe.watchers:
                observe.notice("tasks", sink, count, value)

    def _stop_results(self, wait: bool) -> None:
        with self._results_cond:
            self._results_stop = True
            self._results_cond.notify()
        thread = getattr(self, "_result_thread", None)
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def abort_results(self, error: BaseException) -> None:
        for sink in list(self.results.values()):
            sink._abort(error)

    # -- workers ---------------------------------------------------------------------------
    def _wanted(self) -> int:
        """Workers the pool should run now: none while released for being idle."""
        return 0 if self.dispatcher.released else self.processes

    def resize(self, processes: int) -> None:
        """Run ``processes`` workers from now on: more are started at once; of the ones
        too many, those not started yet are stopped, idle ones exit now, busy ones after
        their current task, giving back the chunks they have not started."""
        with self._state_lock:
            if self.state != RUN:
                raise ValueError("Pool not running")
            if processes > self.processes:
                check_room(DESCRIPTORS_PER_JOB * math.ceil(processes / self.per_job),
                           f"Pool.resize({processes})")
            self.processes = processes
            excess = self.dispatcher.staying() - self._wanted()
            self._stop_unstarted(self.dispatcher.retire(excess) if excess > 0 else [])
        self.wake()

    def _stop_unstarted(self, wids: list[int]) -> None:
        """Stop the jobs of workers let go before they ever asked for work (a pod still
        Pending, a job still starting): a host only when none of its workers started."""
        if not wids:
            return
        if self.relay is None:
            jobs = [self.procs.get(wid) for wid in wids]
        else:
            jobs = [self.procs.get(hid) for hid in self.relay.hosts_of_only(set(wids))]
        for process in jobs:
            if process is not None:
                try:
                    process.terminate()
                except Exception:
                    pass

    def _release_if_idle(self) -> float | None:
        """Let the workers go when the pool had no work for ``idle_timeout`` seconds;
        the seconds left until then (None: nothing to wait for)."""
        if not self.idle_timeout:
            return None
        left, unstarted = self.dispatcher.release_if_idle(self.idle_timeout)
        self._stop_unstarted(unstarted)
        return left

    def worker_processes(self) -> list:
        """The workers' processes; a worker forked in a host as its pid."""
        if self.relay is None:
            return list(self.procs.values())
        return [HostedWorker(pid, self.relay) for pid in self.relay.pids(timeout=PIDS_TIMEOUT)]

    def _round(self) -> int:
        """Workers whose jobs are created in one round: ``START_CONCURRENCY`` jobs."""
        return self.per_job * START_CONCURRENCY

    def _start_jobs(self, workers: int) -> None:
        """Start jobs for ``workers`` more workers, up to ``START_CONCURRENCY`` at a time
        (a cluster's API answers each creation in its own time); the first error is raised."""
        sizes = [min(self.per_job, workers - done) for done in range(0, workers, self.per_job)]
        if len(sizes) == 1:
            self._start_job(sizes[0])
            return
        with concurrent.futures.ThreadPoolExecutor(min(START_CONCURRENCY, len(sizes)),
                                                   "fiberlite-pool-start") as starters:
            for started in [starters.submit(self._start_job, size) for size in sizes]:
                started.result()

    def _start_job(self, count: int) -> None:
        if self.relay is None:
            self._start_worker()
        else:
            self._start_host(count)

    def _start_host(self, count: int) -> None:
        hid = next(self._hids)
        wids = [next(self._wids) for _ in range(count)]
        for wid in wids:
            self.dispatcher.add_worker(wid, hosted=True)
        self.relay.add_host(hid, wids)
        process = self.process_type(
            target=host_main, name=f"PoolHost-{hid}", daemon=True,
            args=(self.relay_ref, hid, wids, self.initializer, self.initargs, self.maxtasks,
                  self._nearby_address()))
        # the pool works with the jobs that start; a backend may size the job by its workers
        process.launch_options = replace(process.launch_options, waits_for_capacity=True,
                                         workers=count, forks_template=True)
        try:
            process.start()
        except BaseException:
            self.relay.forget_host(hid)
            raise
        self.procs[hid] = process

    def _replacement(self, hid: int) -> int | None:
        """The id of a worker to start in host ``hid`` in place of one that ended. Runs on
        the hub's thread, which must not wait for the supervisor's lock: a worker added
        while the pool terminates is told to exit when it asks for work."""
        if self.state == TERMINATE or not self.dispatcher.needs_workers():
            return None
        wid = next(self._wids)
        return wid if self.dispatcher.add_worker_below(wid, self._wanted(), hosted=True) else None

    def _start_worker(self) -> None:
        wid = next(self._wids)
        process = self.process_type(
            target=worker_main, name=f"PoolWorker-{wid}", daemon=True,
            args=(self._upstream(), wid, self.initializer, self.initargs, self.maxtasks))
        process.launch_options = replace(process.launch_options, waits_for_capacity=True)
        self.dispatcher.add_worker(wid)
        try:
            process.start()
        except BaseException:
            self.dispatcher.remove_worker(wid)
            raise
        self.procs[wid] = process

    def _listen_nearby(self) -> nearby.NearbyWorkers | None:
        """Workers that are jobs of their own and share this machine skip the hub."""
        if not (nearby.available() and config.get("share_machine")):
            return None
        try:
            return nearby.NearbyWorkers(self.dispatcher, identity.key())
        except OSError:
            return None  # (the hub serves them all)

    def _upstream(self) -> Any:
        """How a worker that is a job of its own reaches the dispatcher."""
        hub = HubUpstream(self.ref)
        if self.nearby is None:
            return hub
        return NearbyUpstream(hub, *self._nearby_address())

    def _nearby_address(self) -> tuple[str, str] | None:
        """``(socket name, machine id)`` of the socket of this machine's workers, if any."""
        return None if self.nearby is None else (self.nearby.address, machine_id())

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _supervise(self) -> None:
        """Reap workers that exit, start replacements; stop when the pool is done. What
        goes wrong here breaks the pool with an error every caller sees."""
        try:
            self._supervise_loop()
        except Exception as exc:
            self.dispatcher.fail(BrokenPoolError(f"the pool's supervisor failed: {exc!r}"))
            self.abort_results(self.dispatcher.broken_error)

    def _supervise_loop(self) -> None:
        dispatcher = self.dispatcher
        while True:
            waits = [w for w in (self._retry_delay or None, self._release_if_idle())
                     if w is not None]
            sentinels = {process.sentinel: wid for wid, process in list(self.procs.items())}
            ready = wait_for(list(sentinels) + [self._wake_r], min(waits) if waits else None)
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 4096)
                except OSError:
                    pass
            if self.state == TERMINATE:
                return
            for fd in ready:
                wid = sentinels.get(fd)
                if wid is None:
                    continue
                process = self.procs.pop(wid)
                process.join()  # not closed: Pool._pool may have handed it out (its
                code = process.exitcode  # sentinel is released when it is collected)
                if self.relay is None:
                    dispatcher.worker_exited(wid, code)
                else:
                    self.relay.host_gone(wid, code)
            if dispatcher.state == BROKEN:
                self.abort_results(dispatcher.broken_error)
                for process in list(self.procs.values()):
                    process.kill()
                if not self.procs:
                    return
                continue
            self._replace()
            if not self.procs and not dispatcher.needs_workers():
                return

    def _replace(self) -> None:
        """Start the workers the pool lacks, a round at a time: the lock is let go between
        rounds, so that ``terminate()`` does not wait for hundreds of pods to be created."""
        self._retry_delay = 0.0
        dispatcher = self.dispatcher
        while dispatcher.staying() < self._wanted() and dispatcher.needs_workers():
            with self._state_lock:
                if self.state == TERMINATE:
                    return
                try:
                    self._start_jobs(min(self._wanted() - dispatcher.staying(), self._round()))
                except Exception as exc:
                    self.dispatcher.start_failed(f"could not be created: {exc}")
                    self._retry_delay = 1.0  # try again later
                    return

    # -- shutdown ----------------------------------------------------------------------------
    def close(self) -> None:
        with self._state_lock:
            if self.state == RUN:
                self.state = CLOSE
        self.dispatcher.close()
        for sink in list(self.results.values()):
            if isinstance(sink, IMapIterator):
                sink._wake()  # feeders stop waiting for room
        self.wake()

    def terminate(self) -> None:
        with self._state_lock:
            if self.state == TERMINATE:
                return
            self.state = TERMINATE
        _cores.discard(self)
        self.dispatcher.terminate()
        self.wake()
        supervisor = getattr(self, "_supervisor", None)
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join()
        procs = list(self.procs.values())
        for process in procs:
            try:
                process.terminate()
            except Exception:
                pass
        for process in procs:
            try:
                process.join(5)
                if process.exitcode is None:
                    process.kill()
                    process.join()
            except Exception:
                pass
        self.procs.clear()
        self.abort_results(ProcessError("the pool was terminated before this result was ready"))
        self._stop_results(wait=True)
        self._release()

    def join(self) -> None:
        supervisor = getattr(self, "_supervisor", None)
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join()
        for process in list(self.procs.values()):
            process.join()
        self._stop_results(wait=True)
        self._release()

    def _release(self) -> None:
        if getattr(self, "nearby", None) is not None:
            self.nearby.close()
        unregister(self.ref.oid)
        if self.relay is not None:
            unregister(self.relay_ref.oid)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1


def _terminate_all() -> None:
    """At exit, stop the pools still running (before their daemonic workers are reaped)."""
    for core in list(_cores):
        try:
            core.terminate()
        except Exception:
            pass


exit_order.at_exit("pools", _terminate_all)
