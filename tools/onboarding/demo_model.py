"""onboarding's demo model: the offline default that onboards whom its task names.

``demo_turn(task, messages)`` reads the person's name, username and email and the
first month's amount (if the task states one) from the task; creates the account,
drafts and publishes a welcome note in ``home/<username>/``, charges the first month
(only a stated, positive amount), emails the person what really happened (the charge
made, declined, edited or not made) and ends with a true summary. A task without an
email address, or an account that could not be created, ends the run saying so.

Deterministic: the same task and the same tool results give the same turns.
"""

from __future__ import annotations

import re

from core.money import rupees
from tools.demo import (
    EDITED,
    NOT_DONE,
    PENDING,
    PREVIEWED,
    Seen,
    as_json_number,
    calls_seen,
    last_call,
    money,
    quote,
    stated_amount,
    stated_email,
)

USERNAME = re.compile(r"^[a-z][a-z0-9_.-]{1,49}$")  # create_user's username pattern
_USERNAME_IN_TEXT = re.compile(
    r"(?i:\busername|\buser name|\blogin)\s*[:=]?\s*(?P<u>[a-z][a-z0-9_.-]{1,49})\b"
)
_NAME_IN_TEXT = re.compile(r"(?i:\bonboard|\bwelcome)\s+(?P<n>[A-Z][\w'-]{0,30}(?:\s[A-Z][\w'-]{0,30}){0,3})")


def person_in(task: str) -> tuple[str, str, str]:
    """(name, username, email) from the task; "" for what it does not say."""
    email = stated_email(task) or ""
    named = _NAME_IN_TEXT.search(task)
    name = named.group("n") if named else ""
    found = _USERNAME_IN_TEXT.search(task)
    username = found.group("u") if found else ""
    for guess in (email.partition("@")[0].lower(), name.split()[0].lower() if name else ""):
        if not username and USERNAME.match(guess):
            username = guess
    return name, username, email


def welcome_note(first: str) -> str:
    return (
        f"Welcome aboard, {first}!\n\nYour account is ready. The lab opens at 9; your badge is at the "
        "front desk.\n"
    )


def _turn(text: str, name: str, args: dict) -> dict:
    return {"text": text, "tool_calls": [{"name": name, "input": args}]}


def _final(text: str) -> dict:
    return {"text": text, "tool_calls": []}


def demo_turn(task: str, messages: list[dict]) -> dict:
    """The next turn for a run of ``task`` whose transcript so far is ``messages``."""
    seen = calls_seen(messages)
    name, username, email = person_in(task)
    if not email or not username:
        missing = "an email address" if not email else "a username"
        return _final(f"The task does not give {missing} for the new account, so I created nothing.")
    first = quote(name.split()[0], 60) if name else username.capitalize()
    home = f"home/{username}"
    draft, note = f"{home}/welcome.draft.txt", f"{home}/welcome.txt"
    created = last_call(seen, "create_user")
    if created is None:
        return _turn("Creating the account.", "create_user", {"username": username, "email": email})
    if created.outcome.kind in NOT_DONE or created.outcome.kind == PENDING:
        why = created.outcome.why or created.outcome.kind
        return _final(f"I did not onboard {username}: creating the account did not happen ({why}).")
    drafted = last_call(seen, "create_file")
    if drafted is None:
        args = {"path": draft, "content": welcome_note(first)}
        return _turn("Drafting the welcome note.", "create_file", args)
    published = last_call(seen, "rename_file")
    if published is None and drafted.outcome.happened:
        return _turn("Publishing the note.", "rename_file", {"path": draft, "new_path": note})
    amount = stated_amount(task)
    charge = last_call(seen, "charge_card")
    if charge is None and amount is not None and amount > 0:
        args = {"account": username, "amount": as_json_number(amount), "description": "First month"}
        return _turn("Charging the first month.", "charge_card", args)
    has_note = published is not None and published.outcome.happened
    sent = last_call(seen, "send_email")
    if sent is None:
        body = f"Hello {first}, your account {username} is ready"
        body += f" and your welcome note is in {note}." if has_note else "."
        body += " " + _charge_sentence(charge, amount)
        args = {"to": email, "subject": "Welcome aboard", "body": body}
        return _turn("Sending the welcome email.", "send_email", args)
    return _final(_summary(username, email, note if has_note else None, charge, amount, sent))


def _charged(charge: Seen) -> str:
    result = charge.outcome.result
    made = money(result.get("amount")) if isinstance(result, dict) else None
    return rupees(made if made is not None else charge.input.get("amount"))


def _charge_sentence(charge: Seen | None, amount) -> str:
    if charge is None:
        if amount is None:
            return "We have not charged anything yet."
        return f"We have not charged anything: {rupees(amount)} is not an amount we can charge."
    if charge.outcome.kind == PREVIEWED:
        return f"We will charge {_charged(charge)} for your first month."
    if charge.outcome.happened:
        return f"We charged {_charged(charge)} for your first month."
    return "We have not charged your card: that did not go through, and we will be in touch."


def _summary(username: str, email: str, note: str | None, charge: Seen | None, amount, sent: Seen) -> str:
    if sent.outcome.kind == PREVIEWED:
        would = f"charge {_charged(charge)}, " if charge is not None else ""
        return (
            f"Dry run, nothing was done: I would create the account {username}, put a welcome note in "
            f"home/{username}/, {would}and email {email}."
        )
    if charge is None:
        money_part = (
            "no first month charged (the task states no amount)"
            if amount is None
            else (f"no first month charged ({rupees(amount)} is not an amount to charge)")
        )
    elif charge.outcome.happened:
        edited = " as a reviewer edited it" if charge.outcome.kind == EDITED else ""
        money_part = f"first month ({_charged(charge)}) charged{edited}"
    else:
        money_part = f"first month not charged ({charge.outcome.kind}: {charge.outcome.why or 'no result'})"
    note_part = f"welcome note at {note}" if note else "no welcome note published"
    if sent.outcome.happened:
        mail_part = f"welcome email sent to {email}"
    else:
        mail_part = (
            f"no welcome email sent to {email} ({sent.outcome.kind}: {sent.outcome.why or 'no result'})"
        )
    return f"Onboarded {username}: account created, {note_part}, {money_part}, {mail_part}."
