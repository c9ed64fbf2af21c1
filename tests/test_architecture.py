"""The house rules of docs/architecture.md, read from the code's own imports (grimp):
every module stands on a floor, imports only from its floor or below, and no files
import each other in a circle, imports inside functions and TYPE_CHECKING included."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grimp
import pytest

PACKAGES = ("core", "tools", "runs", "approvals", "api", "ops", "desk")

# Longest prefix wins. Lower numbers are lower floors; a module may import its own
# floor and those below it, never one above.
FLOORS = {
    # The ground floor: what every room uses and no room owns. The record (its rows,
    # chain, facts digests and triggers), the hashes, sealing and sealed fields, money,
    # locks, raw SQL for hot rows, log context. It imports nothing of ours above it.
    "core": 0,
    "tools": 1,  # the world and the tools over it
    "runs": 2,  # the loop
    # approvals: one app, its rooms as floors. The pieces its models use, then the
    # models, then record <- policy <- review <- notify <- decisions, and on top
    # the app's own modules (gate, admin, urls, analytics, templatetags, commands).
    "approvals.notify.errors": 3.0,
    "approvals.notify.endpoints": 3.0,  # where a webhook may go, for WebhookEndpoint.clean
    "approvals.notify.models": 3.0,  # notify's models, registered by approvals.models
    "approvals.models": 3.1,
    "approvals.record": 3.2,  # audit, verify, anchors, export and import
    "approvals.policy": 3.3,  # rules, shadow, standing, the decided rule
    "approvals.review": 3.4,  # what a reviewer reads, who may decide
    "approvals.notify": 3.5,  # email, digests, webhooks, Slack messages; called by decisions
    "approvals.decisions": 3.6,  # requests, proposals, votes, claims, SLA, the desk, Slack's buttons
    "approvals": 3.7,  # the gate (DESK_GATE) and the app's top
    "api": 4,
    "ops": 4,  # operator commands that read across the apps
    "desk": 5,  # the project: settings, urls, metrics, Celery app
}


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*PACKAGES)


def floor(module: str) -> float:
    for prefix in sorted(FLOORS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return FLOORS[prefix]
    raise AssertionError(f"{module} stands on no floor: add it to FLOORS")


def where(graph, importer: str, imported: str) -> str:
    lines = sorted({d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)})
    return f"{importer} imports {imported} (line {', '.join(map(str, lines))})"


def test_no_module_imports_from_a_floor_above_its_own(graph):
    upward = [
        where(graph, importer, imported)
        for importer in sorted(graph.modules)
        for imported in sorted(graph.find_modules_directly_imported_by(importer))
        if floor(imported) > floor(importer)
    ]
    assert not upward, "arrows that run back up:\n" + "\n".join(upward)


def circles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_files_import_each_other_in_a_circle(graph):
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_finds_a_circle_of_three():
    """The check above cannot pass for want of seeing: a planted circle is found."""
    planted = grimp.ImportGraph()
    for name in ("a.one", "a.two", "a.three", "a.four"):
        planted.add_module(name)
    planted.add_import(importer="a.one", imported="a.two")
    planted.add_import(importer="a.two", imported="a.three")
    planted.add_import(importer="a.three", imported="a.one")
    planted.add_import(importer="a.four", imported="a.one")
    assert circles(planted) == [["a.one", "a.three", "a.two"]]


ROOT = Path(__file__).resolve().parents[1]
LONG = 700  # lines


def long_files() -> list[str]:
    """Python files over LONG lines, bench/ and migrations aside."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith((".venv/", "bench/", "var/")) or "/migrations/" in relative:
            continue
        if path.read_text(encoding="utf-8").count("\n") > LONG:
            found.append(relative)
    return found


def test_every_long_file_says_in_the_architecture_why_it_is_long():
    architecture = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    unexplained = [name for name in long_files() if f"`{name}`" not in architecture]
    assert not unexplained, (
        f"over {LONG} lines with no sentence in docs/architecture.md (section 'Long files') "
        "saying why: " + ", ".join(unexplained)
    )


def house_drawn() -> tuple[dict[str, int], list[str]]:
    """The house as docs/architecture.md draws it: each package's floor (a line that
    starts ``floor N  pkg/`` or is indented under one as ``pkg/``), and approvals' rooms
    from the top down (``room/`` two columns further in)."""
    architecture = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = architecture.split("## The house", 1)[1].split("```")[1]
    floors: dict[str, int] = {}
    rooms: list[str] = []
    current = None
    for line in block.splitlines():
        package = re.match(r"^(?:floor (\d)  | {9})(\w+)/ ", line)
        if package:
            current = int(package.group(1)) if package.group(1) else current
            floors[package.group(2)] = current
        elif room := re.match(r"^ {11}(\w+)/ ", line):
            rooms.append(room.group(1))
    return floors, rooms


def test_the_house_drawn_in_the_architecture_is_the_house_the_imports_hold():
    """The drawing is the test's floors: a package moved in one and not the other fails."""
    floors, rooms = house_drawn()
    assert floors == {package: int(FLOORS[package]) for package in PACKAGES}
    assert rooms == sorted(rooms, key=lambda room: -FLOORS[f"approvals.{room}"])
    assert set(rooms) == {"decisions", "notify", "review", "policy", "record"}


# approvals' vocabulary: its models' choices and constants, its permission.
APPROVALS_NAMES = {
    "ApprovalRequest",
    "ApprovalStatus",
    "GuardKind",
    "GuardAction",
    "GUARD_ACTIONS",
    "DECIDE_PERMISSION",
}


def _docstrings(tree) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def approvals_named_in(package: str) -> list[str]:
    """Where ``package``'s code names approvals' vocabulary: a name of it, or a string
    naming its app ("approvals.decide_approvalrequest") or a path through its models
    ("approval__votes__reviewer"). Docstrings and comments may explain; code may not."""
    found = []
    for path in sorted(Path(package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            name = getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", None)
            if isinstance(node, ast.Name | ast.Attribute | ast.ClassDef) and name in APPROVALS_NAMES:
                found.append(f"{path}:{node.lineno} names {name}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                text = node.value
                if "approvals." in text or text.startswith("approval_") or "__approval" in text:
                    found.append(f"{path}:{node.lineno} says {text[:60]!r}")
    return found


def test_runs_names_no_approvals_status_guard_action_or_permission():
    """The loop asks the gate through its protocol (runs.gate) and no more: the run
    pages, who may cancel or hand over, the outcome that reads approvals, and the
    vocabulary itself live in approvals."""
    assert approvals_named_in("runs") == []


def test_the_vocabulary_scan_finds_what_it_looks_for(tmp_path, monkeypatch):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "bad.py").write_text(
        '"""Mentions approvals.models in a docstring: fine."""\n'
        "from approvals.models import ApprovalStatus\n"
        'PERM = "approvals.decide_approvalrequest"\n'
        'rows = qs.prefetch_related("approval__votes__reviewer")\n'
        "x = call.approval.status == ApprovalStatus.PENDING\n"
        "class GuardKind:\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    assert sorted(line.split(" ", 1)[0] for line in approvals_named_in("runs")) == [
        "runs/bad.py:3",
        "runs/bad.py:4",
        "runs/bad.py:5",
        "runs/bad.py:6",
    ]
