"""The ledger owner's key: who may change a ledger's policy (Ed25519, RFC 8032).

A ledger created with an owner key pins the key's public half in its first record (the policy
record that creates it, member ``owner``), and every policy record of that ledger carries
``sig``: the owner's signature over what the record grants — its policy, ``by`` and ``reason`` —
and over its place: its ``seq``, the pinned key and the ledger's identity (the hash of its first
record; none for the first record itself). A policy record is enforced only if that signature
verifies, so an analyst holding an ``Accountant`` cannot change the limits (no private key), and
an old signed record copied to a later place, or into another ledger, does not verify there.

A ledger created without an owner key pins none: its first policy record is its policy for good.

The private key lives in a PEM file (PKCS #8, unencrypted, mode 0600) on the owner's machine —
never on the analysts' machines, never in the ledger's directory (docs/threat-model.md). It is
never printed, logged or written into a record; ``repr`` shows only the public key.

Needs the optional extra ``dpbudget[owner]`` (the ``cryptography`` package), imported only when a
key is loaded or a signature verified; without it an ``OwnerKeyError`` says what to install.

Invariant: ``signed_text`` is a pure function of the record's members and its place; ``verify``
holds only for the pinned key's signature over exactly that text.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpbudget.accountant.values.errors import OwnerKeyError
from dpbudget.accountant.ledger.record import canonical

__all__ = ["KEY_ENV", "OwnerKey", "from_env", "load", "new_key_file", "pinned", "signed_text",
           "verify"]

KEY_ENV = "DPBUDGET_OWNER_KEY"
_DOMAIN = b"dpbudget policy record v1\n"  # a signature made for anything else never verifies here
_INSTALL = 'the ledger owner\'s key needs the cryptography package: pip install "dpbudget[owner]"'


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise OwnerKeyError(_INSTALL) from None
    return ed25519


class OwnerKey:
    """A ledger owner's private key, loaded from its PEM file (``load``)."""

    __slots__ = ("_private", "public")

    def __init__(self, private: Any) -> None:
        from cryptography.hazmat.primitives import serialization as s

        self._private = private
        #: The public key as the ledger pins it: base64 of its 32 raw bytes.
        self.public = base64.b64encode(private.public_key().public_bytes(
            s.Encoding.Raw, s.PublicFormat.Raw)).decode("ascii")

    def sign(self, text: bytes) -> str:
        """The signature of ``text`` (base64)."""
        return base64.b64encode(self._private.sign(text)).decode("ascii")

    def __repr__(self) -> str:
        return f"OwnerKey(public={self.public!r})"


def load(source: "OwnerKey | str | os.PathLike[str]") -> OwnerKey:
    """The owner key ``source`` names: an ``OwnerKey``, or the path of its PEM file.

    Raises:
        OwnerKeyError: the file cannot be read or holds no Ed25519 private key (its content is
            never shown), or ``cryptography`` is not installed.
    """
    if isinstance(source, OwnerKey):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise OwnerKeyError("owner_key: expected an OwnerKey or the path of the owner's key file "
                            f"(`dpbudget keys new`), got a {type(source).__name__}")
    ed25519 = _ed25519()
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        private = load_pem_private_key(Path(source).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise OwnerKeyError(f"owner_key: cannot read an owner key from the file given "
                            f"({type(exc).__name__}); expected a PEM file written by "
                            "`dpbudget keys new`") from None
    if not isinstance(private, ed25519.Ed25519PrivateKey):
        raise OwnerKeyError("owner_key: the file given holds a private key that is not Ed25519; "
                            "expected a PEM file written by `dpbudget keys new`")
    return OwnerKey(private)


def from_env() -> OwnerKey | None:
    """The key whose file ``DPBUDGET_OWNER_KEY`` names (the command line's default), or None."""
    path = os.environ.get(KEY_ENV)
    return load(path) if path else None


def new_key_file(path: "str | os.PathLike[str]") -> str:
    """Write a new private key to ``path`` (created, never overwritten, mode 0600) and return
    its public key.

    Raises:
        FileExistsError: ``path`` exists (a key is never replaced: the ledgers pinning it would
            lose their owner).
        OwnerKeyError: ``cryptography`` is not installed.
    """
    ed25519 = _ed25519()
    from cryptography.hazmat.primitives import serialization as s

    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())
    # O_EXCL with the mode given at creation: the key is never readable by others, not even
    # between creation and a chmod.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return OwnerKey(private).public


def pinned(first: Mapping[str, Any] | None) -> str | None:
    """The owner key a ledger's first record pins, or None (a ledger without an owner key)."""
    if first is None or first.get("kind") != "policy":
        return None
    owner = first.get("owner")
    return owner if isinstance(owner, str) else None


def signed_text(record: Mapping[str, Any], seq: int, owner: str, ledger: str | None) -> bytes:
    """What the owner signs for policy record ``record`` at ``seq`` of the ledger whose first
    record's hash is ``ledger`` (None for the first record itself)."""
    return _DOMAIN + canonical({"by": record.get("by"), "ledger": ledger, "owner": owner,
                                "policy": record.get("policy"), "reason": record.get("reason"),
                                "seq": seq}).encode("utf-8")


def verify(record: Mapping[str, Any], seq: int, owner: str, ledger: str | None) -> str | None:
    """Why policy record ``record`` at ``seq`` is not signed by ``owner`` in that place, or None.

    Raises:
        OwnerKeyError: ``cryptography`` is not installed (a keyed ledger cannot be checked).
    """
    sig = record.get("sig")
    if not isinstance(sig, str):
        return f"policy record {seq} is not signed, and the ledger pins an owner key"
    ed25519 = _ed25519()
    from cryptography.exceptions import InvalidSignature

    try:
        public = ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(owner, validate=True))
        public.verify(base64.b64decode(sig, validate=True), signed_text(record, seq, owner, ledger))
    except (InvalidSignature, ValueError, TypeError):
        return (f"policy record {seq}'s signature does not verify under the owner key pinned in "
                "record 1 (another key, another place, or edited)")
    return None
