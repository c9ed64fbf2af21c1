"""The embedded broker: kombu's file-system transport, with messages written atomically.

kombu's own ``_put`` creates the message file and then writes it; a worker polling
the folder in between moves the empty file away, fails to decode it and dies
("Unrecoverable error: JSONDecodeError"), and the nudge is lost. Here the message is
written under a name no reader picks up (``.<name>.part``) and renamed into place:
on one file system a rename is atomic, so a reader sees a whole message or none.
``desk/celery.py`` makes this the ``filesystem://`` transport.
"""

from __future__ import annotations

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


class Transport(filesystem.Transport):
    Channel = Channel
