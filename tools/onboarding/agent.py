"""The second demo agent, ``onboarding``: it sets up a new user, and every kind of undo.

Reversible: ``create_user``, ``create_file``, ``rename_file``. Compensable:
``charge_card`` (refunded), ``send_email`` (a correction; the same tool as
refund-desk's). Irreversible: ``delete_file_permanently``, ``call_webhook``.
"""

from __future__ import annotations

from decimal import Decimal

from tools import payments
from tools.keyed import (
    capture_key,
)
from tools.onboarding.actions import (
    WEBHOOK_HOST,
    call_webhook,
    capture_create_file,
    capture_rename_file,
    charge_card,
    compensate_charge,
    compensate_create_file,
    compensate_rename_file,
    compensate_user,
    create_file,
    create_user,
    delete_file_permanently,
    list_files,
    preview_charge,
    preview_create_file,
    preview_delete_file,
    preview_rename_file,
    preview_user,
    preview_webhook,
    reconcile_charge,
    reconcile_create_file,
    reconcile_delete_file,
    reconcile_rename_file,
    reconcile_user,
    reconcile_webhook,
    rename_file,
    verify_charge,
    verify_create_file,
    verify_delete_file,
    verify_rename_file,
    verify_user,
    verify_webhook,
)
from tools.onboarding.demo_model import demo_turn
from tools.onboarding.review import charge_context, charge_warnings
from tools.registry import (
    COMPENSABLE,
    IRREVERSIBLE,
    READ,
    REVERSIBLE,
    AgentSpec,
    Budget,
    ToolSpec,
    register_agent,
    register_tool,
)

# --- registration ----------------------------------------------------------
PATH = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "description": "relative to the sandbox folder, e.g. home/marie/welcome.txt",
}

