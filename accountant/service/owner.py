"""Owner requests to the query service: signed with the owner key, checked by the server.

The owner's client signs each request — its method, path, the SHA-256 of its body and a time —
with the ledger owner's Ed25519 key (``dpbudget.accountant.gate.owner_key``) and sends the time
and the signature in two headers. The server verifies the signature under the key the ledger's
first record pins, against ITS OWN clock (the time must be within ``WINDOW`` seconds of it) and
refuses a signature it has seen within the window (``Replays``), so a captured owner request
cannot be sent again, altered, or sent to another path.

A policy change the owner sends (``/owner/policy``) carries besides the policy record's own
signature, made by the owner for the record's place (the seq the ledger will give it, and the
ledger): ``Presigned`` hands that signature to the gate's policy writer, which refuses it unless
it verifies over exactly the record being written. The server never holds the private key.

Invariant: ``Replays.check`` admits a (time, signature) once, and only within ``WINDOW`` of the
server's clock; the replay set is per process (one server process per ledger: the process rule).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import threading
from typing import Any

from dpbudget.accountant.gate import owner_key
from dpbudget.accountant.values.errors import OwnerKeyError

__all__ = ["TIME", "SIG", "WINDOW", "Presigned", "Replays", "request_text", "sign_request"]

TIME, SIG = "x-dpbudget-owner-time", "x-dpbudget-owner-signature"
WINDOW = 30.0  # seconds either side of the server's clock
_DOMAIN = b"dpbudget owner request v1\n"  # (a policy record's signature never verifies here)


def request_text(method: str, path: str, body: bytes, when: str) -> bytes:
    """What the owner signs for one request."""
    return _DOMAIN + "\n".join((method.upper(), path, hashlib.sha256(body).hexdigest(),
                                when)).encode("utf-8")


def sign_request(key: owner_key.OwnerKey, method: str, path: str, body: bytes,
                 now: float) -> dict[str, str]:
    """The two headers of an owner request made at ``now`` (the owner's clock): the time, with a
    random nonce (two requests alike in one second are not one replayed), and the signature."""
    when = f"{int(now)}.{secrets.token_hex(8)}"
    return {TIME: when, SIG: key.sign(request_text(method, path, body, when))}


def _verifies(public: str, signature: str, text: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import ed25519

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(public, validate=True)) \
            .verify(base64.b64decode(signature, validate=True), text)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


class Replays:
    """The owner signatures seen within the window, and the check of a new one."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def check(self, public: str | None, method: str, path: str, body: bytes,
              headers: Any, now: float) -> str | None:
        """Why the owner request is refused, or None. ``now``: the server's clock."""
        when, signature = headers.get(TIME), headers.get(SIG)
        if public is None:
            return "the ledger pins no owner key: it has no owner requests"
        seconds = when.partition(".")[0] if isinstance(when, str) else ""
        if not seconds.isdigit() or not isinstance(signature, str):
            return "an owner request needs the owner's signature and time headers"
        if abs(int(seconds) - now) > WINDOW:
            return f"the owner request's time is more than {WINDOW:g} s from the server's clock"
        if not _verifies(public, signature, request_text(method, path, body, when)):
            return "the owner signature does not verify under the ledger's pinned owner key"
        with self._lock:
            for seen, at in list(self._seen.items()):
                if abs(at - now) > 2 * WINDOW:
                    del self._seen[seen]
            if signature in self._seen:
                return "this owner request was already received (a replay)"
            self._seen[signature] = now
        return None


class Presigned:
    """Stands in for the owner key when the gate writes a policy record the owner signed for its
    place: ``sign`` returns the owner's signature only if it verifies over the text asked for."""

    def __init__(self, public: str, signature: str) -> None:
        self.public, self._signature = public, signature

    def sign(self, text: bytes) -> str:
        if not _verifies(self.public, self._signature, text):
            raise OwnerKeyError("owner_key: the policy record's signature does not verify for "
                                "its place (another seq, ledger or policy): fetch the status "
                                "and sign again; nothing was written")
        return self._signature
