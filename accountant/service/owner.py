"""Owner requests to the query service: signed with the owner key, checked by the server.

The owner's client signs each request — its method, the service's authority (the host and port
of the URL the owner uses), its path, the ledger's identity (the hash of its first record, which
the owner pins: ``dpbudget status LEDGER`` prints it), the SHA-256 of its body and a time — with
the ledger owner's Ed25519 key (``dpbudget.accountant.gate.owner_key``) and sends the time and the
signature in two headers (or, for a ``status_link``, in the query string). The server verifies
the signature for ITS OWN public URL's authority (``dpbudget serve --public-url``), never the
Host a request names, and refuses a request whose Host is another; under the key the ledger's
first record pins; against its own clock (the time, 1 to 12 ASCII digits, must be within
``WINDOW`` seconds of it); and refuses a signature whose bytes it has seen within the window
(``Replays``: a base64 twin of a signature decodes to the same bytes). So a captured owner
request cannot be sent again, altered, or sent to another path or ledger, and a request the
owner signed for another URL (a relay) does not verify here.

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
import re
import secrets
import threading
from typing import Any

from dpbudget.accountant.gate import owner_key
from dpbudget.accountant.values.errors import OwnerKeyError

__all__ = ["TIME", "SIG", "WINDOW", "Presigned", "Replays", "authority", "request_text",
           "sign_request", "status_query"]

TIME, SIG = "x-dpbudget-owner-time", "x-dpbudget-owner-signature"
WINDOW = 30.0  # seconds either side of the server's clock
_DOMAIN = b"dpbudget owner request v2\n"  # (a policy record's signature never verifies here)


def authority(url: str) -> str:
    """The host and port of ``url`` as a client's Host header names them: lowercase, without
    the scheme's default port. Raises ``InvalidArgumentError`` for a URL without a host."""
    from urllib.parse import urlsplit

    from dpbudget.accountant.values.errors import InvalidArgumentError

    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or parts.scheme not in ("http", "https"):
        raise InvalidArgumentError("url", "<url>", "an http:// or https:// URL with a host")
    host = f"[{host}]" if ":" in host else host
    default = 443 if parts.scheme == "https" else 80
    return host if port in (None, default) else f"{host}:{port}"


def request_text(method: str, host: str, path: str, ledger: str, body: bytes,
                 when: str) -> bytes:
    """What the owner signs for one request to the service at ``host`` (``authority`` of its
    URL) on the ledger whose identity is ``ledger``."""
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
        # (ASCII digits only: "²".isdigit() holds and int() refuses it; 12 digits: a time)
        if re.fullmatch("[0-9]{1,12}", seconds) is None or not isinstance(signature, str):
            return "an owner request needs the owner's signature and time (1 to 12 digits)"
        if abs(int(seconds) - now) > WINDOW:
            return f"the owner request's time is more than {WINDOW:g} s from the server's clock"
        if not _verifies(public, signature, request_text(method, host, path, ledger, body,
                                                         str(when))):
            return "the owner signature does not verify under the ledger's pinned owner key"
        raw = base64.b64decode(signature)  # (it verified: base64; a twin spelling, same bytes)
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
