"""Analysts' API tokens for the query service: made, stored hashed, and checked.

A token is ``dpb_<id>_<secret>``: a 16-hex-digit id (public: it names the token in logs and in a
revocation) and a secret of 256 random bits (``secrets.token_urlsafe(32)``). The policy stores,
under ``[analysts.NAME] tokens``, only ``ID:SHA256(secret):EXPIRES``, so only the owner key can
add one (a policy change), and a copy of the ledger or the policy grants nothing.

Why plain SHA-256 and not a password hash (bcrypt, scrypt, Argon2): those slow down guessing a
low-entropy secret from its hash. A secret of 256 uniformly random bits cannot be guessed, slowly
or quickly, and SHA-256 is preimage resistant, so the stored hash reveals nothing usable; a slow
hash would only slow down every request.

Invariant: ``analyst_of`` names an analyst only for a presented token whose id is listed, whose
secret hashes to the listed hash (compared in constant time: ``hmac.compare_digest``) and whose
expiry is after ``now`` (the server's clock, never the request's); the analyst is the one the
policy lists the token under, never anything the request says.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Any, NamedTuple

__all__ = ["Entry", "analyst_of", "entries", "new_token", "token_id", "with_token",
           "without_token"]

_TOKEN = re.compile(r"^dpb_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")


class Entry(NamedTuple):
    """One stored token: its ``id``, the SHA-256 of its secret (hex), its expiry (Unix s)."""

    id: str
    digest: str
    expires: int

    def text(self) -> str:
        """The form a policy lists it in."""
        return f"{self.id}:{self.digest}:{self.expires}"


def new_token(expires: int) -> tuple[str, Entry]:
    """A new token (shown once, to the owner) and its stored entry, valid until ``expires``."""
    ident, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    return f"dpb_{ident}_{secret}", Entry(ident, _digest(secret), int(expires))


def token_id(presented: str) -> str | None:
    """The id of a well-formed token (public), or None."""
    found = _TOKEN.match(presented)
    return None if found is None else found.group(1)


def entries(policy: Any) -> dict[str, tuple[str, Entry]]:
    """Token id -> (analyst, entry), from ``policy.analysts`` (a ``Policy``)."""
    out: dict[str, tuple[str, Entry]] = {}
    for analyst, own in policy.analysts.items():
        for text in own.tokens:
            ident, digest, expires = text.split(":")
            out[ident] = (analyst, Entry(ident, digest, int(expires)))
    return out


def analyst_of(presented: str, listed: dict[str, tuple[str, Entry]], now: float) -> str | None:
    """The analyst ``presented`` authenticates at time ``now``, or None (malformed, unknown,
    wrong secret, or expired: the caller answers all of them alike, 401)."""
    found = _TOKEN.match(presented)
    if found is None:
        return None
    ident, secret = found.groups()
    item = listed.get(ident)
    if item is None:
        return None
    analyst, entry = item
    if not hmac.compare_digest(_digest(secret), entry.digest) or not now < entry.expires:
        return None
    return analyst


def with_token(policy: Any, analyst: str, entry: Entry) -> Any:
    """``policy`` (a ``Policy``) with ``entry`` listed under ``[analysts.ANALYST]``."""
    from dpbudget.policies.policy import Policy

    doc = policy.model_dump(mode="json", exclude_defaults=True)
    own = doc.setdefault("analysts", {}).setdefault(analyst, {})
    own["tokens"] = [*own.get("tokens", []), entry.text()]
    return Policy.model_validate(doc)


def without_token(policy: Any, ident: str) -> Any:
    """``policy`` without the token whose id is ``ident`` (revoked).

    Raises:
        InvalidArgumentError: no token of the policy has that id.
    """
    from dpbudget.accountant.values.errors import InvalidArgumentError
    from dpbudget.policies.policy import Policy

    if ident not in entries(policy):
        raise InvalidArgumentError("token_id", ident, "the id of a token the policy lists")
    doc = policy.model_dump(mode="json", exclude_defaults=True)
    for own in doc.get("analysts", {}).values():
        own["tokens"] = [t for t in own.get("tokens", []) if t.split(":")[0] != ident]
    return Policy.model_validate(doc)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()
