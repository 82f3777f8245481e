"""Owner requests (dpbudget.accountant.service.owner): signed by the pinned key over method,
the service's authority, path, the ledger's identity, body and time; checked against the
server's clock (a time of 1 to 12 ASCII digits); a replay refused, its base64 twin too (the same
bytes); a presigned policy record accepted only for exactly the text it was signed for. Times
are passed in, never read."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpbudget.accountant.gate.owner_key import load, new_key_file
from dpbudget.accountant.service.owner import SIG, TIME, Presigned, Replays, sign_request
from dpbudget.accountant.values.errors import OwnerKeyError

NOW = 1_800_000_000.0
HOST, LEDGER = "dp.example.org:8443", "ab" * 32


def _sign(key: object, method: str = "POST", path: str = "/owner/policy", body: bytes = b"{}",
          now: float = NOW) -> dict[str, str]:
    return sign_request(key, method, HOST, path, LEDGER, body, now)  # type: ignore[arg-type]


def _check(replays: Replays, key: object, headers: dict[str, str], now: float,
           method: str = "POST", path: str = "/owner/policy", body: bytes = b"{}",
           host: str = HOST, ledger: str = LEDGER) -> str | None:
    return replays.check(key.public, method, host, path, ledger, body,  # type: ignore[attr-defined]
                         headers.get(TIME), headers.get(SIG), now)


@pytest.fixture
def key(tmp_path: Path) -> object:
    new_key_file(tmp_path / "k.pem")
    return load(tmp_path / "k.pem")


def test_a_signed_request_is_admitted_once(key: object) -> None:
    replays = Replays()
    headers = _sign(key)
    assert _check(replays, key, headers, NOW + 5) is None
    assert "replay" in str(_check(replays, key, headers, NOW + 6))


def _twin(signature: str) -> str:
    """The same 64 bytes spelt otherwise: the last character's two unused low bits flipped."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(signature[-3])  # (88 characters: 86 of data, then "==")
    return signature[:-3] + alphabet[last ^ 0b11] + signature[-2:]


def test_the_base64_twin_of_a_seen_signature_is_refused(key: object) -> None:
    """The attack: a replay re-spelt in the unused bits of the last character, decoding to the
    same 64 bytes (so it verifies); refused as a replay, whichever spelling came first."""
    import base64

    headers = _sign(key)
    twin = {**headers, SIG: _twin(headers[SIG])}
    assert twin[SIG] != headers[SIG]
    assert base64.b64decode(twin[SIG]) == base64.b64decode(headers[SIG])
    for first, second in ((headers, twin), (twin, headers)):
        replays = Replays()
        assert _check(replays, key, first, NOW) is None
        assert "replay" in str(_check(replays, key, second, NOW))


def test_negative_control_the_twin_verifies_so_only_the_bytes_key_refuses_it(
        key: object) -> None:
    """The twin is a valid signature of the same request: the signature check alone admits it,
    and a seen set keyed on the text (the old one) did not hold it — what made the replay."""
    from dpbudget.accountant.service.owner import _verifies, request_text

    headers = _sign(key)
    twin = _twin(headers[SIG])
    text = request_text("POST", HOST, "/owner/policy", LEDGER, b"{}", headers[TIME])
    assert _verifies(key.public, twin, text) and twin not in {headers[SIG]}  # type: ignore[attr-defined]


@pytest.mark.parametrize("seconds", ["\u00b2", "1" * 5000, "\u0661\u0662", "1234567890123", ""])
def test_a_time_that_is_not_1_to_12_ascii_digits_is_refused_not_a_fault(
        key: object, seconds: str) -> None:
    """The reviewer's attack: a time of ``²`` or 5000 digits passed ``isdigit()`` and made
    ``int()`` raise (a 500 that said budget may be spent). Now an ordinary refusal, as are
    other Unicode digits and 13 digits; the negative control: the old ``isdigit()`` let both
    figures through to an ``int()`` that raises."""
    headers = {**_sign(key), TIME: f"{seconds}.00"}
    assert "1 to 12 digits" in str(_check(Replays(), key, headers, NOW))
    if seconds in ("\u00b2", "1" * 5000):  # (the reviewer's figures)
        assert seconds.isdigit()
        with pytest.raises(ValueError):  # (² is no decimal; 5000 digits: int()'s limit)
            int(seconds)


@pytest.mark.parametrize("attack", ["other host", "other ledger"])
def test_a_request_signed_for_another_server_or_ledger_is_refused(key: object,
                                                                  attack: str) -> None:
    headers = _sign(key)
    other = {"host": "evil.example.org:8443"} if attack == "other host" else {"ledger": "cd" * 32}
    assert "does not verify" in str(_check(Replays(), key, headers, NOW, **other))  # type: ignore[arg-type]
    assert _check(Replays(), key, headers, NOW) is None  # (the control: for its own, it passes)


@pytest.mark.parametrize("attack", ["stale", "future", "other body", "other path", "other key",
                                    "unsigned", "other method"])
def test_altered_stale_or_foreign_requests_are_refused(key: object, tmp_path: Path,
                                                       attack: str) -> None:
    new_key_file(tmp_path / "other.pem")
    other = load(tmp_path / "other.pem")
    signer = other if attack == "other key" else key
    headers = _sign(signer)
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
    assert _check(Replays(), key, headers, now, method, path, body) is not None


def test_negative_control_the_same_request_in_the_window_passes(key: object) -> None:
    headers = _sign(key)
    assert _check(Replays(), key, headers, NOW + 30) is None
    assert set(headers) == {TIME, SIG}


def test_a_presigned_record_signature_is_used_only_for_its_text(key: object) -> None:
    text = b"dpbudget policy record v1\n{...seq 5...}"
    signed = Presigned(key.public, key.sign(text))  # type: ignore[attr-defined]
    assert signed.sign(text) == key.sign(text)  # type: ignore[attr-defined]
    with pytest.raises(OwnerKeyError):
        signed.sign(b"dpbudget policy record v1\n{...seq 6...}")


@pytest.mark.parametrize(("url", "host"), [
    ("https://DP.example.org/", "dp.example.org"), ("https://dp.example.org:443", "dp.example.org"),
    ("http://127.0.0.1:8000", "127.0.0.1:8000"), ("http://[::1]:80/x", "[::1]"),
    ("https://dp.example.org:8443", "dp.example.org:8443")])
def test_the_authority_is_what_a_client_sends_as_host(url: str, host: str) -> None:
    from dpbudget.accountant.service.owner import authority

    assert authority(url) == host


@pytest.mark.parametrize("url", ["dp.example.org", "ftp://dp.example.org", "http://", "http://h:x"])
def test_a_url_without_an_http_host_is_refused(url: str) -> None:
    from dpbudget.accountant.service.owner import authority
    from dpbudget.accountant.values.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="url"):
        authority(url)
