"""A tiny upstream MCP server for the gateway's proxy mode (stdio).

``python tests/integration/mcp_upstream_server.py NOTES_FILE``: ``read_notes`` (a read:
``readOnlyHint``) returns the file's lines; ``append_note`` (a write) appends one, so a
test counts the effects that reached the upstream.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server import MCPServer
from mcp.types import ToolAnnotations

NOTES = Path(sys.argv[1])
server = MCPServer("notes")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def read_notes() -> str:
    """Every note, one a line."""
    return NOTES.read_text() if NOTES.exists() else ""


@server.tool()
def append_note(text: str) -> str:
    """Add a note at the end of the notes file."""
    with NOTES.open("a") as notes:
        notes.write(text + "\n")
    return f"noted: {text}"


if __name__ == "__main__":
    server.run("stdio")
