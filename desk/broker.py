"""The embedded broker: kombu's file-system transport, with messages written atomically.

kombu's own ``_put`` creates the message file and then writes it; a worker polling
the folder in between moves the empty file away, fails to decode it and dies
("Unrecoverable error: JSONDecodeError"), and the nudge is lost. Here the message is
written under a name no reader picks up (``.<name>.part``) and renamed into place:
on one file system a rename is atomic, so a reader sees a whole message or none.

The exchange table (which queue a routing key goes to, under ``control``) had the
same window: kombu creates it empty and writes it afterwards, so a sender reading
it in between failed to decode it, and two workers binding at once could each
truncate the other's binding (a message sent then went nowhere). Here the table is
created whole (written aside, then linked into place, which fails if another got
there first), and only ever rewritten in place under kombu's exclusive lock.
kombu's transport also deletes a message the moment a worker fetches it, so a nudge
held by a worker that was killed was lost (the sweeper re-sent it after a lease).
Here a fetched message is moved (atomically, so one worker wins it) to an in-flight
folder, deleted when the worker acks it, put back when it rejects it, and moved back
to the queue if it is still in flight after ``visibility_timeout`` seconds (a dead
worker), as Redis does. Consumers that do not ack (Celery's remote control) have
theirs deleted at once. A task that runs longer than the visibility timeout is
delivered again meanwhile: every task here is idempotent (it claims its row).

It has no host (``filesystem://``), so it has no default hostname either: kombu's
"No hostname was supplied" warning came once per message.

``desk/celery.py`` makes this the ``filesystem://`` transport.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from queue import Empty
from time import monotonic, time

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads
from kombu.utils.objects import cached_property

# Where a fetched message's in-flight file is, in its delivery_info.
INFLIGHT = "countersign_inflight"


class QoS(virtual.QoS):
    def ack(self, delivery_tag):
        self.channel._forget(self._delivered.get(delivery_tag))
        super().ack(delivery_tag)

    def reject(self, delivery_tag, requeue=False):
        message = self._delivered.get(delivery_tag)
        super().reject(delivery_tag, requeue=requeue)  # a requeue puts a fresh copy first
        self.channel._forget(message)


class Channel(filesystem.Channel):
    QoS = QoS
    _returned_at = 0.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._no_ack_queues: set[str] = set()

    @cached_property
    def inflight_folder(self) -> str:
        default = os.path.join(os.path.dirname(os.path.normpath(self.data_folder_in)), "inflight")
        folder = self.transport_options.get("inflight_folder") or default
        os.makedirs(folder, exist_ok=True)
        return folder

    @cached_property
    def visibility_timeout(self) -> float:
        return float(self.transport_options.get("visibility_timeout", 3600))

    def basic_consume(self, queue, no_ack, *args, **kwargs):
        if no_ack:
            self._no_ack_queues.add(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_get(self, queue, no_ack=False, **kwargs):
        message = super().basic_get(queue, no_ack=no_ack, **kwargs)
        if message is not None and no_ack:
            self._forget(message)
        return message

    def _get(self, queue):
        self._return_stale()
        wanted = f"{queue}.msg"
        for filename in sorted(os.listdir(self.data_folder_in)):
            if filename.partition(".")[2] != wanted:
                continue
            source = os.path.join(self.data_folder_in, filename)
            inflight = os.path.join(self.inflight_folder, f"{filename}.{uuid.uuid4().hex}")
            try:
                # In flight since now, before it is in flight: a rename keeps the file's
                # time, and a message that waited past the visibility timeout would be
                # taken back by another worker's sweep (_return_stale) the moment it
                # arrived there.
                os.utime(source)
                # Atomic: of two workers after the same message, one moves it.
                os.rename(source, inflight)
            except FileNotFoundError:
                continue  # another worker took it
            try:
                with open(inflight, "rb") as f:
                    payload = loads(bytes_to_str(f.read()))
            except FileNotFoundError:
                continue  # moved on meanwhile (a sweep with another clock): not ours
            except OSError as exc:
                raise ChannelError(f"Cannot read file {inflight!r} from queue.") from exc
            if queue in self._no_ack_queues:
                os.remove(inflight)
            else:
                payload["properties"].setdefault("delivery_info", {})[INFLIGHT] = inflight
            return payload
        raise Empty()

    def _restore(self, message):
        super()._restore(message)  # a fresh copy back on its queue
        self._forget(message)

    def _forget(self, message) -> None:
        """The message was acked, rejected or restored: its in-flight file goes."""
        path = (message.delivery_info or {}).get(INFLIGHT) if message is not None else None
        if path:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)

    def _return_stale(self) -> None:
        """Put back messages in flight longer than the visibility timeout (their
        worker died); at most once a second per channel."""
        now = time()
        if now - self._returned_at < 1.0:
            return
        self._returned_at = now
        for name in os.listdir(self.inflight_folder):
            path = os.path.join(self.inflight_folder, name)
            try:
                if now - os.stat(path).st_mtime < self.visibility_timeout:
                    continue
                # Back under its queue name (without the in-flight suffix): first in line.
                os.rename(path, os.path.join(self.data_folder_in, name.rsplit(".", 1)[0]))
            except FileNotFoundError:
                continue  # acked, or returned by another worker, meanwhile

    def _put(self, queue, payload, **kwargs):
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # Starts with a dot: its part after the first dot is never "<queue>.msg".
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        if not file.exists():
            partial = file.with_name(f".{file.name}.{uuid.uuid4().hex}.part")
            try:
                partial.write_bytes(b"[]")
                # Fails if another process created it first: we bind into theirs.
                with contextlib.suppress(FileExistsError):
                    os.link(partial, file)
            except OSError as exc:
                raise ChannelError(f"Cannot create {file}") from exc
            finally:
                partial.unlink(missing_ok=True)
        # The table exists now: kombu adds the binding under its exclusive lock.
        super()._queue_bind(exchange, routing_key, pattern, queue)


class Transport(filesystem.Transport):
    Channel = Channel

    @property
    def default_connection_params(self) -> dict:
        # kombu's virtual transports default the hostname to "localhost", and a
        # Connection without one logs "No hostname was supplied. Reverting to default
        # 'localhost'" every time it is described or cloned (once per message sent
        # by a worker). A folder has no host: no default, no warning.
        return {"port": self.default_port}
