"""exportrun --encrypt-to and importrun --key: a run sealed for the road opens only
with its key file, into a desk with another ring, and nothing clear is in the file."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

from approvals.record.verify import verify_run
from core.sealing import new_key
from core.triggers import install_append_only_triggers
from runs.models import Run
from tests.helpers import DEMO_TASK, finished_demo, run_command

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def key_file(tmp_path, kid):
    path = tmp_path / f"{kid}.key"
    path.write_text(new_key(kid) + "\n")
    path.chmod(0o600)
    return str(path)


def sealed_export(users, tmp_path):
    install_append_only_triggers(connection)
    run = finished_demo(users)
    key = key_file(tmp_path, "backup1")
    path = tmp_path / "run.sealed"
    path.write_text(run_command("exportrun", str(run.pk), "--encrypt-to", key))
    return run, key, path


def test_a_sealed_export_hides_the_run_and_imports_under_another_ring(users, tmp_path):
    run, key, path = sealed_export(users, tmp_path)
    text = path.read_text()
    assert text.startswith("countersign-export-sealed v1 backup1\n")
    policy = "a delivered order may be refunded in full or in part within 30 days"  # a tool's result
    for secret in ("ada@example.com", DEMO_TASK, policy):
        assert secret not in text
    other_ring = new_key("elsewhere")
    with override_settings(DESK_ENCRYPTION_KEYS=other_ring):
        run_command("importrun", str(path), "--key", key, "--as-new")
        imported = Run.objects.exclude(pk=run.pk).latest("pk")
        assert imported.task == DEMO_TASK
        assert verify_run(imported).ok


def test_wrong_key_altered_file_or_no_key_imports_nothing(users, tmp_path):
    _run, key, path = sealed_export(users, tmp_path)
    before = Run.objects.count()
    with pytest.raises(CommandError, match="key backup1"):
        run_command("importrun", str(path), "--as-new")
    with pytest.raises(CommandError, match="does not open"):
        wrong = tmp_path / "wrong.key"
        wrong.write_text("backup1:" + new_key("x").split(":")[1])
        run_command("importrun", str(path), "--key", str(wrong), "--as-new")
    data = bytearray(path.read_bytes())
    data[60] = ord("A") if data[60] != ord("A") else ord("B")
    path.write_bytes(bytes(data))
    with pytest.raises(CommandError, match=str(path)):
        run_command("importrun", str(path), "--key", key, "--as-new")
    assert Run.objects.count() == before
