"""Real-browser fixtures: Playwright driving Debian's Chromium against a real web
process (runserver) on the file-backed test databases, beside Celery workers and
CLI subprocesses (the `desk` fixture, tests/support.py)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from django.conf import settings

# Playwright's sync API runs an event loop in this thread; the ORM calls the
# tests make between browser steps are ordinary blocking calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("DESK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
PASSWORD = settings.DESK_DEMO_PASSWORD
# Every page a browser test opens must live within the Content Security Policy: the
# browser reports each violation as a `securitypolicyviolation` event (and a console
# message); the page fixture collects both and fails the test at teardown.
RECORD_CSP_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (event) => {
  window.reportCspViolation(`${event.effectiveDirective} blocked ${event.blockedURI || "inline"}`
    + ` at ${event.sourceFile || event.documentURI}:${event.lineNumber} ${event.sample || ""}`);
}, true);
"""
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def in_ci() -> bool:
    """Whether this is CI (`.ci/run` exports CI=true, as CI services do)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def require_chromium(path: str = CHROMIUM) -> None:
    """No browser: skip the browser tests on a developer's machine, but fail them in CI,
    which installs Chromium: there a missing browser is a broken CI, not a skip."""
    if Path(path).exists():
        return
    message = f"{path} is not installed (apt-get install chromium)"
    if in_ci():
        pytest.fail(f"{message}; CI must run the browser tests", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def browser():
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, desk):
    # A real web process, so a decision made in the browser reaches the
    # worker through the same broker, as in production.
    context = browser.new_context(base_url=desk.start_web(), viewport={"width": 1360, "height": 900})
    violations = []
    context.expose_function("reportCspViolation", lambda report: violations.append(report))
    context.add_init_script(RECORD_CSP_VIOLATIONS)
    page = context.new_page()
    page.set_default_timeout(15_000)
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.dialogs = dialogs

    def console(message):
        if "Content Security Policy" in message.text:
            violations.append(f"console: {message.text}")

    page.on("console", console)
    page.csp_violations = violations
    yield page
    # A round trip delivers the reports still on their way (a failed test may have
    # left the page mid-navigation: that is its own failure, not this one).
    with contextlib.suppress(Exception):
        page.evaluate("0")
    context.close()
    if violations:
        pytest.fail("Content Security Policy violations:\n" + "\n".join(violations))


def sign_in(page, username: str) -> None:
    page.goto("/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login/" not in url)


def screenshot(page, name: str, tmp_path: Path, *, full_page: bool = True) -> Path:
    """Screenshots go to docs/screenshots when DESK_UPDATE_SCREENSHOTS=1, else to tmp.
    ``full_page`` False: what the screen shows (a long page at 400 px, where it is read)."""
    folder = SCREENSHOTS if os.environ.get("DESK_UPDATE_SCREENSHOTS") else tmp_path
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path
