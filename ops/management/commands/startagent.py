"""``manage.py startagent NAME [--dir PATH]``: a package for an agent of one's own, outside
the project's packages: the agent module (a read tool and a compensable write tool
against a placeholder service), a scenario, and tests of its gating that pass as written
(``desk.testing``; docs/testing-agents.md). The files come from ``ops/agent_template/``."""

from __future__ import annotations

import importlib.util
import keyword
import os
import re
import shutil
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError

from core.commands import DeskCommand
from tools.registry import agent_names

TEMPLATE = Path(__file__).resolve().parents[2] / "agent_template"
# The package's name is also the agent's, its tools' prefix and its service's variable
# (NAME_URL): a Python package name, short enough for every one of them.
NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


def name_refusal(name: str) -> str | None:
    """Why ``name`` cannot be an agent's package, or None."""
    if not NAME.fullmatch(name):
        return (
            f"{name!r} is not a package name: use 1 to 40 lowercase letters, digits and '_', "
            "starting with a letter (e.g. subs or billing_desk)"
        )
    if keyword.iskeyword(name):
        return f"{name!r} is a Python keyword: it cannot be imported as a package"
    if name in agent_names():
        return f"an agent named {name} is loaded here already: choose another name"
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is not None:
        where = f" ({found.origin})" if found.origin not in (None, "built-in", "frozen") else ""
        return (
            f"{name!r} is already the name of a Python module here{where}: "
            "DESK_AGENTS would import that one instead. Choose another name"
        )
    return None


def project_package(path: Path) -> Path | None:
    """The project's own package (runs/, tools/, tests/, ...) that ``path`` lies in, or None."""
    root = Path(settings.BASE_DIR).resolve()
    for package in sorted(root.iterdir()):
        if (package / "__init__.py").is_file() and path.is_relative_to(package):
            return package
    return None


class Command(DeskCommand):
    help = (
        "Write a package for an agent of your own in --dir (default: the current folder): "
        "NAME/agent.py (a read tool and a compensable write tool against NAME_URL), "
        "NAME/scenario.json, NAME/tests (its gating, tested against a fake of the service) "
        "and NAME/README.md with the commands that load and test it."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="the package's and the agent's name, e.g. subs")
        parser.add_argument("--dir", default=".", help="the folder to write NAME/ in (default: here)")

    def handle(self, *args, name: str, dir: str, **options):
        if refusal := name_refusal(name):
            raise CommandError(f"startagent {name}: {refusal}. Nothing was written.")
        parent = Path(dir).expanduser().resolve()
        if not parent.is_dir():
            raise CommandError(f"--dir {dir}: there is no such folder. Nothing was written.")
        target = parent / name
        if (package := project_package(target)) is not None:
            raise CommandError(
                f"{target} is inside the project's own package {package.name}/: an agent of your own "
                "lives outside the project (e.g. --dir ~/agents), so that the desk imports it only "
                "through DESK_AGENTS and an upgrade of the desk never touches it. Nothing was written."
            )
        if target.exists() or target.is_symlink():
            raise CommandError(
                f"{target} exists already: startagent overwrites nothing. Nothing was written."
            )
        written = _write(target, name=name, parent=parent)
        self.stdout.write(f"Wrote agent {name} in {target}:")
        for path in written:
            self.stdout.write(f"  {path.relative_to(parent)}")
        self.stdout.write(
            f"\nIts tests, from {settings.BASE_DIR}:\n"
            f"  DESK_AGENTS={name}.agent PYTHONPATH={parent} .venv/bin/python -m pytest -c pyproject.toml "
            f"{target / 'tests'}\n"
            f"Every process of the desk loads it with DESK_AGENTS={name}.agent PYTHONPATH={parent} "
            f"in its environment ({target / 'README.md'})."
        )


def _write(target: Path, *, name: str, parent: Path) -> list[Path]:
    """Render the template into a new folder beside ``target``, then move it into place
    in one rename: a failure half-way leaves nothing behind."""
    tokens = {
        "{{ name }}": name,
        "{{ NAME }}": name.upper(),
        "{{ project }}": str(Path(settings.BASE_DIR).resolve()),
        "{{ parent }}": str(parent),
    }
    building = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=parent))
    try:
        for source in sorted(TEMPLATE.rglob("*-tpl")):
            text = source.read_text(encoding="utf-8")
            for token, value in tokens.items():
                text = text.replace(token, value)
            if "{{" in text:
                raise CommandError(f"{source}: a placeholder was left unfilled")
            relative = source.relative_to(TEMPLATE).with_name(source.name.removesuffix("-tpl"))
            (building / relative).parent.mkdir(parents=True, exist_ok=True)
            (building / relative).write_text(text, encoding="utf-8")
        # mkdtemp makes a private folder; the package gets what any new folder would.
        umask = os.umask(0)
        os.umask(umask)
        for folder in (building, *(p for p in building.rglob("*") if p.is_dir())):
            folder.chmod(0o777 & ~umask)
        building.rename(target)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return sorted(path for path in target.rglob("*") if path.is_file())