register_tool(
    ToolSpec(
        name="list_files",
        description="List the files in the sandbox folder with their sizes.",
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        function=list_files,
        kind=READ,
    )
)
register_tool(
    ToolSpec(
        name="create_user",
        description="Create a user account in the directory.",
        input_schema={
            "type": "object",
            "properties": {
                "username": {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{1,49}$"},
                "email": {"type": "string", "format": "email", "pattern": "^[^@\\s]+@[^@\\s]+$"},
            },
            "required": ["username", "email"],
            "additionalProperties": False,
        },
        function=create_user,
        reconcile=reconcile_user,
        honours_key=True,
        undo=REVERSIBLE,
        capture=capture_key,
        compensate=compensate_user,
        verify=verify_user,
        preview=preview_user,
    )
)
register_tool(
    ToolSpec(
        name="create_file",
        description="Create a new file in the sandbox folder. It never overwrites an existing file.",
        input_schema={
            "type": "object",
            "properties": {
                "path": PATH,
                "content": {"type": "string", "maxLength": 100_000},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
        function=create_file,
        reconcile=reconcile_create_file,
        honours_key=True,
        undo=REVERSIBLE,
        capture=capture_create_file,
        compensate=compensate_create_file,
        verify=verify_create_file,
        preview=preview_create_file,
    )
)
register_tool(
    ToolSpec(
        name="rename_file",
        description="Rename (move) a file within the sandbox folder. It never overwrites an existing file.",
        input_schema={
            "type": "object",
            "properties": {"path": PATH, "new_path": PATH},
            "required": ["path", "new_path"],
            "additionalProperties": False,
        },
        function=rename_file,
        reconcile=reconcile_rename_file,
        honours_key=True,
        undo=REVERSIBLE,
        capture=capture_rename_file,
        compensate=compensate_rename_file,
        verify=verify_rename_file,
        preview=preview_rename_file,
    )
)
register_tool(
    ToolSpec(
        name="charge_card",
        description="Charge an account's card on file through the payment provider. "
        "Amount in rupees, up to two decimals.",
        input_schema={
            "type": "object",
            "properties": {
                "account": {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{1,49}$"},
                "amount": {"type": "number", "exclusiveMinimum": 0},
                "description": {"type": "string", "minLength": 1, "maxLength": 500},
            },
            "required": ["account", "amount", "description"],
            "additionalProperties": False,
        },
        money=("amount",),
        function=charge_card,
        reconcile=reconcile_charge,
        honours_key=True,
        facts=payments.payment_facts,
        undo=COMPENSABLE,
        capture=capture_key,
        compensate=compensate_charge,
        verify=verify_charge,
        preview=preview_charge,
        context=charge_context,
        warnings=charge_warnings,
        duplicate_key=("account", "amount"),
    )
)
register_tool(
    ToolSpec(
        name="delete_file_permanently",
        description="Delete a file from the sandbox folder permanently. This cannot be undone.",
        input_schema={
            "type": "object",
            "properties": {"path": PATH},
            "required": ["path"],
            "additionalProperties": False,
        },
        function=delete_file_permanently,
        reconcile=reconcile_delete_file,
        honours_key=True,
        undo=IRREVERSIBLE,
        verify=verify_delete_file,
        preview=preview_delete_file,
    )
)
register_tool(
    ToolSpec(
        name="call_webhook",
        description=f"POST a JSON payload to a webhook (https://{WEBHOOK_HOST}/...). "
        "An external system acts on it: this cannot be undone.",
        input_schema={
            "type": "object",
            "properties": {
                "url": {"type": "string", "minLength": 1, "maxLength": 500},
                "payload": {"type": "object"},
            },
            "required": ["url", "payload"],
            "additionalProperties": False,
        },
        function=call_webhook,
        reconcile=reconcile_webhook,
        honours_key=True,
        undo=IRREVERSIBLE,
        verify=verify_webhook,
        preview=preview_webhook,
    )
)

DEMO_TASK = (
    "Onboard Marie Curie (username marie, marie@example.com): create her account, leave a "
    "welcome note in her home folder, charge the first month (₹499.00) and email her a welcome."
)

WELCOME = (
    "Welcome aboard, Marie!\n\nYour account is ready. The lab opens at 9; your badge is at the front desk.\n"
)

DEMO_SCRIPT = {
    "turns": [
        {
            "text": "Creating the account.",
            "tool_calls": [
                {"name": "create_user", "input": {"username": "marie", "email": "marie@example.com"}}
            ],
        },
        {
            "text": "Drafting the welcome note.",
            "tool_calls": [
                {"name": "create_file", "input": {"path": "home/marie/welcome.draft.txt", "content": WELCOME}}
            ],
        },
        {
            "text": "Publishing the note.",
            "tool_calls": [
                {
                    "name": "rename_file",
                    "input": {"path": "home/marie/welcome.draft.txt", "new_path": "home/marie/welcome.txt"},
                }
            ],
        },
        {
            "text": "Charging the first month.",
            "tool_calls": [
                {
                    "name": "charge_card",
                    "input": {"account": "marie", "amount": 499.00, "description": "First month"},
                }
            ],
        },
        {
            "text": "Sending the welcome email.",
            "tool_calls": [
                {
                    "name": "send_email",
                    "input": {
                        "to": "marie@example.com",
                        "subject": "Welcome aboard",
                        "body": "Hello Marie, your account marie is ready and your welcome note is in "
                        "home/marie/welcome.txt. We charged ₹499.00 for your first month.",
                    },
                }
            ],
        },
        {
            "text": "Onboarded marie: account created, welcome note at home/marie/welcome.txt, first month "
            "(₹499.00) charged, welcome email sent to marie@example.com."
        },
    ]
}

# send_email is refund-desk's tool, shared (one registry entry): tools.apps registers
# refund-desk's agent module first (tools.loading.BUILT_IN_AGENTS).
register_agent(
    AgentSpec(
        name="onboarding",
        description="Creates a new user's account and files, charges their first month and welcomes them.",
        system=(
            "You onboard new users. Use the tools to create their account, put a welcome note in "
            "their home folder (home/<username>/), charge the first month to their account and email "
            "them a welcome. Amounts are in rupees. Deleting files and calling webhooks cannot be "
            "undone: do so only when the task asks for it. If a reviewer declines an action, do not "
            "retry it: explain and stop."
        ),
        tool_names=(
            "list_files",
            "create_user",
            "create_file",
            "rename_file",
            "send_email",
            "charge_card",
            "delete_file_permanently",
            "call_webhook",
        ),
        demo_script=DEMO_SCRIPT,
        demo_model=demo_turn,
        demo_task=DEMO_TASK,
        # No stages (any order of its steps makes sense) and no requirements: what
        # a finished onboarding must leave depends on the task, and each write's
        # verify already checks its own effect.
        budget_default=Budget(steps=50, tokens=200_000, cost=Decimal("2")),
        budget_ceiling=Budget(steps=200, tokens=2_000_000, cost=Decimal("20")),
    )
)
