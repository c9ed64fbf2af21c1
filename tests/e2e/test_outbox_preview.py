"""The outbox shows the whole email (issue 21 part 5): its HTML part in a frame as tall
as the email, down to the Decide link and the footer, and its whole text; the HTML still
runs nothing."""

from __future__ import annotations

import pytest

from approvals.models import DeskEmail
from tests.helpers import deliver, pending, start

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


@pytest.mark.parametrize("width", [1366, 400])
def test_the_email_preview_shows_the_whole_email(page, desk, users, outbox_backend, tmp_path, width):
    approval = pending(start(requester=users["requester"]))
    deliver()
    email = DeskEmail.objects.filter(to="reviewer@countersign.local").first()
    page.set_viewport_size({"width": width, "height": 800})
    sign_in(page, "admin")
    page.goto(f"/desk/outbox/{email.pk}/")
    frame = page.get_by_test_id("outbox-html")
    # The frame grows to its email: nothing of it is hidden behind a scroll of its own.
    page.wait_for_function(
        """() => { const f = document.querySelector('[data-testid=outbox-html]');
        const doc = f.contentDocument && f.contentDocument.documentElement;
        return doc && doc.scrollHeight > 0 && f.clientHeight >= doc.scrollHeight; }"""
    )
    inner = page.frame_locator("[data-testid=outbox-html]")
    decide = inner.locator(f"a[href$='/desk/approvals/{approval.pk}/']").last
    link_box, frame_box = decide.bounding_box(), frame.bounding_box()
    assert link_box["y"] + link_box["height"] <= frame_box["y"] + frame_box["height"]
    assert inner.get_by_text("You receive this because", exact=False).is_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    text = page.get_by_test_id("outbox-text")
    assert f"/desk/approvals/{approval.pk}/" in text.inner_text()
    # The whole text too: no box of its own to scroll.
    assert text.evaluate("el => el.scrollHeight <= el.clientHeight")
    if width == 400:  # the wide one is test_mail's outbox-email
        screenshot(page, "outbox-email-narrow", tmp_path)


def test_a_framed_email_that_keeps_the_desks_origin_still_cannot_act(page, desk, users):
    """The frame keeps the desk's origin to be measured: its HTML still submits no form,
    navigates no page but its own frame, and runs nothing."""
    email = DeskEmail.objects.create(
        subject="Hostile",
        from_email="desk@countersign.local",
        to="reviewer@countersign.local",
        body="text",
        html='<form method="post" action="/logout/"><button id="post">Sign out</button></form>'
        '<a id="top" href="/logout/" target="_top">Leave</a>'
        '<p onclick="parent.document.title = \'owned\'" id="p">Click</p>',
    )
    sign_in(page, "admin")
    page.goto(f"/desk/outbox/{email.pk}/")
    inner = page.frame_locator("[data-testid=outbox-html]")
    inner.locator("#post").click()
    inner.locator("#top").click()  # a click waits for the navigation it starts, had it been allowed
    inner.locator("#p").click()
    assert page.url.endswith(f"/desk/outbox/{email.pk}/")
    assert page.title() == "Hostile · Outbox · Countersign" and page.dialogs == []
    page.goto("/desk/")
    assert "/login/" not in page.url  # still signed in: no form reached /logout/
