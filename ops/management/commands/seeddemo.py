from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import CommandError
from django.db import transaction

from approvals.models import GateRule
from core.commands import DeskCommand
from runs.engine import run_advance_until_settled
from runs.models import Run
from runs.services import run_create

GROUPS = ("reviewers", "senior-reviewers", "admins")
# username, groups, superuser
USERS = (
    ("admin", ("admins",), True),
    ("reviewer", ("reviewers",), False),
    ("senior", ("reviewers", "senior-reviewers"), False),
    ("requester", (), False),
)
# name, tool, field, operator, value, effect, priority, group
RULES = (
    # The catch-alls are named for what they are, not for a threshold of another rule
    # (raising "Refunds over ₹500" would leave "Refunds up to ₹500" saying the wrong thing).
    ("Other refunds", "refund_item", "", "gt", "", "allow", 0, None),
    ("Refunds over ₹500", "refund_item", "amount", "gt", "500", "needs_approval", 10, "reviewers"),
    ("Refunds over ₹5,000", "refund_item", "amount", "gt", "5000", "needs_approval", 20, "senior-reviewers"),
    ("Emails to customers", "send_email", "", "gt", "", "needs_approval", 10, "reviewers"),
    ("Closing tickets", "close_ticket", "", "gt", "", "allow", 0, None),
    ("Internal notes", "add_note", "", "gt", "", "allow", 0, None),
    # onboarding: reversible set-up runs; money over ₹1,000 waits; irreversible
    # tools always wait, whatever a rule says.
    ("Creating users", "create_user", "", "gt", "", "allow", 0, None),
    ("Sandbox files", "create_file", "", "gt", "", "allow", 0, None),
    ("Renaming files", "rename_file", "", "gt", "", "allow", 0, None),
    ("Other charges", "charge_card", "", "gt", "", "allow", 0, None),
    ("Charges over ₹1,000", "charge_card", "amount", "gt", "1000", "needs_approval", 10, "reviewers"),
)
# Aggregate rules: a running total, so that splitting a refund does not beat the
# senior threshold: 3 x ₹2,000 on one order reaches senior reviewers like one ₹6,000
# refund. It guards the senior threshold, not the reviewers' one: at ₹500 in total it
# caught every refund over ₹500 again, so raising "Refunds over ₹500" seemed to do
# nothing. Between the two per-call rules (priority 15): tried before "Refunds over
# ₹500", or a split's third refund would reach reviewers, not seniors.
AGGREGATE_RULES = (
    {
        "name": "Refunds per order over ₹5,000 in total",
        "tool": "refund_item",
        "aggregate": "sum",
        "field": "amount",
        "scope": "fact",
        "scope_fact": "order_id",
        "operator": "gt",
        "value": "5000",
        "effect": "needs_approval",
        "priority": 15,
        "group": "senior-reviewers",
    },
)
# Rules an earlier seeddemo made that shadowed the ones above: disabled (a recorded
# change) when still as seeded (version 1, nobody edited them); edited ones are left alone.
RETIRED_RULES = {
    "Refunds per order over ₹500 in total need approval": "Refunds per order over ₹5,000 in total",
    "Refunds up to ₹500": "Other refunds",
    "Charges up to ₹1,000": "Other charges",
}
RULE_FIELDS = ("name", "tool", "field", "operator", "value", "effect", "priority", "group")


class Command(DeskCommand):
    help = "Demo users, gate rules and world data. Idempotent."

    def add_arguments(self, parser):
        parser.add_argument(
            "--demo-run",
            action="store_true",
            help="also start the refund-desk demo run (if there is no run yet) up to its first gate",
        )

    def handle(self, *args, demo_run, **options):
        if not settings.DESK_BUILT_IN_AGENTS:
            # Importing the demo's agent would register it in a desk that runs only its own.
            raise CommandError(
                "The demo is the built-in agents' (refund-desk, onboarding), and DESK_BUILT_IN_AGENTS is "
                "off here: seed a demo on a desk that loads them."
            )
        from tools.refund_desk.agent import DEMO_TASK, seed_world

        seed_world()
        with transaction.atomic():
            password, created = self._users()
            self._rules()
        self.stdout.write(self._password_line(password, created=created))
        self.stdout.write(f"World seeded; {GateRule.objects.count()} gate rules.")
        if demo_run and not Run.objects.exists():
            requester = get_user_model().objects.get(username="requester")
            run = run_create(agent_name="refund-desk", task=DEMO_TASK, requester=requester, enqueue=False)
            run_advance_until_settled(run.pk)
            run.refresh_from_db()
            self.stdout.write(f"Demo run {run.pk}: {run.status} at step {run.step}.")

    def _password_line(self, password: str, *, created: bool) -> str:
        """Where the demo password is, on every run (make run prints it each time)."""
        names = ", ".join(u[0] for u in USERS)
        if settings.DESK_DEMO_PASSWORD:
            return f"Demo users {names} ready; password: the value of DESK_DEMO_PASSWORD."
        path = settings.VAR_DIR / "demo-password.txt"
        if created:
            path.write_text(password + "\n")
            path.chmod(0o600)
            return f"Demo users {names} created; password: {password} (also in {path})"
        if path.is_file():
            return f"Demo users {names} ready; password: {path.read_text().strip()} (from {path})"
        return (
            f"Demo users {names} ready, but {path} is gone: start the command with "
            "DESK_DEMO_PASSWORD=... to give them a new password, or `make reset` for a fresh demo."
        )

    def _users(self) -> tuple[str, bool]:
        User = get_user_model()
        decide = Permission.objects.get(codename="decide_approvalrequest")
        # Undo (roll back, rewind, fork) is for admins only; superusers have every permission.
        rollback = Permission.objects.get(codename="rollback_run", content_type__app_label="runs")
        groups = {}
        for name in GROUPS:
            groups[name], _ = Group.objects.get_or_create(name=name)
        view_all = Permission.objects.get(codename="view_all_runs", content_type__app_label="runs")
        for name in ("reviewers", "senior-reviewers", "admins"):
            groups[name].permissions.add(decide, view_all)
        groups["admins"].permissions.add(rollback)
        # A user made later (one was deleted) gets the password the others have.
        kept = settings.VAR_DIR / "demo-password.txt"
        password = (
            settings.DESK_DEMO_PASSWORD
            or (kept.read_text().strip() if kept.is_file() else "")
            or secrets.token_urlsafe(12)
        )
        created_any = False
        for username, group_names, superuser in USERS:
            user, created = User.objects.get_or_create(
                username=username,
                defaults={
                    "email": f"{username}@countersign.local",
                    "first_name": username.title(),
                    "is_staff": superuser,
                    "is_superuser": superuser,
                },
            )
            if created or settings.DESK_DEMO_PASSWORD:
                user.set_password(password)
                user.save()
            created_any |= created
            user.groups.add(*(groups[g] for g in group_names))
        return password, created_any

    def _rules(self) -> None:
        for rule in [*(dict(zip(RULE_FIELDS, rule, strict=True)) for rule in RULES), *AGGREGATE_RULES]:
            fields = {**rule}
            if GateRule.objects.filter(name=fields["name"]).exists():
                continue
            group = fields.pop("group")
            GateRule.objects.create(**fields, required_group=Group.objects.get(name=group) if group else None)
        for rule in GateRule.objects.filter(name__in=RETIRED_RULES, version=1, enabled=True):
            rule.enabled = False
            rule.save()  # recorded: a new version, disabled
            self.stdout.write(
                f"Disabled the earlier demo rule {rule.name!r}: {RETIRED_RULES[rule.name]!r} replaces it."
            )
