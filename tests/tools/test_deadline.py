"""A tool's deadline stops it, in the main thread (a worker's task, a --sync command) and
in any other thread (the web's request threads), and never fires after it returned."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.support import ROOT
from tools.deadline import ToolTimedOut, call_with_deadline


def spin():
    while True:
        pass


def test_a_hang_in_another_thread_is_stopped_at_its_deadline():
    said = {}

    def in_a_request_thread():
        began = time.monotonic()
        try:
            call_with_deadline(0.2, spin)
        except ToolTimedOut as exc:
            said["message"], said["after"] = str(exc), time.monotonic() - began

    thread = threading.Thread(target=in_a_request_thread)
    thread.start()
    thread.join(10)
    assert said["message"] == "did not answer within 0.2 s and was stopped"
    assert said["after"] < 5


def test_an_answer_in_time_is_the_answer_and_nothing_fires_later():
    results = []

    def quick():
        for _ in range(200):
            results.append(call_with_deadline(0.05, lambda: 7))
        time.sleep(0.2)  # past every deadline: none may fire now

    thread = threading.Thread(target=quick)
    thread.start()
    thread.join(10)
    assert results == [7] * 200 and not thread.is_alive()


def test_the_tool_cannot_swallow_it_with_except_exception():
    said = []

    def swallows():
        try:
            spin()
        except Exception:  # a tool's broad except: the deadline is not an Exception
            said.append("swallowed")

    def run():
        try:
            call_with_deadline(0.2, swallows)
        except ToolTimedOut:
            said.append("stopped")

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert said == ["stopped"]


def test_in_the_main_thread_a_timer_stops_even_a_blocked_sleep():
    # Run where no test runner holds SIGALRM (pytest-timeout does here).
    code = textwrap.dedent(
        """
        import signal, time
        from tools.deadline import ToolTimedOut, call_with_deadline
        began = time.monotonic()
        try:
            call_with_deadline(0.3, time.sleep, 30)
        except ToolTimedOut as exc:
            print(exc, round(time.monotonic() - began) < 5)
        print(call_with_deadline(0.3, lambda: "in time"))
        time.sleep(0.5)  # the timer was cleared: nothing rings now
        print(signal.getsignal(signal.SIGALRM) == signal.SIG_DFL, signal.getitimer(signal.ITIMER_REAL))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.splitlines() == [
        "did not answer within 0.3 s and was stopped True",
        "in time",
        "True (0.0, 0.0)",
    ], result.stderr


@pytest.mark.parametrize("seconds", [None, 0])
def test_no_deadline_calls_straight_through(seconds):
    assert call_with_deadline(seconds, lambda x: x + 1, 1) == 2
