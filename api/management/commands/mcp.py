"""``manage.py mcp --agent NAME --user NAME``: the MCP gateway over stdio.

An MCP client starts this command and talks JSON-RPC on its stdin and stdout; stdout
belongs to the protocol (the SDK points fd 1 at stderr while it serves, so stray
output such as the console email backend's cannot corrupt it).
"""

from __future__ import annotations

import argparse

import anyio
from django.conf import settings
from django.core.management.base import CommandError
from mcp.server.stdio import stdio_server

from api.mcp_gateway import DEFAULT_SESSION, Gateway, gateway_server
from core.commands import DeskCommand
from runs.external import SESSION_PATTERN, external_session_disconnected
from runs.management.commands._common import text_argument, user_by_name
from runs.models import Run
from tools.registry import get_agent

# A call may wait this long at most: past it, the client is told to collect the call later.
MAX_WAIT_SECONDS = 24 * 3600


def wait_seconds(text: str) -> float:
    try:
        value = float(text) if text.isascii() else -1
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_WAIT_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 0 to {MAX_WAIT_SECONDS}")
    return value


class Command(DeskCommand):
    help = (
        "Serve an agent's tools as an MCP server over stdio, for one user: every call is "
        "reviewed by the desk's gate and run by the desk at most once."
    )
    # Stdout is the protocol: Django's own checks must not print to it.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--agent",
            required=True,
            help="the agent whose tools to serve (refund-desk, or a name in DESK_MCP_UPSTREAMS)",
        )
        parser.add_argument("--user", required=True, help="whom the calls are made for (the requester)")
        parser.add_argument(
            "--session",
            default=DEFAULT_SESSION,
            help=f"the session's name (default {DEFAULT_SESSION!r}): the same name finds earlier calls again",
        )
        parser.add_argument(
            "--wait",
            type=wait_seconds,
            default=None,
            metavar="SECONDS",
            help="how long a call that needs approval waits before answering 'pending approval' "
            "(default DESK_MCP_WAIT_SECONDS)",
        )

    def handle(self, *args, agent, user, session, wait, **options):
        person = user_by_name(user)
        if not person.is_active:
            raise CommandError(f"User {user!r} is inactive.")
        session = text_argument(session, "The session name")
        if not SESSION_PATTERN.match(session):
            raise CommandError("A session name is 1-100 characters of letters, digits and . _ : -")
        try:
            spec = get_agent(text_argument(agent, "The agent name"))
        except LookupError as exc:
            raise CommandError(str(exc).capitalize() + ".") from None
        gateway = Gateway(
            user=person,
            agent_name=spec.name,
            session=session,
            wait_seconds=settings.DESK_MCP_WAIT_SECONDS if wait is None else wait,
        )
        server = gateway_server(gateway)

        async def serve() -> None:
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())

        anyio.run(serve)
        # The client closed its end: its session ends with it ("client disconnected"),
        # unless a call of it waits for a person (beat's idle close comes later).
        external_session_disconnected(
            user=person, agent_name=spec.name, session=session, kind=Run.Kind.GATEWAY
        )
