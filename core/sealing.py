"""Encryption at rest: the key ring, sealed values, and the keyed search index.

``settings.DESK_ENCRYPTION_KEYS`` is a ring, "id:key,id:key" (a key: 32 random bytes,
URL-safe base64; ``python -m core.sealing newkey`` prints one). The first key
seals every value written; every key in the ring opens. "off" (benchmarks only)
writes clear text. Values are sealed with AES-256-GCM (``cryptography``): a random
96-bit nonce per value, the column's "table.column" and the row's own id (its
``seal_id``, random, given when the row is made) as associated data, so a value
copied into another column or another row does not open there; the key's id and the
row's id in clear in front::

    enc2:<key id>:<row id>:<urlsafe base64 of nonce + ciphertext + tag>

Values written before rows had an id (``enc1:<key id>:<base64>``, "table.column"
alone as associated data) still open; ``rotatekeys`` seals them again as ``enc2``.

A value that cannot be opened is never an exception where it is read (a page, the
CLI, a worker): it comes back as a ``Locked`` text that says why ("encrypted with
key K, not loaded", "encrypted for another row (moved)", or that it fails
authentication) and keeps the stored text, so
saving the row again loses nothing; ``verify`` names every such value by record.

The search index (``search_text``): the beginnings of the normalised words of a text
(so words are found as they are typed), each as a keyed HMAC truncated to 48 bits,
never the words themselves; a query's words are looked up under every key of the
ring, so a search still finds rows indexed before a rotation. The ground floor:
imports nothing of ours.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import sys
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PREFIX = "enc1:"  # written before rows had an id: "table.column" alone binds it
ROW_PREFIX = "enc2:"  # bound to its row too: what seal() writes
SEALED_PREFIXES = (PREFIX, ROW_PREFIX)
ROW_ID = re.compile(r"[0-9a-z]{1,24}")
# A clear value (the ring is off) that happens to begin like a sealed one, or like
# this escape, is stored behind the escape, so it is never mistaken for ciphertext.
CLEAR_ESCAPE = "clr1:"
OFF = "off"
KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,24}")
NONCE_BYTES = 12


class KeyRingError(ValueError):
    """DESK_ENCRYPTION_KEYS cannot be read: says what is wrong, never the key."""


@dataclass(frozen=True)
class KeyRing:
    """The ring as loaded: (id, AESGCM) in order, the first one sealing."""

    keys: tuple[tuple[str, bytes], ...]

    @property
    def on(self) -> bool:
        return bool(self.keys)

    @property
    def current(self) -> str:
        return self.keys[0][0]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(kid for kid, _ in self.keys)

    def aead(self, kid: str) -> AESGCM | None:
        return _aeads(self).get(kid)

    def index_keys(self) -> tuple[bytes, ...]:
        """The search index's keys, one per ring key (the first indexes new rows)."""
        label = b"countersign search index v1"
        return tuple(hmac.new(key, label, hashlib.sha256).digest() for _, key in self.keys)


@lru_cache(maxsize=8)
def _aeads(ring: KeyRing) -> dict[str, AESGCM]:
    return {kid: AESGCM(key) for kid, key in ring.keys}


def parse_ring(text: str) -> KeyRing:
    """The ring in ``text`` ("id:key,id:key", or "off"); KeyRingError if malformed."""
    text = (text or "").strip()
    if text.lower() == OFF:
        return KeyRing(())
    keys: list[tuple[str, bytes]] = []
    for number, part in enumerate((p.strip() for p in text.split(",")), start=1):
        if not part:
            continue
        kid, colon, encoded = part.partition(":")
        if not colon or not KEY_ID.fullmatch(kid):
            raise KeyRingError(
                f"DESK_ENCRYPTION_KEYS, entry {number}: not id:key (an id is 1-24 letters, digits, - or _)."
            )
        try:
            key = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        except ValueError:
            key = b""
        if len(key) != 32:
            raise KeyRingError(
                f"DESK_ENCRYPTION_KEYS, key {kid!r}: not 32 bytes of URL-safe base64 "
                "(python -m core.sealing newkey prints one)."
            )
        if kid in dict(keys):
            raise KeyRingError(f"DESK_ENCRYPTION_KEYS: key id {kid!r} is there twice.")
        keys.append((kid, key))
    if not keys:
        raise KeyRingError("DESK_ENCRYPTION_KEYS is empty: give id:key entries, or off.")
    return KeyRing(tuple(keys))


