"""Owner requests to the query service: signed with the owner key, checked by the server.

The owner's client signs each request — its method, the Host it is sent to, its path, the
ledger's identity (the hash of its first record), the SHA-256 of its body and a time — with the
ledger owner's Ed25519 key (``dpbudget.accountant.gate.owner_key``) and sends the time and the
signature in two headers (or, for a ``status_link``, in the query string). The server verifies
the signature under the key the ledger's first record pins, against ITS OWN clock (the time must
be within ``WINDOW`` seconds of it) and refuses a signature it has seen within the window
(``Replays``, keyed on the signature's bytes, which must be canonical base64), so a captured
owner request cannot be sent again, altered, or sent to another path, server or ledger.

A policy change the owner sends (``/owner/policy``) carries besides the policy record's own
signature, made by the owner for the record's place (the seq the ledger will give it, and the
ledger): ``Presigned`` hands that signature to the gate's policy writer, which refuses it unless
it verifies over exactly the record being written. The server never holds the private key.

Invariant: ``Replays.check`` admits a (time, signature) once, and only within ``WINDOW`` of the
server's clock; the replay set is per process (one server process per ledger: the process rule)
and in memory: a restart empties it, so a request captured in the 30 s before a restart can be
sent once more within its window.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import threading
from typing import Any

from dpbudget.accountant.gate import owner_key
from dpbudget.accountant.values.errors import OwnerKeyError

__all__ = ["LEDGER", "TIME", "SIG", "WINDOW", "Presigned", "Replays", "request_text",
           "sign_request", "status_query"]

TIME, SIG = "x-dpbudget-owner-time", "x-dpbudget-owner-signature"
LEDGER = "x-dpbudget-ledger"  # (the server's reply header naming the ledger's identity)
WINDOW = 30.0  # seconds either side of the server's clock
_DOMAIN = b"dpbudget owner request v2\n"  # (a policy record's signature never verifies here)


def request_text(method: str, host: str, path: str, ledger: str, body: bytes,
                 when: str) -> bytes:
    """What the owner signs for one request to ``host`` (as the Host header names it) on the
    ledger whose identity is ``ledger``."""
    return _DOMAIN + "\n".join((method.upper(), host.lower(), path, ledger,
                                hashlib.sha256(body).hexdigest(), when)).encode("utf-8")


def sign_request(key: owner_key.OwnerKey, method: str, host: str, path: str, ledger: str,
                 body: bytes, now: float) -> dict[str, str]:
    """The two headers of an owner request made at ``now`` (the owner's clock): the time, with a
    random nonce (two requests alike in one second are not one replayed), and the signature."""
    when = f"{int(now)}.{secrets.token_hex(8)}"
    return {TIME: when, SIG: key.sign(request_text(method, host, path, ledger, body, when))}


def status_query(key: owner_key.OwnerKey, host: str, ledger: str, now: float) -> str:
    """The query string of a link that opens ``GET /owner/status`` once, within ``WINDOW`` s
    of ``now``: the signed headers' values as ``t`` and ``s``."""
    from urllib.parse import urlencode

    headers = sign_request(key, "GET", host, "/owner/status", ledger, b"", now)
    return urlencode({"t": headers[TIME], "s": headers[SIG]})


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
        self._seen: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def check(self, public: str | None, method: str, host: str, path: str, ledger: str,
              body: bytes, when: str | None, signature: str | None, now: float) -> str | None:
        """Why the owner request is refused, or None. ``now``: the server's clock."""
        if public is None:
            return "the ledger pins no owner key: it has no owner requests"
        seconds = when.partition(".")[0] if isinstance(when, str) else ""
        if not seconds.isdigit() or not isinstance(signature, str):
            return "an owner request needs the owner's signature and time headers"
        if abs(int(seconds) - now) > WINDOW:
            return f"the owner request's time is more than {WINDOW:g} s from the server's clock"
        try:  # (one signature has one spelling: a twin differing in unused bits is refused)
            raw = base64.b64decode(signature, validate=True)
        except ValueError:
            raw = b""
        if base64.b64encode(raw).decode("ascii") != signature:
            return "the owner signature is not canonical base64"
        if not _verifies(public, signature, request_text(method, host, path, ledger, body,
                                                         str(when))):
            return "the owner signature does not verify under the ledger's pinned owner key"
        with self._lock:
            for seen, at in list(self._seen.items()):
                if abs(at - now) > 2 * WINDOW:
                    del self._seen[seen]
            if raw in self._seen:
                return "this owner request was already received (a replay)"
            self._seen[raw] = now
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
