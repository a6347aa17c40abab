"""Generate NATS user nkeys for auth tests."""

from __future__ import annotations

import os

import nkeys


def new_user_nkey() -> tuple[str, str]:
    """Return ``(seed, public_key)`` of a fresh user nkey."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    return seed.decode(), public
