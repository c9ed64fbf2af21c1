from __future__ import annotations

import json

from core.commands import DeskCommand
from tools import counters
from tools.models import Note, Order, OutboxEmail, Payment, ReceivedWebhook, Ticket, WorldUser
from tools.onboarding.actions import sandbox_files, sandbox_root
from tools.payments import account_balance, refunded_total


class Command(DeskCommand):
    help = (
        "Show the sandbox world: orders, payments ledger, outbox, tickets, notes, users, "
        "files, webhook deliveries, counters."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, as_json, **options):
        payments = list(Payment.objects.select_related("order").order_by("pk"))
        accounts = sorted({payment.account for payment in payments if payment.account})
        data = {
            "orders": [
                {
                    "order_id": order.order_id,
                    "item": order.item,
                    "amount": str(order.amount),
                    "refunded": str(refunded_total(order)),
                    "customer": order.customer.name,
                    "email": order.customer.email,
                    "ticket": order.ticket.ticket_id if order.ticket else None,
                }
                for order in Order.objects.select_related("customer", "ticket").order_by("order_id")
            ],
            "payments": [
                {
                    "id": payment.pk,
                    "kind": payment.kind,
                    "order_id": payment.order.order_id if payment.order else None,
                    "account": payment.account,
                    "amount": str(payment.amount),
                    "reason": payment.reason,
                    "reverses": payment.reverses_id,
                    "idempotency_key": payment.idempotency_key,
                    "created_at": payment.created_at.isoformat(),
                }
                for payment in payments
            ],
            "balances": {account: str(account_balance(account)) for account in accounts},
            "outbox": [
                {
                    "id": email.pk,
                    "to": email.to,
                    "subject": email.subject,
                    "body": email.body,
                    "idempotency_key": email.idempotency_key,
                }
                for email in OutboxEmail.objects.order_by("pk")
            ],
            "tickets": [
                {"ticket_id": ticket.ticket_id, "status": ticket.status}
                for ticket in Ticket.objects.order_by("ticket_id")
            ],
            "notes": [
                {"id": note.pk, "order_id": note.order.order_id, "text": note.text}
                for note in Note.objects.select_related("order").order_by("pk")
            ],
            "users": [
                {
                    "id": user.pk,
                    "username": user.username,
                    "email": user.email,
                    "idempotency_key": user.idempotency_key,
                }
                for user in WorldUser.objects.order_by("pk")
            ],
            "sandbox": str(sandbox_root()),
            "files": sandbox_files(),
            "webhooks": [
                {
                    "id": delivery.pk,
                    "url": delivery.url,
                    "payload": delivery.payload,
                    "idempotency_key": delivery.idempotency_key,
                }
                for delivery in ReceivedWebhook.objects.order_by("pk")
            ],
            "counters": counters.snapshot(),
        }
        if as_json:
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
            return
        self.stdout.write("Orders:")
        for order in data["orders"]:
            self.stdout.write(
                f"  {order['order_id']} {order['item']}: ₹{order['amount']} "
                f"(refunded ₹{order['refunded']}) {order['customer']} <{order['email']}> "
                f"ticket {order['ticket']}"
            )
        self.stdout.write(f"Payments ledger ({len(data['payments'])}):")
        for payment in data["payments"]:
            on = payment["order_id"] or payment["account"]
            undoes = f" reverses #{payment['reverses']}" if payment["reverses"] else ""
            self.stdout.write(
                f"  #{payment['id']} {payment['kind']} {on} ₹{payment['amount']}{undoes} "
                f"key {payment['idempotency_key'][:12]}…"
            )
        if data["balances"]:
            balances = ", ".join(f"{account} ₹{balance}" for account, balance in data["balances"].items())
            self.stdout.write(f"Balances: {balances}")
        self.stdout.write(f"Outbox ({len(data['outbox'])}):")
        for email in data["outbox"]:
            self.stdout.write(f"  #{email['id']} to {email['to']}: {email['subject']}")
        tickets = ", ".join(f"{ticket['ticket_id']} {ticket['status']}" for ticket in data["tickets"])
        self.stdout.write(f"Tickets: {tickets}")
        self.stdout.write(f"Notes ({len(data['notes'])})")
        users = ", ".join(f"{user['username']} <{user['email']}>" for user in data["users"])
        self.stdout.write(f"Users: {users or 'none'}")
        self.stdout.write(f"Files in {data['sandbox']} ({len(data['files'])}):")
        for file in data["files"]:
            self.stdout.write(f"  {file['path']} ({file['size']} bytes)")
        self.stdout.write(f"Webhook deliveries ({len(data['webhooks'])}):")
        for delivery in data["webhooks"]:
            self.stdout.write(f"  #{delivery['id']} {delivery['url']}")
        counted = ", ".join(f"{name}={value}" for name, value in data["counters"].items())
        self.stdout.write(f"Counters: {counted or 'none'}")
