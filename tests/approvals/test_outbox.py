"""The development outbox (desk.mail.DatabaseBackend and /desk/outbox/, staff only),
a person's inbox (/desk/inbox/, only their own) and their email preferences
(/desk/preferences/)."""

from __future__ import annotations

import pytest
from django.core.mail import EmailMultiAlternatives
from django.urls import reverse

from approvals.models import DeskEmail, Notification, NotificationPreference
from approvals.notify.kinds import Kind
from approvals.notify.notifications import digests_record
from desk.mail import DatabaseBackend
from tests.helpers import client_for, deliver, get_html, start, the_approval

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

HOSTILE = '<p>Hi</p><script>parent.document.title="owned"</script><img src=x onerror="alert(1)">'


def stored_email(**overrides) -> DeskEmail:
    fields = {"subject": "Hello", "from_email": "desk@countersign.local", "to": "a@example.com", "body": "Hi"}
    return DeskEmail.objects.create(**(fields | overrides))


# --- the backend ----------------------------------------------------------------------
def test_the_backend_stores_a_real_message_and_logs_one_line(caplog):
    message = EmailMultiAlternatives(
        "Approve refund_item? ₹2,900",
        "Plain text body\nsecond line",
        "Countersign <desk@countersign.local>",
        ["ada@example.com", "bob@example.com"],
        cc=["carol@example.com"],
        headers={"X-Countersign-Event": "approval:1:opened", "Message-ID": "<n-1@countersign.local>"},
    )
    message.attach_alternative("<p>HTML body</p>", "text/html")
    with caplog.at_level("INFO", logger="desk.mail"):
        assert DatabaseBackend().send_messages([message]) == 1
    [email] = DeskEmail.objects.all()
    assert email.subject == "Approve refund_item? ₹2,900"
    assert email.from_email == "Countersign <desk@countersign.local>"
    assert email.to.splitlines() == ["ada@example.com", "bob@example.com", "carol@example.com"]
    assert email.body == "Plain text body\nsecond line" and email.html == "<p>HTML body</p>"
    assert email.headers["X-Countersign-Event"] == "approval:1:opened"
    [line] = [r.getMessage() for r in caplog.records if r.name == "desk.mail"]
    everyone = "ada@example.com, bob@example.com, carol@example.com"
    assert line == f"email to {everyone}: {email.subject} (outbox #{email.pk})"


def test_a_notification_sent_through_the_outbox_backend_is_stored_not_printed(users, outbox_backend, capsys):
    approval = the_approval(start(requester=users["requester"]))
    assert deliver() == ["sent", "sent", "sent"]
    emails = DeskEmail.objects.order_by("id")
    assert [e.to for e in emails] == [
        "admin@countersign.local",
        "reviewer@countersign.local",
        "senior@countersign.local",
    ]
    email = emails[1]
    assert (
        email.subject
        == f"[Countersign] Approve refund_item for run {approval.run_id}? (amount ₹2,900.00 > ₹500.00)"
    )
    assert f"/desk/approvals/{approval.pk}/" in email.body and "<html" in email.html
    assert email.headers["X-Countersign-Event"] == f"approval:{approval.pk}:opened"
    assert "quoted-printable" not in capsys.readouterr().out


def test_development_settings_choose_the_outbox_and_production_keeps_smtp():
    from desk import settings as desk_settings

    assert desk_settings.mailer_from_url("outbox://")["BACKEND"] == "desk.mail.DatabaseBackend"
    smtp = desk_settings.mailer_from_url("smtp://desk:pw@mail.example.com:587")
    assert smtp["BACKEND"] == "django.core.mail.backends.smtp.EmailBackend"
    assert smtp["OPTIONS"]["host"] == "mail.example.com"


# --- /desk/outbox/ ---------------------------------------------------------------------
def test_staff_see_the_outbox_newest_first(users):
    stored_email(subject="Older", to="a@example.com")
    stored_email(subject="Newer", to="b@example.com\nc@example.com")
    html = get_html(client_for(users["admin"]), reverse("outbox"))
    assert html.index("Newer") < html.index("Older")
    assert "b@example.com, c@example.com" in html


@pytest.mark.parametrize("name", ["reviewer", "senior", "requester"])
def test_a_non_staff_user_cannot_open_the_outbox_or_an_email_in_it(users, name):
    email = stored_email(subject="Secret reset link", html="<p>token</p>")
    client = client_for(users[name])
    for url in (
        reverse("outbox"),
        reverse("outbox-email", args=[email.pk]),
        reverse("outbox-email", args=[email.pk]) + "?part=html",
    ):
        response = client.get(url)
        assert response.status_code == 403
        assert b"Secret reset link" not in response.content and b"token" not in response.content


def test_the_outbox_needs_a_login(client):
    email = stored_email()
    for url in (reverse("outbox"), reverse("outbox-email", args=[email.pk])):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_an_emails_html_is_framed_in_a_sandbox_and_never_inlined(users):
    email = stored_email(subject="<b>subject</b>", body="text <script>alert(2)</script>", html=HOSTILE)
    client = client_for(users["admin"])
    page = get_html(client, reverse("outbox-email", args=[email.pk]))
    assert "<script>parent" not in page and "onerror=" not in page.replace("onerror=&quot;", "")
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page and "&lt;b&gt;subject&lt;/b&gt;" in page
    frame = f'sandbox="allow-same-origin" src="/desk/outbox/{email.pk}/?part=html"'
    assert frame in page
    raw = client.get(reverse("outbox-email", args=[email.pk]), {"part": "html"})
    assert raw.status_code == 200 and raw.content.decode() == HOSTILE
    policy = raw["Content-Security-Policy"]
    # Scripts cannot run (a sandbox without allow-scripts; no script-src: default
    # 'none'), even when opened directly, outside the frame; nor forms or navigation.
    # The desk's origin is kept only so that the outbox can size the frame to the email.
    assert policy.startswith("sandbox allow-same-origin;") and "allow-scripts" not in policy
    assert "default-src 'none'" in policy and "script-src" not in policy and "form-action 'none'" in policy
    assert raw["X-Frame-Options"] == "SAMEORIGIN" and raw["X-Content-Type-Options"] == "nosniff"


