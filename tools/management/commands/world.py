from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from tools import counters
from tools.models import Note, Order, OutboxEmail, Payment, Ticket, WebhookDelivery, WorldUser
from tools.onboarding import sandbox_files, sandbox_root
from tools.payments import account_balance, refunded_total


class Command(BaseCommand):
    help = ("Show the sandbox world: orders, payments ledger, outbox, tickets, notes, users, "
            "files, webhook deliveries, counters.")

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, as_json, **options):
        payments = list(Payment.objects.select_related("order").order_by("pk"))
        accounts = sorted({p.account for p in payments if p.account})
        data = {
            "orders": [
                {"order_id": o.order_id, "item": o.item, "amount": str(o.amount),
                 "refunded": str(refunded_total(o)), "customer": o.customer.name,
                 "email": o.customer.email, "ticket": o.ticket.ticket_id if o.ticket else None}
                for o in Order.objects.select_related("customer", "ticket").order_by("order_id")
            ],
            "payments": [
                {"id": p.pk, "kind": p.kind, "order_id": p.order.order_id if p.order else None,
                 "account": p.account, "amount": str(p.amount), "reason": p.reason,
                 "reverses": p.reverses_id, "idempotency_key": p.idempotency_key,
                 "created_at": p.created_at.isoformat()}
                for p in payments
            ],
            "balances": {account: str(account_balance(account)) for account in accounts},
            "outbox": [
                {"id": e.pk, "to": e.to, "subject": e.subject, "body": e.body,
                 "idempotency_key": e.idempotency_key}
                for e in OutboxEmail.objects.order_by("pk")
            ],
            "tickets": [{"ticket_id": t.ticket_id, "status": t.status}
                        for t in Ticket.objects.order_by("ticket_id")],
            "notes": [{"id": n.pk, "order_id": n.order.order_id, "text": n.text}
                      for n in Note.objects.select_related("order").order_by("pk")],
            "users": [{"id": u.pk, "username": u.username, "email": u.email,
                       "idempotency_key": u.idempotency_key}
                      for u in WorldUser.objects.order_by("pk")],
            "sandbox": str(sandbox_root()),
            "files": sandbox_files(),
            "webhooks": [{"id": w.pk, "url": w.url, "payload": w.payload,
                          "idempotency_key": w.idempotency_key}
                         for w in WebhookDelivery.objects.order_by("pk")],
            "counters": counters.snapshot(),
        }
        if as_json:
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
            return
        self.stdout.write("Orders:")
        for o in data["orders"]:
            self.stdout.write(f"  {o['order_id']} {o['item']}: ₹{o['amount']} (refunded ₹{o['refunded']}) "
                              f"{o['customer']} <{o['email']}> ticket {o['ticket']}")
        self.stdout.write(f"Payments ledger ({len(data['payments'])}):")
        for p in data["payments"]:
            on = p["order_id"] or p["account"]
            undoes = f" reverses #{p['reverses']}" if p["reverses"] else ""
            self.stdout.write(
                f"  #{p['id']} {p['kind']} {on} ₹{p['amount']}{undoes} key {p['idempotency_key'][:12]}…"
            )
        if data["balances"]:
            self.stdout.write("Balances: " + ", ".join(f"{a} ₹{b}" for a, b in data["balances"].items()))
        self.stdout.write(f"Outbox ({len(data['outbox'])}):")
        for e in data["outbox"]:
            self.stdout.write(f"  #{e['id']} to {e['to']}: {e['subject']}")
        self.stdout.write("Tickets: " + ", ".join(f"{t['ticket_id']} {t['status']}" for t in data["tickets"]))
        self.stdout.write(f"Notes ({len(data['notes'])})")
        self.stdout.write("Users: " + (", ".join(f"{u['username']} <{u['email']}>" for u in data["users"])
                                       or "none"))
        self.stdout.write(f"Files in {data['sandbox']} ({len(data['files'])}):")
        for f in data["files"]:
            self.stdout.write(f"  {f['path']} ({f['size']} bytes)")
        self.stdout.write(f"Webhook deliveries ({len(data['webhooks'])}):")
        for w in data["webhooks"]:
            self.stdout.write(f"  #{w['id']} {w['url']}")
        self.stdout.write("Counters: " + (", ".join(f"{k}={v}" for k, v in data["counters"].items())
                                          or "none"))