@lru_cache(maxsize=8)
def _ring_for(text: str) -> KeyRing:
    return parse_ring(text)


def ring() -> KeyRing:
    """The desk's ring, from settings (cached by its text, so a test may override it)."""
    from django.conf import settings

    return _ring_for(getattr(settings, "DESK_ENCRYPTION_KEYS", OFF))


def new_key(kid: str = "") -> str:
    """A fresh ring entry, "id:key"."""
    kid = kid or "k" + os.urandom(3).hex()
    if not KEY_ID.fullmatch(kid):
        raise KeyRingError(f"{kid!r} is not a key id (1-24 letters, digits, - or _).")
    return f"{kid}:{base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip('=')}"


class Locked(str):
    """A stored value that could not be opened. Its text says why; ``stored`` is what
    the database holds, written back as it is if the row is saved again."""

    stored: str
    key_id: str
    # "missing" (the key is not in the ring), "moved" (sealed for another row of the
    # column) or "altered" (fails authentication)
    reason: str

    def __new__(cls, stored: str, key_id: str, reason: str):
        if reason == "missing":
            text = f"encrypted with key {key_id}, not loaded"
        elif reason == "moved":
            text = "encrypted for another row (moved)"
        else:
            text = f"encrypted with key {key_id}, does not authenticate (altered)"
        value = super().__new__(cls, text)
        value.stored, value.key_id, value.reason = stored, key_id, reason
        return value


def find_locked(value) -> Locked | None:
    """The first ``Locked`` value in ``value`` (a text, or JSON: lists and dicts
    walked), or None when all of it could be read."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Locked):
            return item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def key_id_of(stored: str | None) -> str | None:
    """The id of the key a stored value is sealed with; None for a clear one."""
    if not isinstance(stored, str) or not stored.startswith(SEALED_PREFIXES):
        return None
    kid, colon, _ = stored[len(PREFIX) :].partition(":")
    return kid if colon else None


def new_row_id() -> str:
    """A row's id for sealing (``core.sealed.SealedRow.seal_id``): 64 random bits, hex."""
    return os.urandom(8).hex()


def _aad(context: str, row: str | None) -> bytes:
    return (context if row is None else f"{context}#{row}").encode()


def seal(text: str, context: str, keyring: KeyRing | None = None, *, row: str | None = None) -> str:
    """``text`` as stored: sealed under the ring's first key, with ``context``
    ("table.column") and ``row`` (the row's ``seal_id``) as associated data; "" stays ""
    (nothing to hide, and a blank field stays filterable). With the ring off, clear
    (escaped if it looks sealed). Without a row: the old ``enc1`` format (tables whose
    rows have no id yet, in the migrations that come before it)."""
    if isinstance(text, Locked):
        return text.stored
    if text == "":
        return text
    keyring = keyring or ring()
    if not keyring.on:
        if text.startswith((*SEALED_PREFIXES, CLEAR_ESCAPE)):
            return CLEAR_ESCAPE + text
        return text
    if row is not None and not ROW_ID.fullmatch(row):
        raise ValueError(f"{row!r} is not a row id")
    kid = keyring.current
    nonce = os.urandom(NONCE_BYTES)
    sealed = keyring.aead(kid).encrypt(nonce, text.encode(), _aad(context, row))
    body = base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")
    return f"{PREFIX}{kid}:{body}" if row is None else f"{ROW_PREFIX}{kid}:{row}:{body}"


def unseal(stored: str, context: str, keyring: KeyRing | None = None, *, row: str | None = None) -> str:
    """The text of a stored value, or a ``Locked`` one saying why it cannot be read.
    A clear value (written before encryption, or with the ring off) is itself.
    ``row``: the seal id of the row the value was read from; an ``enc2`` value sealed
    for another row is "moved". None: the row is not known, and the value opens
    against the row it names (for a reader that compares the two itself)."""
    if not stored.startswith(SEALED_PREFIXES):
        return stored.removeprefix(CLEAR_ESCAPE)
    keyring = keyring or ring()
    bound = stored.startswith(ROW_PREFIX)
    kid, _, rest = stored[len(PREFIX) :].partition(":")
    sealed_for = None
    if bound:
        sealed_for, _, rest = rest.partition(":")
    aead = keyring.aead(kid)
    if aead is None:
        return Locked(stored, kid, "missing")
    try:
        raw = base64.urlsafe_b64decode(rest + "=" * (-len(rest) % 4))
        text = aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(context, sealed_for)).decode()
    except (InvalidTag, ValueError):
        return Locked(stored, kid, "altered")
    # Authentic, and sealed for the row it names: another row's value copied here.
    return Locked(stored, kid, "moved") if bound and row is not None and sealed_for != row else text


