"""Running a sweep's tasks: on a local Dask scheduler (a pool of worker processes started
from a fork server, threads, or this thread) or on a ``dask.distributed`` cluster, counting
progress; Ctrl-C cancels the work and stops local workers."""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.context import BaseContext
from multiprocessing.pool import Pool
from typing import TYPE_CHECKING

from ._model import SweepResult
from ._plan import ProgressCallback, _Task
from ._worker import _CANCELLED, _forget, _run_batch

if TYPE_CHECKING:
    from distributed import Client


def _ignore_sigint() -> None:
    """Worker processes leave Ctrl-C to the caller, which stops them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _pool_context() -> BaseContext:
    """The multiprocessing context for the workers, its fork server started if it has one.

    Workers are forked from a fork server that has imported accelrt once ("forkserver": no
    threads of this process are copied, and a pool starts in milliseconds once the server
    runs); where there is none (Windows), they are fresh interpreters ("spawn"). The server
    starts with Ctrl-C blocked, and so do the workers it forks (until they ignore it): Ctrl-C
    is this process's to handle, and it stops them.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()  # (it blocks Ctrl-C itself while it starts)
    # a blocked signal stays blocked in a new program; a Ctrl-C meanwhile waits, not lost
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return context


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[list[int]]:
    """Hold back Ctrl-C inside the block; the list it gives says whether one came."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield came
    finally:
        signal.signal(signal.SIGINT, previous)


def _start_pool(context: BaseContext, workers: int) -> Pool:
    """Start the worker processes; a Ctrl-C meanwhile stops them once they are all known.

    (A worker left starting when this process exits would print a traceback.)
    """
    with _sigint_deferred() as interrupted:
        pool = context.Pool(workers, _ignore_sigint)
    if interrupted:
        pool.terminate()
        pool.join()
        raise KeyboardInterrupt
    return pool


def _run_local(
    scheduler: str,
    batches: list[tuple[_Task, ...]],
    sizes: list[int],
    workers: int,
    counter: _Counter,
) -> list[SweepResult]:
    sweep_id = batches[0][0].sweep_id
    pool = None
    try:
        # the fork server imports accelrt while this process imports Dask
        context = _pool_context() if scheduler == "processes" else None
        import dask
        from dask.callbacks import Callback

        if context is not None:
            pool = _start_pool(context, workers)

        # the local schedulers run ready tasks by key, highest first: number them so that the
        # largest traces start first and the small ones fill in at the end
        order = sorted(range(len(batches)), key=lambda i: (-sizes[i], i))
        keys = {i: f"accelrt-sweep-{len(batches) - rank:06d}" for rank, i in enumerate(order)}
        delayed = [
            dask.delayed(_run_batch, pure=False)(batch, dask_key_name=keys[i])
            for i, batch in enumerate(batches)
        ]
        counter.expect(batches, keys)

        class _Progress(Callback):  # type: ignore[misc]
            def _posttask(
                self,
                key: str,
                result: Sequence[SweepResult],
                dsk: object,
                state: object,
                worker: object,
            ) -> None:
                counter.done(key, result)

        kwargs: dict[str, object] = {"scheduler": scheduler}
        if pool is not None:
            kwargs.update(pool=pool, chunksize=1)
        elif scheduler == "threads":
            kwargs.update(num_workers=workers)
        with _Progress():
            out = dask.compute(*delayed, **kwargs)
    except BaseException:
        _CANCELLED.add(sweep_id)  # threads: running replays stop at their next check
        if pool is not None:
            pool.terminate()
        raise
    finally:
        if pool is not None:
            pool.close()
            pool.join()
        _forget(sweep_id)
    return [row for rows in out for row in rows]


class _Counter:
    """Combinations done, for the progress callback, and each task's rows handed to a sink
    (the results file) as the task finishes, before the progress callback is called.

    Parameters
    ----------
    progress : callable, optional
        ``progress(done, total)``, in combinations.
    sink : callable, optional
        Called with each finished task's rows.
    already : int
        Combinations done before this run (a resumed sweep's), counted in ``done`` and ``total``.
    """

    def __init__(
        self,
        progress: ProgressCallback | None,
        sink: Callable[[Sequence[SweepResult]], None] | None = None,
        already: int = 0,
    ) -> None:
        self.planned: dict[str, int] = {}
        self.total = self.count = already
        self.progress = progress
        self.sink = sink

    def expect(self, batches: list[tuple[_Task, ...]], keys: Mapping[int, str]) -> None:
        """Count the batches of batches to run (by their keys) and report that nothing more is
        done yet."""
        self.planned = {keys[i]: sum(t.planned for t in batch) for i, batch in enumerate(batches)}
        self.total += sum(self.planned.values())
        if self.progress is not None:
            self.progress(self.count, self.total)

    def done(self, key: str, rows: Sequence[SweepResult]) -> None:
        planned = self.planned.pop(key, None)
        if planned is None:
            return
        if self.sink is not None:
            self.sink(rows)
        self.total += len(rows) - planned  # a URL's snapshot adds its recorded setting
        self.count += len(rows)
        if self.progress is not None:
            self.progress(self.count, self.total)


def _run_distributed(
    client: Client, batches: list[tuple[_Task, ...]], sizes: list[int], counter: _Counter
) -> list[SweepResult]:
    from distributed import as_completed

    sweep_id = batches[0][0].sweep_id
    keys = {i: f"accelrt-sweep-{sweep_id}-{i}" for i in range(len(batches))}
    counter.expect(batches, keys)
    futures = [
        client.submit(_run_batch, batch, key=keys[i], pure=False, priority=sizes[i])
        for i, batch in enumerate(batches)
    ]
    try:
        for future in as_completed(futures, loop=client.loop):
            counter.done(future.key, future.result())
        results = [f.result() for f in futures]
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        with contextlib.suppress(Exception):
            client.run(_forget, sweep_id)  # the traces the workers keep loaded
    return [row for rows in results for row in rows]
