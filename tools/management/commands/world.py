from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from tools.models import Note, Order, OutboxEmail, Payment, Ticket
from tools.payments import refunded_total


class Command(BaseCommand):
    help = "Show the sandbox world: orders, payments ledger, outbox, tickets, notes."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, as_json, **options):
        data = {
            "orders": [
                {"order_id": o.order_id, "item": o.item, "amount": str(o.amount),
                 "refunded": str(refunded_total(o)), "customer": o.customer.name,
                 "email": o.customer.email, "ticket": o.ticket.ticket_id if o.ticket else None}
                for o in Order.objects.select_related("customer", "ticket").order_by("order_id")
            ],
            "payments": [
                {"id": p.pk, "kind": p.kind, "order_id": p.order.order_id, "amount": str(p.amount),
                 "reason": p.reason, "idempotency_key": p.idempotency_key,
                 "created_at": p.created_at.isoformat()}
                for p in Payment.objects.select_related("order").order_by("pk")
            ],
            "outbox": [
                {"id": e.pk, "to": e.to, "subject": e.subject, "body": e.body,
                 "idempotency_key": e.idempotency_key}
                for e in OutboxEmail.objects.order_by("pk")
            ],
            "tickets": [{"ticket_id": t.ticket_id, "status": t.status}
                        for t in Ticket.objects.order_by("ticket_id")],
            "notes": [{"id": n.pk, "order_id": n.order.order_id, "text": n.text}
                      for n in Note.objects.select_related("order").order_by("pk")],
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
            self.stdout.write(
                f"  #{p['id']} {p['kind']} {p['order_id']} ₹{p['amount']} key {p['idempotency_key'][:12]}…"
            )
        self.stdout.write(f"Outbox ({len(data['outbox'])}):")
        for e in data["outbox"]:
            self.stdout.write(f"  #{e['id']} to {e['to']}: {e['subject']}")
        self.stdout.write("Tickets: " + ", ".join(f"{t['ticket_id']} {t['status']}" for t in data["tickets"]))
        self.stdout.write(f"Notes ({len(data['notes'])})")
