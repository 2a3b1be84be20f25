"""The worker: claim, run, finish.

One process runs one :class:`Worker`, made of small services around one owner of its shared
state, the ledger (``_ledger``):

- the producer (``_producer``) claims up to the number of free slots in one statement whenever it
  is woken (a notification, the fallback poll, the next known ``run_at``, a freed slot when it was
  saturated, a reconnect), and registers the worker as idle before it sleeps;
- the runners (``_runners``) run the jobs they are given, one per slot, through the executor
  (``_executor``: the handler, its timeout, its result as JSON);
- the outcome writer (``_writer``) records outcomes in batches, one statement per kind, fenced by
  (worker, claim), and on exit puts back what it still holds; the statement that records
  completions also claims jobs for the slots free then (a dependent it unblocked starts at once);
- the heartbeat (``_heartbeat``) renews leases and confirms running handlers; the rescuer
  (``_rescuer``) requeues the jobs of workers that stopped renewing theirs; retention
  (``_maintenance``) deletes old finished jobs, or moves them to the archive; the periodic
  enqueuer (``_periodic``) enqueues cron ticks.

Stopping happens in two phases: stop claiming and give running jobs ``shutdown_grace`` seconds;
then stop the rest and put them back in the queue at once, inside a shielded scope.
:class:`Supervisor` keeps the worker inside an API process running.
"""

from __future__ import annotations

from notifyq.worker._maintenance import archive, prune
from notifyq.worker._stats import Pulse, Signals, WorkerStats
from notifyq.worker._store import WorkerStore
from notifyq.worker._supervisor import Supervisor
from notifyq.worker._worker import Worker, make_worker_id

__all__ = [
    "Pulse",
    "Signals",
    "Supervisor",
    "Worker",
    "WorkerStats",
    "WorkerStore",
    "archive",
    "make_worker_id",
    "prune",
]
