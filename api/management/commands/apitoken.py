from __future__ import annotations

from django.core.management.base import CommandError

from api.models import ApiToken
from api.tokens import apitoken_create, apitoken_revoke
from core.commands import DeskCommand
from runs.management.commands._common import is_id, text_argument, user_by_name

NAME_MAX = ApiToken._meta.get_field("name").max_length


def when(moment) -> str:
    return moment.strftime("%Y-%m-%d %H:%M") if moment else "-"


class Command(DeskCommand):
    help = (
        "API tokens for the JSON API and the MCP gateway: create one for a person (printed "
        "once, on the first line), list them, revoke one."
    )

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True, metavar="{create,list,revoke}")
        create = actions.add_parser("create", help="make a token; it is printed once")
        create.add_argument("--user", required=True, help="whom the token acts as")
        create.add_argument("--name", default="", help="what it is for (a label)")
        listing = actions.add_parser("list", help="every token, newest first (never the token itself)")
        listing.add_argument("--user", help="only this person's tokens")
        revoke = actions.add_parser("revoke", help="stop a token from working, for good")
        revoke.add_argument("token_id", metavar="ID")

    def handle(self, *args, action, **options):
        if action == "create":
            self.create_token(user=options["user"], name=options["name"])
        elif action == "list":
            self.list_tokens(user=options["user"])
        else:
            self.revoke_token(options["token_id"])

    def create_token(self, *, user: str, name: str) -> None:
        person = user_by_name(user)
        name = text_argument(name, "The name").strip()
        if len(name) > NAME_MAX:
            raise CommandError(f"The name is longer than {NAME_MAX} characters.")
        if not person.is_active:
            raise CommandError(
                f"User {person.get_username()!r} is inactive: a token of theirs would not work."
            )
        token, raw = apitoken_create(user=person, name=name)
        # The token alone on the first line, flushed, so that a script can read it.
        self.stdout.write(raw)
        self.stdout.flush()
        label = f' "{token.name}"' if token.name else ""
        self.stdout.write(
            f"API token {token.pk}{label} ({token.prefix}…) acts as {person.get_username()}. "
            "It will not be shown again: copy it now."
        )

    def list_tokens(self, *, user: str | None) -> None:
        tokens = ApiToken.objects.select_related("user", "revoked_by").order_by("-id")
        if user is not None:
            tokens = tokens.filter(user=user_by_name(user))
        rows = [("ID", "PREFIX", "NAME", "USER", "CREATED", "LAST USED", "REVOKED")]
        for token in tokens:
            revoked = when(token.revoked_at)
            if token.revoked_at and token.revoked_by:
                revoked += f" by {token.revoked_by.get_username()}"
            rows.append(
                (
                    str(token.pk),
                    token.prefix + "…",
                    token.name or "-",
                    token.user.get_username(),
                    when(token.created_at),
                    when(token.last_used_at),
                    revoked,
                )
            )
        if len(rows) == 1:
            self.stdout.write("No API tokens.")
            return
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            )

    def revoke_token(self, token_id: str) -> None:
        if not is_id(token_id):
            raise CommandError(f"No API token {token_id}: an id is made of digits 0-9 (see `apitoken list`).")
        token = ApiToken.objects.select_related("user").filter(pk=token_id).first()
        if token is None:
            raise CommandError(f"No API token {token_id} (see `apitoken list`).")
        # The operator at the command line acts for the system: any token, by nobody.
        if apitoken_revoke(token_id=token.pk, by=None):
            self.stdout.write(
                f"Revoked API token {token.pk} ({token.prefix}…) of {token.user.get_username()}."
            )
        else:
            self.stdout.write(f"API token {token.pk} ({token.prefix}…) was already revoked.")
