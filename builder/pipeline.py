"""Block work on a second core: an ordered map over worker threads, so the main thread writes block i while the
workers read and pack blocks i+1, i+2.

numpy releases the GIL inside its array loops and copies, and os.pread/os.pwrite release it during the system call,
so threads run truly in parallel here. Results come back in submission order, so output stays byte-identical
whatever the timing. At most `ahead` blocks are in flight, which bounds the memory the pipeline holds.
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def worker_count() -> int:
    """Threads for block packing: the CPUs this process may use, at most 4 (QO_WORKERS overrides; 0 = inline)."""
    env = os.environ.get("QO_WORKERS")
    if env is not None and env.strip().isdigit():
        return int(env)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


_POOL: ThreadPoolExecutor | None = None


def _forget_pool() -> None:
    """A forked child inherits the pool object but not its threads: work submitted there would never run."""
    global _POOL
    _POOL = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, worker_count()), thread_name_prefix="qo-pack")
    return _POOL


def ordered_map(fn: Callable[[T], R], items: Iterable[T], ahead: int = 3) -> Iterator[R]:
    """fn(item) for every item, computed by the worker threads, yielded in order; at most `ahead` in flight."""
    if worker_count() == 0:
        for item in items:
            yield fn(item)
        return
    pool, pending = _pool(), deque()
    it = iter(items)
    try:
        for item in it:
            pending.append(pool.submit(fn, item))
            if len(pending) >= ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for fut in pending:  # consumer stopped early (an error): drop what is queued, wait for what runs
            fut.cancel()
        for fut in pending:
            if not fut.cancelled():
                try:
                    fut.result()
                except BaseException:  # noqa: BLE001 - the consumer's own error is the one that matters
                    pass
