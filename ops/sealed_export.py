"""A run export sealed for the road: a header line, then one line of base64.

``countersign-export-sealed v1 <key id>``, a newline, then URL-safe base64 of
nonce (12 bytes) + AES-256-GCM ciphertext + tag, the header line as associated data
(a body moved under another header does not open). The plaintext is the clear JSON
Lines export as it is, so any desk holding the key file can import it and seal it
under its own ring. The key file holds one ring entry, "id:base64key".
"""

from __future__ import annotations

import base64
import os
import stat

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.core.management.base import CommandError

from core.sealing import NONCE_BYTES, KeyRingError, parse_ring

MAGIC = "countersign-export-sealed v1 "


def read_key(path: str, warn) -> tuple[str, bytes]:
    """(id, key) from a key file; warns (never refuses) if group or others may read it."""
    try:
        mode = os.stat(path).st_mode
        with open(path, encoding="utf-8") as file:
            text = file.read().strip()
    except OSError as exc:
        raise CommandError(f"Cannot read key file {path}: {exc.strerror}.") from None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        warn(f"Warning: key file {path} is readable by group or others (chmod 600 it).")
    try:
        keyring = parse_ring(text)
    except KeyRingError:
        raise CommandError(f"Key file {path} does not hold one id:key entry.") from None
    if len(keyring.keys) != 1:
        raise CommandError(f"Key file {path} does not hold one id:key entry.")
    return keyring.keys[0]


def seal_export(text: str, kid: str, key: bytes) -> str:
    header = MAGIC + kid
    nonce = os.urandom(NONCE_BYTES)
    body = AESGCM(key).encrypt(nonce, text.encode(), header.encode())
    return f"{header}\n{base64.urlsafe_b64encode(nonce + body).decode()}\n"


def sealed_key_id(first_line: str) -> str | None:
    """The key id a sealed export needs, from its first line; None for a clear file."""
    first_line = first_line.rstrip("\n")
    return first_line[len(MAGIC) :] if first_line.startswith(MAGIC) else None


def open_export(path: str, header: str, body: str, kid: str, key: bytes) -> str:
    needed = sealed_key_id(header)
    if needed != kid:
        raise CommandError(f"{path} is sealed with key {needed}; the key file holds key {kid}.")
    try:
        raw = base64.urlsafe_b64decode(body.strip())
        plain = AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], header.rstrip("\n").encode())
        return plain.decode()
    except (InvalidTag, ValueError):
        raise CommandError(
            f"{path} does not open under key {kid}: the wrong key, or the file was altered. "
            "Nothing was imported."
        ) from None
