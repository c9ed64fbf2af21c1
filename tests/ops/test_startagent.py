"""`manage.py startagent NAME [--dir PATH]`: a team's agent package, written outside the
project's packages, in the house style, and nothing at all when it refuses. That the
package passes its own tests, run as documented: tests/integration/test_startagent.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError

from ops.management.commands import startagent
from tests.helpers import run_command

ROOT = Path(settings.BASE_DIR).resolve()
RUFF = Path(sys.executable).parent / "ruff"


def written(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_it_writes_the_agent_its_scenario_and_its_tests(tmp_path):
    said = run_command("startagent", "subs", "--dir", str(tmp_path))

    assert written(tmp_path / "subs") == [
        "README.md",
        "__init__.py",
        "agent.py",
        "scenario.json",
        "tests",
        "tests/__init__.py",
        "tests/conftest.py",
        "tests/test_agent.py",
    ]
    agent = (tmp_path / "subs" / "agent.py").read_text()
    assert "@tool(kind=READ)\ndef subs_get_account(" in agent
    assert (
        "@tool(undo=COMPENSABLE, compensate=reverse_credit, reconcile=find_credit, honours_key=True)" in agent
    )
    assert 'headers["Idempotency-Key"] = key' in agent
    assert 'os.environ.get("SUBS_URL"' in agent
    assert not any("{{" in p.read_text() for p in (tmp_path / "subs").rglob("*") if p.is_file())
    command = (
        f"DESK_AGENTS=subs.agent PYTHONPATH={tmp_path} .venv/bin/python -m pytest -c pyproject.toml "
        f"{tmp_path / 'subs' / 'tests'}"
    )
    assert command in said
    assert f"cd {ROOT}" in (tmp_path / "subs" / "README.md").read_text()


@pytest.mark.parametrize("name", ["subs", "a_forty_character_name_for_billing_desks"])
def test_its_files_are_in_the_house_style_whatever_the_names_length(tmp_path, name):
    run_command("startagent", name, "--dir", str(tmp_path))
    config = str(ROOT / "pyproject.toml")

    for check in (["check"], ["format", "--check", "--diff"]):
        result = subprocess.run(
            [str(RUFF), *check, "--config", config, str(tmp_path / name)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_it_writes_in_the_current_folder_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    run_command("startagent", "subs")

    assert (tmp_path / "subs" / "agent.py").is_file()


# --- refusals: each says why, and nothing is written ----------------------------------
def test_it_refuses_a_folder_that_exists(tmp_path):
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "agent.py").write_text("# ours\n")

    with pytest.raises(CommandError, match=r"subs exists already: startagent overwrites nothing"):
        run_command("startagent", "subs", "--dir", str(tmp_path))

    assert written(tmp_path) == ["subs", "subs/agent.py"]
    assert (tmp_path / "subs" / "agent.py").read_text() == "# ours\n"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("Subs", "is not a package name"),
        ("subs-desk", "is not a package name"),
        ("1subs", "is not a package name"),
        ("subs.agent", "is not a package name"),
        ("../subs", "is not a package name"),
        ("s" * 41, "is not a package name"),
        ("class", "is a Python keyword"),
        ("json", "is already the name of a Python module here"),
        ("runs", "is already the name of a Python module here"),
        ("onboarding", "an agent named onboarding is loaded here already"),
    ],
)
def test_it_refuses_a_name_that_cannot_be_an_agents_package(tmp_path, name, why):
    with pytest.raises(CommandError, match=why) as refused:
        run_command("startagent", name, "--dir", str(tmp_path))

    assert str(refused.value).endswith("Nothing was written.")
    assert written(tmp_path) == []


@pytest.mark.parametrize("inside", ["runs", "tools/refund_desk", "approvals/policy", "tests", "desk"])
def test_it_refuses_a_folder_inside_the_projects_own_packages(inside):
    before = written(ROOT / inside)

    with pytest.raises(CommandError, match=r"is inside the project's own package \w+/") as refused:
        run_command("startagent", "subs", "--dir", str(ROOT / inside))

    assert "an agent of your own lives outside the project" in str(refused.value)
    assert written(ROOT / inside) == before


def test_it_refuses_a_folder_that_does_not_exist(tmp_path):
    with pytest.raises(CommandError, match="there is no such folder"):
        run_command("startagent", "subs", "--dir", str(tmp_path / "nowhere"))

    assert written(tmp_path) == []


def test_a_failure_half_way_leaves_nothing_behind(tmp_path, monkeypatch):
    template = tmp_path / "template"
    (template / "tests").mkdir(parents=True)
    (template / "agent.py-tpl").write_text('"""{{ name }}"""\n')
    (template / "tests" / "test_agent.py-tpl").write_text("{{ unknown }}\n")
    monkeypatch.setattr(startagent, "TEMPLATE", template)
    (tmp_path / "out").mkdir()

    with pytest.raises(CommandError, match="a placeholder was left unfilled"):
        run_command("startagent", "subs", "--dir", str(tmp_path / "out"))

    assert written(tmp_path / "out") == []
