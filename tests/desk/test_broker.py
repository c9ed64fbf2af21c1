"""The embedded broker never hands a worker half a message."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from queue import Empty

import pytest
from kombu import Connection

from desk.broker import Channel


def connection(tmp_path) -> Connection:
    folder = tmp_path / "queue"
    folder.mkdir(exist_ok=True)
    return Connection(
        "filesystem://",
        transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(tmp_path / "control"),
            "store_processed": False,
            "polling_interval": 0.01,
        },
    )


def test_filesystem_urls_use_the_atomic_channel(tmp_path):
    with connection(tmp_path) as conn:
        assert isinstance(conn.default_channel, Channel)


def test_a_reader_polling_while_messages_are_written_gets_every_one_whole(tmp_path):
    """kombu's own transport creates the file before writing it: a reader in between
    got an empty message and the worker died (JSONDecodeError)."""
    count = 400
    body = {"nudge": "x" * 20_000}  # big enough that a write is not one instant

    def write():
        with connection(tmp_path) as conn, conn.SimpleQueue("advance") as queue:
            for n in range(count):
                queue.put({**body, "n": n})

    seen = []
    # The queue is declared (bound) before anything is sent, as a worker does at start.
    with connection(tmp_path) as conn, conn.SimpleQueue("advance") as queue:
        writer = threading.Thread(target=write)
        writer.start()
        while len(seen) < count:
            message = queue.get(block=True, timeout=30)
            seen.append(message.payload["n"])
            message.ack()
    writer.join()
    assert sorted(seen) == list(range(count))
    assert not list((tmp_path / "queue").glob(".*.part"))


def test_workers_binding_at_once_keep_every_binding_and_a_sender_never_reads_half_a_table(tmp_path):
    """kombu creates the exchange table empty, then writes it: a sender reading it in
    between failed to decode it, and two binders could each truncate the other's
    binding, so a message sent to that queue went nowhere."""
    binders, rounds = 8, 15
    for attempt in range(rounds):
        folder = tmp_path / str(attempt)
        folder.mkdir()
        start = threading.Barrier(binders + 1)
        errors = []

        def bind(n, folder=folder, start=start, errors=errors):
            try:
                with connection(folder) as conn:
                    channel = conn.default_channel
                    start.wait()
                    channel._queue_bind("nudges", f"q{n}", "", f"q{n}")
            except Exception as exc:
                errors.append(repr(exc))

        def read(folder=folder, start=start, errors=errors):
            with connection(folder) as conn:
                channel = conn.default_channel
                start.wait()
                for _ in range(200):
                    try:
                        channel.get_table("nudges")
                    except Exception as exc:
                        errors.append(repr(exc))
                        return

        threads = [threading.Thread(target=bind, args=(n,)) for n in range(binders)]
        threads.append(threading.Thread(target=read))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == [], f"round {attempt}"
        with connection(folder) as conn:
            table = {entry.queue for entry in conn.default_channel.get_table("nudges")}
        assert table == {f"q{n}" for n in range(binders)}, f"round {attempt}"
        assert not list((folder / "control").glob(".*.part"))


# Each test its own queue name: kombu keeps the bindings it has made in a
# process-wide state, and would not bind the same name again in another folder.
def in_flight_connection(tmp_path, timeout: float = 3600) -> Connection:
    conn = connection(tmp_path)
    conn.transport_options.update(inflight_folder=str(tmp_path / "inflight"), visibility_timeout=timeout)
    return conn


FETCH_AND_DIE = """
import os, sys
sys.path.insert(0, {root!r})
from kombu import Connection
import desk.celery  # registers the desk's filesystem transport
conn = Connection("filesystem://", transport_options={options!r})
message = conn.SimpleQueue({queue!r}).get(block=True, timeout=10)
print(message.payload["n"], flush=True)
os._exit(0)  # killed: no ack, no clean shutdown
"""


def test_a_message_whose_worker_died_before_acking_comes_back_after_the_visibility_timeout(tmp_path):
    """kombu's transport deleted a message as a worker fetched it: a worker killed
    then lost the nudge for good."""
    with in_flight_connection(tmp_path) as conn, conn.SimpleQueue(tmp_path.name) as queue:
        queue.put({"n": 1})
        options = dict(conn.transport_options)
    root = str(Path(__file__).resolve().parents[2])
    script = FETCH_AND_DIE.format(root=root, options=options, queue=tmp_path.name)
    died = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert died.stdout.strip() == "1", died.stderr
    assert len(list((tmp_path / "inflight").iterdir())) == 1
    with (
        in_flight_connection(tmp_path) as conn,
        conn.SimpleQueue(tmp_path.name) as queue,
        pytest.raises(Empty),
    ):
        queue.get(block=False)  # still in flight: its worker might be alive
    # Later, past the visibility timeout (0: whatever is in flight is overdue).
    with in_flight_connection(tmp_path, timeout=0) as conn, conn.SimpleQueue(tmp_path.name) as queue:
        message = queue.get(block=False)
        assert message.payload == {"n": 1}
        message.ack()
    assert list((tmp_path / "inflight").iterdir()) == []


def test_an_acked_message_never_comes_back_and_a_rejected_one_comes_back_at_once(tmp_path):
    with in_flight_connection(tmp_path) as conn, conn.SimpleQueue(tmp_path.name) as queue:
        queue.put({"n": 1})
        queue.put({"n": 2})
        first = queue.get(block=True, timeout=5)
        first.ack()
        second = queue.get(block=True, timeout=5)
        second.reject(requeue=True)
        again = queue.get(block=True, timeout=5)
        # Two messages sent in the same millisecond may come in either order.
        assert again.payload == second.payload and {first.payload["n"], again.payload["n"]} == {1, 2}
        again.ack()
    assert_nothing_comes_back_past_the_visibility_timeout(tmp_path)


def test_a_consumer_that_does_not_ack_leaves_nothing_in_flight(tmp_path):
    with (
        in_flight_connection(tmp_path) as conn,
        conn.SimpleQueue(tmp_path.name, no_ack=True) as queue,
    ):
        queue.put({"n": 1})
        assert queue.get(block=True, timeout=5).payload == {"n": 1}
    assert_nothing_comes_back_past_the_visibility_timeout(tmp_path)


def assert_nothing_comes_back_past_the_visibility_timeout(tmp_path) -> None:
    """Later, past the visibility timeout (0: whatever is in flight is overdue), the
    queue is empty: nothing was left in flight to come back."""
    with (
        in_flight_connection(tmp_path, timeout=0) as conn,
        conn.SimpleQueue(tmp_path.name) as queue,
        pytest.raises(Empty),
    ):
        queue.get(block=False)
    assert list((tmp_path / "inflight").iterdir()) == []


def test_messages_through_the_embedded_broker_log_no_hostname_warning(tmp_path, caplog):
    """kombu warned "No hostname was supplied" each time a hostless connection was
    described or cloned: once per message a worker sent (1,384 lines in one soak)."""
    with caplog.at_level("DEBUG", logger="kombu"), connection(tmp_path) as conn:
        for n in range(5):
            # A producer pool clones its connection; a worker's banner describes it.
            with conn.clone() as sender, sender.SimpleQueue(tmp_path.name) as queue:
                queue.put({"n": n})
                assert conn.as_uri().startswith("filesystem://")
            with conn.SimpleQueue(tmp_path.name) as queue:
                message = queue.get(block=True, timeout=10)
                assert message.payload == {"n": n}
                message.ack()
    assert "hostname" not in caplog.text.lower()


def test_a_message_that_waited_past_the_visibility_timeout_is_not_taken_back_while_fetched(
    tmp_path, monkeypatch
):
    """A message that sat in the queue longer than the visibility timeout (a busy desk:
    it is the lease, 3 s in the soak) kept its old time when a worker moved it in
    flight; another worker's sweep of stale messages, right then, put it back on the
    queue, and the first worker, finding its file gone, died with "Cannot read file
    ... from queue" (a soak trial's worker crash). It is in flight since the fetch."""
    with in_flight_connection(tmp_path, timeout=60) as conn, conn.SimpleQueue(tmp_path.name) as queue:
        queue.put({"n": 1})
        queue.put({"n": 2})
        for message in (tmp_path / "queue").iterdir():
            os.utime(message, (1, 1))  # written long ago: past any visibility timeout
        with in_flight_connection(tmp_path, timeout=60) as other:
            sweeper = other.default_channel
            real_rename = os.rename

            def rename_then_sweep(source, target):
                real_rename(source, target)
                sweeper._returned_at = 0.0  # the other worker's once-a-second sweep is due
                sweeper._return_stale()

            monkeypatch.setattr("desk.broker.os.rename", rename_then_sweep)
            first = queue.get(block=False)
            monkeypatch.setattr("desk.broker.os.rename", real_rename)
            second = queue.get(block=False)
        assert {first.payload["n"], second.payload["n"]} == {1, 2}
        first.ack()
        second.ack()
    assert_nothing_comes_back_past_the_visibility_timeout(tmp_path)


def test_a_message_gone_from_flight_before_it_is_read_is_skipped_not_fatal(tmp_path, monkeypatch):
    """Whatever moved it (a sweep with another clock, an operator), a fetched message
    whose in-flight file is gone before it is read is not this worker's: it looks at
    the next one and stays up."""
    with in_flight_connection(tmp_path) as conn, conn.SimpleQueue(tmp_path.name) as queue:
        queue.put({"n": 1})
        real_rename = os.rename
        taken = []

        def rename_then_lose(source, target):
            real_rename(source, target)
            if not taken:
                taken.append(target)
                os.remove(target)

        monkeypatch.setattr("desk.broker.os.rename", rename_then_lose)
        with pytest.raises(Empty):
            queue.get(block=False)
        queue.put({"n": 2})
        assert queue.get(block=False).payload == {"n": 2}