# --- the keyed search index ---------------------------------------------------------
WORD = re.compile(r"\w+")
MAX_WORDS = 400  # a row's index holds its first distinct words, enough for a task
# Each word is indexed by its beginnings too, so a search finds words as they are typed
# ("lov" finds Lovelace, "A-10" finds A-1001): its first 1, 2, ... characters, up to
# PREFIX_MAX (a longer query word is looked up by its first PREFIX_MAX characters).
PREFIX_MAX = 12


def words(text: str) -> list[str]:
    """The normalised words of ``text``: NFKC, case-folded, split on what is not a
    letter or digit ("ada@example.com" is ada, example, com)."""
    return WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def beginnings(word: str) -> list[str]:
    """What the index holds of ``word``: its beginnings of 1 to PREFIX_MAX characters."""
    return [word[:n] for n in range(1, min(len(word), PREFIX_MAX) + 1)]


def _token(key: bytes, word: str) -> str:
    """48 bits: a search reads every row's index, so shorter is faster (16 hex digits
    cost the queue's search 20% more at 10,000 pending); a false match stays about one
    in 10^11 per row even for an index of 2,000 beginnings."""
    return hmac.new(key, word.encode(), hashlib.sha256).hexdigest()[:12]


def search_text(*texts: str, keyring: KeyRing | None = None) -> str:
    """The index of ``texts``: " t1 t2 ... ", each beginning of each word once, keyed
    by the ring's first key (with the ring off, the beginnings themselves: the columns
    are clear too)."""
    keyring = keyring or ring()
    key = keyring.index_keys()[0] if keyring.on else None
    distinct: dict[str, None] = {}
    for text in texts:
        for word in words(text or ""):
            if len(distinct) >= MAX_WORDS:
                break
            distinct.setdefault(word)
    seen = dict.fromkeys(beginning for word in distinct for beginning in beginnings(word))
    if not seen:
        return ""
    tokens = seen if key is None else (_token(key, beginning) for beginning in seen)
    return " " + " ".join(tokens) + " "


def query_tokens(query: str, keyring: KeyRing | None = None) -> list[tuple[str, ...]]:
    """Per word of ``query``, its index token under each key of the ring (" t "), for
    a LIKE: a row matches when every word begins one of its words (the query word's
    first PREFIX_MAX characters are looked up), under any key of the ring (so rows
    indexed before a rotation are found until ``rotatekeys`` re-indexes)."""
    keyring = keyring or ring()
    keys = keyring.index_keys()
    looked_up = dict.fromkeys(word[:PREFIX_MAX] for word in words(query))
    return [tuple(f" {_token(key, word)} " for key in keys) if keys else (f" {word} ",) for word in looked_up]


# --- facts that SQL reads: numbers as they are, everything else as a keyed digest ---
def _facts_key() -> bytes:
    from django.conf import settings

    return hmac.new(settings.DESK_INTEGRITY_KEY.encode(), b"countersign facts v1", hashlib.sha256).digest()


def fact_value(value):
    """What a clear ``facts`` column holds for one argument: a number as it is (sums
    add it up); any other scalar as "#" and a keyed digest of its JSON (equal values,
    equal digests: a rule's scope compares them), never the value itself; None for
    what no rule reads (lists, objects)."""
    import json

    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if value is not None and not isinstance(value, bool | str):
        return None
    text = json.dumps(value, ensure_ascii=False)
    return "#" + hmac.new(_facts_key(), text.encode(), hashlib.sha256).hexdigest()[:32]


def clear_facts(tool_input) -> dict:
    """The clear facts of a call's arguments (``fact_value`` of each top-level one)."""
    if not isinstance(tool_input, dict):
        return {}
    facts = {}
    for name, value in tool_input.items():
        fact = fact_value(value)
        if fact is not None:
            facts[str(name)] = fact
    return facts


def main(argv: list[str]) -> int:
    if argv[1:2] == ["newkey"]:
        print(new_key(argv[2] if len(argv) > 2 else ""))
        return 0
    print("usage: python -m core.sealing newkey [ID]  (prints a DESK_ENCRYPTION_KEYS entry)")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
