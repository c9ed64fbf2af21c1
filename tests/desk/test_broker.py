"""The embedded broker never hands a worker half a message."""

from __future__ import annotations

import threading

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
