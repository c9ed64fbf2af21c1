"""No page is wider than a 400 px screen (issue 21 part 5), even with a 200-character
unbroken token in a run's task, a call's arguments, a reviewer's comment and the emails
they lead to: every page a person can reach, at 400 px, has no horizontal overflow."""

from __future__ import annotations

import pytest

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, DeskEmail
from runs.engine import run_advance_until_settled
from tests.helpers import decide, deliver, pending, script, start, turn

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]

TOKEN = "Q7" * 100  # 200 characters with nowhere to break
NARROW = {"width": 400, "height": 800}


def finished_run_with_the_token(users):
    """A refund of A-1003 to the end, the token in the task, the arguments, the email
    and every reviewer's comment."""
    steps = script(
        turn(("get_order", {"order_id": "A-1003"}), ("get_policy", {}), text=f"Reading. {TOKEN}"),
        turn(("refund_item", {"order_id": "A-1003", "amount": 900, "reason": TOKEN}), text="Refunding."),
        turn(("send_email", {"to": "linus@example.com", "subject": TOKEN, "body": TOKEN}), text="Emailing."),
        turn(("close_ticket", {"ticket_id": "T-3"}), text="Closing."),
        turn(text=f"Refunded, emailed and closed. {TOKEN}"),
    )
    run = start(steps, task=f"Refund order A-1003: {TOKEN}", requester=users["requester"])
    waiting = ApprovalRequest.objects.filter(run=run, status="pending", kind="call")
    while (item := waiting.first()) is not None:
        decide(item, users["senior"], Decision.of("approve", comment=f"Fine: {TOKEN}"))
        run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == "done", list(run.approvals.values_list("kind", "status", "reason"))
    return run


def waiting_run_with_the_token(users):
    steps = script(
        turn(("get_order", {"order_id": "A-1001"}), ("get_policy", {}), text=f"Reading. {TOKEN}"),
        turn(("refund_item", {"order_id": "A-1001", "amount": 2900, "reason": TOKEN})),
    )
    return start(steps, task=f"Refund order A-1001: {TOKEN}", requester=users["requester"])


def too_wide(page, url: str) -> str | None:
    page.goto(url)
    width = page.evaluate("document.documentElement.scrollWidth")
    if width <= NARROW["width"]:
        return None
    # Name the widest element, to say what to fix.
    culprit = page.evaluate(
        """() => {
        const wide = (el) => el.getBoundingClientRect().right > innerWidth + 0.5;
        const name = (el) => el.tagName.toLowerCase() + [...el.classList].map((c) => '.' + c).join('');
        const found = [...document.querySelectorAll('body *')]
          .filter((el) => wide(el) && ![...el.children].some(wide));
        // Text that overflows a box that itself fits.
        const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
          const range = document.createRange(); range.selectNodeContents(node);
          if (range.getBoundingClientRect().right > innerWidth + 0.5) found.push(node.parentElement);
        }
        return [...new Set(found)].slice(0, 3)
          .map((el) => `${name(el.parentElement)} > ${name(el)}`).join(', '); }"""
    )
    return f"{url}: {width} px ({culprit})"


def test_every_page_fits_a_400_px_screen(page, desk, users, outbox_backend, tmp_path):
    done = finished_run_with_the_token(users)
    waiting = waiting_run_with_the_token(users)
    deliver()
    decided = ApprovalRequest.objects.filter(run=done, kind="call").first()
    email = (
        next((e for e in DeskEmail.objects.all() if TOKEN[:40] in e.subject), None)
        or DeskEmail.objects.first()
    )
    assert email is not None
    pages = [
        "/desk/",
        "/desk/?tab=all",
        "/desk/?mine=1",
        f"/desk/?q={TOKEN}",
        f"/desk/approvals/{pending(waiting).pk}/",
        f"/desk/approvals/{decided.pk}/",
        "/runs/",
        f"/runs/?q={TOKEN[:100]}",
        f"/runs/{done.pk}/",
        f"/runs/{waiting.pk}/",
        f"/runs/{done.pk}/steps/1/",
        f"/runs/{done.pk}/rollback",
        f"/runs/{done.pk}/integrity",
        f"/runs/{done.pk}/standing",
        "/runs/new",
        "/desk/inbox/",
        "/desk/outbox/",
        f"/desk/outbox/{email.pk}/",
        "/desk/preferences/",
        "/desk/analytics/",
        "/desk/tokens/",
        "/desk/agents/",
    ]
    page.set_viewport_size(NARROW)
    failures = []
    sign_in(page, "admin")
    failures += [problem for url in pages if (problem := too_wide(page, url))]
    # A reviewer's inbox holds the emails about the token's run.
    page.context.clear_cookies()
    sign_in(page, "senior")
    failures += [problem for url in ("/desk/inbox/", "/desk/") if (problem := too_wide(page, url))]
    page.context.clear_cookies()
    failures += [problem for url in ("/login/",) if (problem := too_wide(page, url))]
    # The icon the browser asks for on its own, signed in or not.
    icon = page.request.get("/favicon.ico")
    assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert not failures, "wider than 400 px:\n" + "\n".join(failures)

    sign_in(page, "admin")
    page.goto("/desk/outbox/")
    screenshot(page, "outbox-narrow", tmp_path)
    # Wide, the token wraps too: the approval page was 88,684 px wide with a long task.
    page.set_viewport_size({"width": 1366, "height": 768})
    for url in (f"/desk/approvals/{pending(waiting).pk}/", f"/runs/{done.pk}/", "/desk/outbox/"):
        page.goto(url)
        assert page.evaluate("document.documentElement.scrollWidth") <= 1366, url
