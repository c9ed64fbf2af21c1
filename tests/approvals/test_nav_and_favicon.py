"""Small things a newcomer notices (issue 21): the nav marks only the page it links to
(Preferences is not the Inbox), and the desk has an icon, at /favicon.ico too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from tests.helpers import client_for

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def current(html: str) -> list[str]:
    """The nav links marked as the current page."""
    nav = html.split('class="main-nav"', 1)[1].split("</nav>", 1)[0]
    return re.findall(r'<a href="[^"]*" aria-current="page"[^>]*>(\w+)', nav)


@pytest.mark.parametrize(
    "url, marked",
    [("/desk/inbox/", ["Inbox"]), ("/desk/preferences/", []), ("/runs/", ["Runs"]), ("/desk/", ["Queue"])],
)
def test_the_nav_marks_the_page_it_links_to(users, url, marked):
    html = client_for(users["admin"]).get(url).content.decode()
    assert current(html) == marked


def test_every_page_links_the_icon_and_favicon_ico_leads_to_it(users):
    html = client_for(users["reviewer"]).get("/desk/").content.decode()
    icon = re.search(r'<link rel="icon" href="([^"]+)" type="image/svg\+xml">', html)
    assert icon and icon.group(1).startswith("/static/") and icon.group(1).endswith(".svg")
    anonymous = Client()
    assert b'rel="icon"' in anonymous.get("/login/").content
    # Browsers ask for /favicon.ico on their own, logged in or not: no 404, no login page.
    response = anonymous.get("/favicon.ico")
    assert response.status_code == 302 and response["Location"] == icon.group(1)
    # A static file (served by whitenoise; tests/e2e/test_narrow_pages.py fetches it).
    assert "<svg" in Path(finders.find("favicon.svg")).read_text()
