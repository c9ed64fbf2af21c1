#!/usr/bin/env python
from __future__ import annotations

import os
import signal
import sys


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "desk.settings")
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped reading (`apitoken create | head -1`, `exportrun 7 | less`):
        # end quietly, as a Unix tool killed by SIGPIPE does, instead of a traceback.
        # What is still buffered goes nowhere, so exiting cannot fail on it again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as exc:
        from tools.loading import AgentLoadError

        if not isinstance(exc, AgentLoadError):
            raise
        # A broken agent module (DESK_AGENTS) stops every command: say which and why, once.
        print(f"Countersign will not start: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
