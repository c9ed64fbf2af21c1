"""A deadline for a call into a tool: past it, the tool is stopped with ``ToolTimedOut``.

In a process's main thread (a Celery worker's task, a ``manage.py --sync`` command) an
interval timer's SIGALRM raises it inside the tool, which also breaks a blocking read
from a socket. In any other thread (the web's request threads, where the HTTP and MCP
gateways run tools) a watchdog thread raises it asynchronously in the tool's thread
(``PyThreadState_SetAsyncExc``): at once in Python code, but a call blocked in C (a
socket read with no timeout of its own) is stopped only when it returns, so a tool's
own HTTP client should have a timeout too (docs/agents.md).

``ToolTimedOut`` is a BaseException, like KeyboardInterrupt: a tool's ``except
Exception`` cannot swallow it and carry on as if it had time left.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import signal
import threading
import time
from collections.abc import Callable
from typing import Any


class ToolTimedOut(BaseException):
    """The call ran past its deadline and was stopped."""

    seconds: float = 0.0

    def __init__(self, seconds: float | None = None) -> None:
        if seconds is not None:
            self.seconds = seconds
        super().__init__(f"did not answer within {self.seconds:g} s and was stopped")


def call_with_deadline(seconds: float | None, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, stopped with ToolTimedOut after ``seconds`` (None: no deadline)."""
    if not seconds:
        return function(*args)
    if threading.current_thread() is threading.main_thread() and _alarm_is_free():
        return _with_alarm(seconds, function, args)
    return _WATCHDOG.call(seconds, function, args)


# --- the main thread: an interval timer --------------------------------------------


def _alarm_is_free() -> bool:
    """Nobody else uses SIGALRM (a test runner, a deadline already running here)."""
    return signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None) and not any(
        signal.getitimer(signal.ITIMER_REAL)
    )


def _with_alarm(seconds: float, function: Callable, args: tuple) -> Any:
    armed = True

    def ring(signum, frame):
        if armed:
            raise ToolTimedOut(seconds)

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return function(*args)
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- other threads: one watchdog thread per process ---------------------------------
def _set_async_exc(thread_id: int, exception: type[BaseException] | None) -> None:
    """Raise ``exception`` in thread ``thread_id`` at its next instruction (None: take
    back one not raised yet)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exception) if exception is not None else None
    )


class _Deadline:
    __slots__ = ("done", "exception", "fired", "lock", "thread_id")

    def __init__(self, thread_id: int, exception: type[BaseException]) -> None:
        self.thread_id = thread_id
        self.exception = exception
        self.lock = threading.Lock()
        self.fired = False
        self.done = False


class _Watchdog:
    """Deadlines of calls in threads other than the main one, on one daemon thread."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._counter = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def call(self, seconds: float, function: Callable, args: tuple) -> Any:
        # An async exception is raised by its class, with no arguments: a subclass per
        # call carries the seconds.
        exception = type("ToolTimedOut", (ToolTimedOut,), {"seconds": seconds})
        deadline = _Deadline(threading.get_ident(), exception)
        with self._wake:
            self._start()
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._counter), deadline))
            self._wake.notify()
        try:
            return function(*args)
        finally:
            with deadline.lock:
                deadline.done = True
                if deadline.fired:
                    # Fired as the call returned: take back what is not raised yet.
                    _set_async_exc(deadline.thread_id, None)

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._watch, daemon=True, name="tool-deadlines")
            self._thread.start()

    def _watch(self) -> None:
        while True:
            with self._wake:
                while not self._heap:
                    self._wake.wait()
                when, _, deadline = self._heap[0]
                now = time.monotonic()
                if when > now:
                    self._wake.wait(when - now)
                    continue
                heapq.heappop(self._heap)
            with deadline.lock:
                if not deadline.done:
                    deadline.fired = True
                    _set_async_exc(deadline.thread_id, deadline.exception)


_WATCHDOG = _Watchdog()
