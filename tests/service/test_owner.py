"""Owner requests (dpbudget.accountant.service.owner): signed by the pinned key over method,
path, body and time; checked against the server's clock; a replay refused; a presigned policy
record accepted only for exactly the text it was signed for. Times are passed in, never read."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpbudget.accountant.gate.owner_key import load, new_key_file
from dpbudget.accountant.service.owner import SIG, TIME, Presigned, Replays, sign_request
from dpbudget.accountant.values.errors import OwnerKeyError

NOW = 1_800_000_000.0


@pytest.fixture
def key(tmp_path: Path) -> object:
    new_key_file(tmp_path / "k.pem")
    return load(tmp_path / "k.pem")


def test_a_signed_request_is_admitted_once(key: object) -> None:
    replays = Replays()
    headers = sign_request(key, "POST", "/owner/policy", b"{}", NOW)  # type: ignore[arg-type]
    assert replays.check(key.public, "POST", "/owner/policy", b"{}", headers, NOW + 5) is None  # type: ignore[attr-defined]
    assert "replay" in str(replays.check(key.public, "POST", "/owner/policy", b"{}", headers,  # type: ignore[attr-defined]
                                         NOW + 6))


@pytest.mark.parametrize("attack", ["stale", "future", "other body", "other path", "other key",
                                    "unsigned", "other method"])
def test_altered_stale_or_foreign_requests_are_refused(key: object, tmp_path: Path,
                                                       attack: str) -> None:
    new_key_file(tmp_path / "other.pem")
    other = load(tmp_path / "other.pem")
    signer = other if attack == "other key" else key
    headers = sign_request(signer, "POST", "/owner/policy", b"{}", NOW)  # type: ignore[arg-type]
    method, path, body, now = "POST", "/owner/policy", b"{}", NOW
    if attack == "stale":
        now = NOW + 31
    elif attack == "future":
        now = NOW - 31
    elif attack == "other body":
        body = b'{"raise": true}'
    elif attack == "other path":
        path = "/owner/audit"
    elif attack == "other method":
        method = "GET"
    elif attack == "unsigned":
        headers = {TIME: headers[TIME]}
    assert Replays().check(key.public, method, path, body, headers, now) is not None  # type: ignore[attr-defined]


def test_negative_control_the_same_request_in_the_window_passes(key: object) -> None:
    headers = sign_request(key, "POST", "/owner/policy", b"{}", NOW)  # type: ignore[arg-type]
    assert Replays().check(key.public, "POST", "/owner/policy", b"{}", headers, NOW + 30) is None  # type: ignore[attr-defined]
    assert set(headers) == {TIME, SIG}


def test_a_presigned_record_signature_is_used_only_for_its_text(key: object) -> None:
    text = b"dpbudget policy record v1\n{...seq 5...}"
    signed = Presigned(key.public, key.sign(text))  # type: ignore[attr-defined]
    assert signed.sign(text) == key.sign(text)  # type: ignore[attr-defined]
    with pytest.raises(OwnerKeyError):
        signed.sign(b"dpbudget policy record v1\n{...seq 6...}")
