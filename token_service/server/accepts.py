"""Keep-alive connections spread over the gevent workers: a busier worker lets a less busy one accept first.

All gunicorn workers accept from one listening socket. A new connection
wakes them all and the first to call ``accept`` takes it, and with
keep-alive it stays with that worker for its whole life. When a client
opens a few connections at once (a proxy's pool, wrk's 8), one worker
often ends up with most of them: measured with 2 workers and wrk's 8
connections, 6 + 2, 7 + 1 or 8 + 0 in 17 runs of 32. That worker is then saturated
while the other idles, and its queue is the tail (gevent's p99 at 8
connections was about three times sync's, whose workers take one
connection at a time).

Here each gevent worker publishes how many client connections it holds in
a small table in memory shared by the master and its workers (one slot per
worker, assigned by the master before it forks). A worker about to accept
while another holds fewer connections first waits up to
:data:`DEFER_SECONDS`: the less busy worker, woken for the same connection,
takes it. If nobody did, the waiting worker accepts it then, so nothing is
refused or lost and a connection waits at most that long; workers holding
as many connections as each other accept at once, as before.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable
from typing import Any

__all__ = ["DEFER_SECONDS", "FREE", "SLOTS", "Table", "install"]

SLOTS = 64  # workers beyond that accept as gunicorn does
DEFER_SECONDS = 0.002
FREE = 1 << 62  # a slot no accepting worker holds: never the least busy


class Table:
    """Each slot: the client connections a worker holds (``FREE`` when no accepting worker has it)."""

    def __init__(self, slots: int = SLOTS) -> None:
        # anonymous and shared: the workers forked later see the same pages
        self._memory = mmap.mmap(-1, 8 * slots)
        self.counts = memoryview(self._memory).cast("q")
        for slot in range(slots):
            self.counts[slot] = FREE

    def claim(self, taken: Iterable[int | None]) -> int | None:
        """In the master, before a fork: a slot no live worker holds (None when all are taken)."""
        used = set(taken)
        for slot in range(len(self.counts)):
            if slot not in used:
                self.counts[slot] = FREE
                return slot
        return None

    def release(self, slot: int | None) -> None:
        """In the master, when the worker holding ``slot`` has exited."""
        if slot is not None:
            self.counts[slot] = FREE

    def others_less_busy(self, slot: int) -> bool:
        return bool(min(self.counts) < self.counts[slot])


def install(worker: Any, table: Table, slot: int | None) -> None:
    """In a gevent worker (``post_fork``): count its connections in ``slot``; defer accepts when busier."""
    if slot is None:
        return
    mine: int = slot
    from gevent.server import StreamServer
    from gunicorn.workers import ggevent

    counts = table.counts
    handle = worker.handle

    def handle_counted(listener: Any, client: Any, addr: Any) -> None:
        counts[mine] += 1
        try:
            handle(listener, client, addr)
        finally:
            counts[mine] -= 1

    class BalancedStreamServer(StreamServer):  # type: ignore[misc]
        _deferred = False

        def start(self) -> None:
            counts[mine] = 0
            super().start()

        def close(self) -> None:
            counts[mine] = FREE  # no longer accepting: nobody should wait for this worker
            super().close()

        def do_read(self) -> Any:
            if not self._deferred and table.others_less_busy(mine):
                self._deferred = True
                # as gevent's own back-off after a failed accept: stop watching, a timer resumes
                self.stop_accepting()
                self._timer = self.loop.timer(DEFER_SECONDS)
                self._timer.start(self._start_accepting_if_started)
                return None
            self._deferred = False
            return super().do_read()

    worker.handle = handle_counted
    # the name GeventWorker.run builds its servers with, in this process only
    ggevent.StreamServer = BalancedStreamServer