def test_an_unknown_email_is_404_for_staff(users):
    assert client_for(users["admin"]).get(reverse("outbox-email", args=[999])).status_code == 404


# --- /desk/inbox/ ----------------------------------------------------------------------
def prefer(user, kind: str, delivery: str) -> None:
    NotificationPreference.objects.update_or_create(user=user, kind=kind, defaults={"delivery": delivery})


def test_the_inbox_lists_my_notifications_newest_first_with_what_became_of_each(users):
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "none")
    first = the_approval(start(requester=users["requester"]))
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "digest")
    second = the_approval(start(requester=users["requester"]))
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "each")
    third = the_approval(start(requester=users["requester"]))
    deliver()
    fourth = the_approval(start(requester=users["requester"]))
    Notification.objects.filter(approval=fourth, recipient="reviewer@countersign.local").update(
        status="unknown"
    )
    html = get_html(client_for(users["reviewer"]), reverse("inbox"))
    order = [html.index(f"/desk/approvals/{a.pk}/") for a in (fourth, third, second, first)]
    assert order == sorted(order)
    assert "being sent again: the first send was interrupted" in html
    assert "held for your next hourly digest" in html
    assert "not emailed (your preference)" in html
    assert '<span class="mail-status sent">sent</span>' in html
    digests_record()
    deliver()
    html = get_html(client_for(users["reviewer"]), reverse("inbox"))
    assert "in a digest, sent" in html and "held for your next" not in html
    assert "Your hourly digest" not in html  # the items, not the digest itself


def test_a_reviewer_cannot_read_another_persons_inbox_by_url(users):
    start(requester=users["requester"])  # emails the admin, the reviewer and the senior
    senior_only = Notification.objects.create(
        event="test:senior",
        recipient="senior@countersign.local",
        kind=Kind.APPROVAL_ESCALATED,
        subject="SENIOR ONLY",
    )
    client = client_for(users["reviewer"])
    for query in (
        {},
        {"recipient": "senior@countersign.local"},
        {"user": users["senior"].pk},
        {"email": "senior"},
    ):
        html = get_html(client, reverse("inbox"), query)
        assert senior_only.subject not in html
    assert "SENIOR ONLY" in get_html(client_for(users["senior"]), reverse("inbox"))
    # The requester had no email about this run: their inbox is empty, not someone else's.
    assert "Nothing was sent to you yet" in get_html(client_for(users["requester"]), reverse("inbox"))


def test_the_inbox_pages_and_needs_a_login(users, client):
    for i in range(55):
        Notification.objects.create(
            event=f"test:{i}",
            recipient="reviewer@countersign.local",
            kind=Kind.APPROVAL_OPENED,
            subject=f"Item {i:02}",
        )
    reviewer = client_for(users["reviewer"])
    first = get_html(reviewer, reverse("inbox"))
    assert "Item 54" in first and "Item 04" not in first and "Page 1 of 2" in first
    assert "Item 04" in get_html(reviewer, reverse("inbox"), {"page": 2})
    assert client.get(reverse("inbox")).status_code == 302


# --- /desk/preferences/ ----------------------------------------------------------------
def test_a_user_saves_their_own_preferences(users):
    client = client_for(users["reviewer"])
    html = get_html(client, reverse("notification-preferences"))
    assert 'name="approval_opened" value="each" aria-describedby="kind-approval_opened" checked' in html
    response = client.post(
        reverse("notification-preferences"),
        {"approval_opened": "digest", "approval_reminder": "none", "run_finished": "each"},
    )
    assert response.status_code == 302
    assert dict(
        NotificationPreference.objects.filter(user=users["reviewer"]).values_list("kind", "delivery")
    ) == {
        "approval_opened": "digest",
        "approval_reminder": "none",
    }
    html = get_html(client, reverse("notification-preferences"))
    assert 'name="approval_opened" value="digest" aria-describedby="kind-approval_opened" checked' in html
    assert not NotificationPreference.objects.filter(user=users["senior"]).exists()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"approval_opened": "digest", "digest": "none"},
            "There is no kind of email called &#x27;digest&#x27;",
        ),
        ({"approval_opened": "digest", "user": "3"}, "There is no kind of email called &#x27;user&#x27;"),
        ({"approval_opened": "sometimes"}, "&#x27;sometimes&#x27; is not a delivery"),
    ],
)
def test_a_forged_kind_or_delivery_is_a_clear_400_that_changes_nothing(users, data, message):
    prefer(users["reviewer"], Kind.RUN_FINISHED, "none")
    response = client_for(users["reviewer"]).post(reverse("notification-preferences"), data)
    assert response.status_code == 400
    assert message in response.content.decode() and "Nothing was changed" in response.content.decode()
    assert list(NotificationPreference.objects.values_list("kind", "delivery")) == [("run_finished", "none")]


def test_preferences_need_the_csrf_token(users):
    client = client_for(users["reviewer"], enforce_csrf_checks=True)
    response = client.post(reverse("notification-preferences"), {"approval_opened": "none"})
    assert response.status_code == 403
    assert not NotificationPreference.objects.exists()
