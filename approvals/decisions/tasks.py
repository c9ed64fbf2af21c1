"""Celery tasks of decisions: thin; each calls a service."""

from __future__ import annotations

from dataclasses import asdict

from celery import shared_task

from approvals.decisions.sla import approvals_sweep_sla


@shared_task(name="approvals.tasks.sweep_sla", ignore_result=True)
def sweep_sla() -> dict:
    """Beat, every DESK_SLA_SWEEP_SECONDS: reminders, escalations, expiries."""
    return asdict(approvals_sweep_sla())
