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
``desk/celery.py`` makes this the ``filesystem://`` transport.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
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
