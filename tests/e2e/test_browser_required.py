"""The browser tests need Chromium: without it they skip on a developer's machine and
fail in CI, which installs it (`.ci/run`). No browser is started here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import require_chromium

ROOT = Path(__file__).resolve().parents[2]
MISSING = "/nonexistent/chromium"


@pytest.mark.parametrize("value", ["true", "1", "yes", "True"])
def test_in_ci_a_missing_browser_fails_the_browser_tests(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match=r"not installed .*CI must run the browser tests"):
        require_chromium(MISSING)


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_elsewhere_a_missing_browser_skips_them(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception, match=re.escape(f"{MISSING} is not installed")):
        require_chromium(MISSING)


def test_an_installed_browser_neither_skips_nor_fails(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "true")
    chromium = tmp_path / "chromium"
    chromium.touch()
    require_chromium(str(chromium))


def test_ci_tells_the_suite_it_is_ci():
    script = (ROOT / ".ci" / "run").read_text()
    exported = re.search(r"^export CI=true$", script, re.M)
    assert exported, ".ci/run must export CI=true"
    first_test_run = re.search(r"^make test", script, re.M)
    assert first_test_run and exported.start() < first_test_run.start()  # before the tests run
