"""The two hashes the record is made of: the canonical JSON of a value (one text for
equal values: 2900, 2900.0 and Decimal("2900.00") are one amount) and the keyed hash
(HMAC-SHA-256 under ``DESK_INTEGRITY_KEY``). Idempotency keys, checkpoints, the audit
chain and its facts digests all hash through these."""

from __future__ import annotations

import hashlib
import hmac
import json
from decimal import Decimal
from typing import Any

from django.conf import settings


def _canonical(value: Any) -> Any:
    # 2900, 2900.0 and Decimal("2900.00") are the same amount: one key.
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float, Decimal)):
        number = Decimal(str(value)).normalize()
        return int(number) if number == number.to_integral_value() else str(number)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return str(value)


def canonical_json(value: Any) -> str:
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def keyed_hash(text: str) -> str:
    """HMAC-SHA-256 under ``DESK_INTEGRITY_KEY``: a plain hash could be recomputed by
    anyone who can change the rows; this one needs a key the database does not hold."""
    key = settings.DESK_INTEGRITY_KEY.encode()
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()
