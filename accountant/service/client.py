"""The query service's client: ``dp.connect(url, token=...)``, the table API over HTTP.

``connect(url, token=...).table("visits")`` has the builder names of ``dp.table`` (``filter``,
``group_by``, ``count``, ``sum``, ``mean``, ``variance``, ``quantile``, ``median``,
``count_distinct_units``, then ``accuracy()`` or ``release()``); each query is sent as a
specification (``wire.Query``), never data, and comes back as the same answer types, or as the
same typed error (``BudgetExceededError`` with ``requested`` and ``remaining``...). The analyst
is the token's: nothing here names one. ``Owner`` is the owner's side: status, audit, a policy
change, and issuing or revoking a token (a policy change the owner signs, the secret made here).

Standard library only (``urllib``): the client needs none of the server's dependencies (the
owner's side needs ``cryptography``, for its key).

Invariant: a refusal the server sends is raised as the class it names (``wire.raise_error``); a
reply that is not the service's is a ``ServiceError``.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

from dpbudget.accountant.service import wire
from dpbudget.accountant.values.errors import LedgerUnconfirmedError, ServiceError

__all__ = ["Owner", "RemoteTable", "Service", "connect"]


def _call(url: str, method: str, body: bytes | None, headers: dict[str, str],
          timeout: float, context: ssl.SSLContext | None = None) -> Any:
    request = urllib.request.Request(url, body, {"content-type": "application/json", **headers},
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            status, raw, kind = response.status, response.read(), response.headers.get(
                "content-type", "")
    except urllib.error.HTTPError as exc:
        with exc:  # (a refusal's reply: read, then its connection closed)
            status, raw, kind = exc.code, exc.read(), exc.headers.get("content-type", "")
    except http.client.HTTPException as exc:  # (a reply cut off: the server died sending it)
        raise LedgerUnconfirmedError(f"the service's reply was cut off ({type(exc).__name__}): "
                                     "a query sent may have been debited; do not retry it "
                                     "blindly, a retry pays again") from None
    if "json" not in kind:
        if status == 200:
            return raw.decode("utf-8")
        raise ServiceError(status, f"the service answered HTTP {status} without a dpbudget reply")
    try:
        reply = json.loads(raw)
    except ValueError:
        raise LedgerUnconfirmedError("the service's reply is not whole JSON: a query sent may "
                                     "have been debited; a retry pays again") from None
    if not reply.get("ok"):
        wire.raise_error(reply.get("error"))
    return reply


class Service:
    """A connection to a query service as one analyst (``connect``)."""

    def __init__(self, url: str, token: str, timeout: float, cafile: str | None = None) -> None:
        self.url, self._token, self.timeout = url.rstrip("/"), token, timeout
        self._context = _trusting(cafile)
        self.last_receipt: dict[str, Any] | None = None

    def __repr__(self) -> str:  # (never the token)
        return f"Service({self.url!r})"

    def _send(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        return _call(self.url + path, method, data, {"authorization": f"Bearer {self._token}"},
                     self.timeout, self._context)

    def table(self, name: str) -> "RemoteTable":
        """The registered table ``name``, to query."""
        return RemoteTable(self, {"table": name})

    def remaining(self, dataset: str) -> dict[str, Any]:
        """What is left on ``dataset``: ``analyst`` (this token's analyst's limit) and
        ``dataset_limit`` (the dataset's own), each ``{"epsilon", "delta"}``."""
        from urllib.parse import quote

        reply = self._send("GET", f"/v1/remaining?dataset={quote(dataset)}")
        return {"analyst": reply["analyst"], "dataset_limit": reply["dataset_limit"]}


def connect(url: str, *, token: str, timeout: float = 60.0,
            cafile: str | None = None) -> Service:
    """A connection to the query service at ``url`` as the analyst ``token`` belongs to;
    ``cafile``: a PEM file of the certificates to trust for an ``https`` URL (a service's own
    self-signed one), instead of the system's (the certificate is verified either way)."""
    return Service(url, token, timeout, cafile)


def _trusting(cafile: str | None) -> ssl.SSLContext | None:
    """The TLS context that trusts ``cafile`` (hostname checked); None: the system's."""
    return None if cafile is None else ssl.create_default_context(cafile=cafile)


class RemoteTable:
    """A registered table's query under construction (immutable, as ``dp.table``'s)."""

    def __init__(self, service: Service, spec: dict[str, Any]) -> None:
        self._service, self._spec = service, spec

    def _with(self, **changes: Any) -> "RemoteTable":
        return RemoteTable(self._service, {**self._spec, **changes})

    def filter(self, column: str, op: str, value: Any) -> "RemoteTable":
        """As ``Table.filter``."""
        value = list(value) if isinstance(value, (tuple, list, set, frozenset)) else value
        return self._with(filters=[*self._spec.get("filters", []),
                                   {"column": column, "op": op, "value": value}])

    def group_by(self, *columns: str, keys: Any = None) -> "RemoteTable":
        """As ``Table.group_by``."""
        keys = None if keys is None else [list(k) if isinstance(k, tuple) else k for k in keys]
        return self._with(group_by=list(columns), keys=keys)

    def _query(self, statistic: str, epsilon: Any, budget: Any, delta: Any,
               bounds: dict[str, Any], **params: Any) -> "RemoteQuery":
        if budget is not None:
            epsilon, delta = budget.epsilon, budget.delta or None
        spec = {**self._spec, "statistic": statistic, "epsilon": _number(epsilon),
                "bounds": bounds, **{k: _number(v) if k not in ("column", "bins") else v
                                     for k, v in params.items() if v is not None}}
        if delta is not None:
            spec["delta"] = _number(delta)
        return RemoteQuery(self._service, spec)

    def count(self, *, epsilon: float | None = None, budget: Any = None,
              delta: float | None = None, **bounds: Any) -> "RemoteQuery":
        return self._query("count", epsilon, budget, delta, bounds)

    def count_distinct_units(self, *, epsilon: float | None = None, budget: Any = None,
                             delta: float | None = None, **bounds: Any) -> "RemoteQuery":
        return self._query("count_distinct_units", epsilon, budget, delta, bounds)

    def sum(self, column: str, *, lower: float, upper: float, epsilon: float | None = None,
            budget: Any = None, delta: float | None = None,
            selection_share: float | None = None, **bounds: Any) -> "RemoteQuery":
        return self._query("sum", epsilon, budget, delta, bounds, column=column, lower=lower,
                           upper=upper, selection_share=selection_share)

    def mean(self, column: str, *, lower: float, upper: float, epsilon: float | None = None,
             budget: Any = None, delta: float | None = None,
             selection_share: float | None = None, **bounds: Any) -> "RemoteQuery":
        return self._query("mean", epsilon, budget, delta, bounds, column=column, lower=lower,
                           upper=upper, selection_share=selection_share)

    def variance(self, column: str, *, lower: float, upper: float,
                 epsilon: float | None = None, budget: Any = None, delta: float | None = None,
                 selection_share: float | None = None, **bounds: Any) -> "RemoteQuery":
        return self._query("variance", epsilon, budget, delta, bounds, column=column,
                           lower=lower, upper=upper, selection_share=selection_share)

    def quantile(self, column: str, q: float, *, lower: float, upper: float,
                 bins: int | None = None, epsilon: float | None = None, budget: Any = None,
                 **bounds: Any) -> "RemoteQuery":
        return self._query("quantile", epsilon, budget, None, bounds, column=column, q=q,
                           lower=lower, upper=upper, bins=bins)

    def median(self, column: str, *, lower: float, upper: float, bins: int | None = None,
               epsilon: float | None = None, budget: Any = None,
               **bounds: Any) -> "RemoteQuery":
        return self.quantile(column, 0.5, lower=lower, upper=upper, bins=bins, epsilon=epsilon,
                             budget=budget, **bounds)


def _number(x: Any) -> Any:
    """An int sent where the wire wants a float (strict: 1 is a float, True is not)."""
    return float(x) if isinstance(x, int) and not isinstance(x, bool) else x


class RemoteQuery:
    """One statistic of a registered table: ``accuracy()`` (free) or ``release()``."""

    def __init__(self, service: Service, spec: dict[str, Any]) -> None:
        self._service, self._spec = service, spec

    def accuracy(self) -> Any:
        """As ``TableQuery.accuracy``: computed by the server, nothing charged."""
        return wire.decode(self._service._send("POST", "/v1/query", {
            **self._spec, "action": "accuracy"})["answer"])

    def release(self, *, label: str | None = None) -> Any:
        """As ``TableQuery.release``; the receipt is ``service.last_receipt`` (a dict)."""
        reply = self._service._send("POST", "/v1/query", {**self._spec, "label": label})
        self._service.last_receipt = wire.decode(reply["receipt"])
        return wire.decode(reply["answer"])


class Owner:
    """The ledger owner's side of a query service, every request signed with the owner key for
    the service's URL and for the ledger identity ``ledger`` the owner pins (the hash of the
    ledger's first record, as ``dpbudget status LEDGER`` prints it): a server on another ledger
    refuses the signature (401); none is asked which ledger it holds."""

    def __init__(self, url: str, key: Any, *, ledger: str, timeout: float = 60.0,
                 cafile: str | None = None) -> None:
        import re

        from dpbudget.accountant.gate import owner_key
        from dpbudget.accountant.service.owner import authority
        from dpbudget.accountant.values.errors import InvalidArgumentError

        if not isinstance(ledger, str) or re.fullmatch("[0-9a-f]{64}", ledger) is None:
            raise InvalidArgumentError("ledger", "<identity>", "the ledger's identity: 64 "
                                       "lowercase hex digits (dpbudget status LEDGER)")
        self.url, self._key, self.timeout = url.rstrip("/"), owner_key.load(key), timeout
        self._host, self._ledger = authority(self.url), ledger
        self._context = _trusting(cafile)

    def _send(self, method: str, path: str, body: Any = None) -> Any:
        from dpbudget.accountant.service.owner import sign_request

        data = b"" if body is None else json.dumps(body).encode("utf-8")
        headers = sign_request(self._key, method, self._host, path, self._ledger, data,
                               time.time())
        return _call(self.url + path, method, data or None, headers, self.timeout,
                     self._context)

    def status_link(self) -> str:
        """A link that opens the status page in a browser once, within 30 s of now."""
        from dpbudget.accountant.service.owner import status_query

        return f"{self.url}/owner/status?" + status_query(self._key, self._host, self._ledger,
                                                           time.time())

    def status(self) -> dict[str, Any]:
        """The ledger's identity, head and every account's spend against the policy."""
        return dict(self._send("GET", "/owner/status.json"))

    def audit(self) -> dict[str, Any]:
        """``dpbudget audit`` run by the server: ``exit_status`` and ``report``."""
        return dict(self._send("GET", "/owner/audit"))

    def apply_policy(self, policy: Any, *, by: str, reason: str) -> dict[str, Any]:
        """Replace the policy in force with ``policy`` (a ``Policy``), signed for the record's
        place (the next seq of the ledger as the status reports it: a record written in between
        makes the server refuse it, and it is signed again, up to three times)."""
        from dpbudget.accountant.gate import owner_key
        from dpbudget.accountant.values.errors import OwnerKeyError
        from dpbudget.policies.stored import document

        doc = json.loads(json.dumps(document(policy, None)))
        for attempt in (1, 2, 3):
            status = self.status()
            text = owner_key.signed_text({"by": by, "reason": reason, "policy": doc},
                                         status["records"] + 1, self._key.public,
                                         self._ledger)
            try:
                return dict(self._send("POST", "/owner/policy", {
                    "document": doc, "by": by, "reason": reason,
                    "signature": self._key.sign(text)}))
            except OwnerKeyError:
                if attempt == 3:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def issue_token(self, policy: Any, analyst: str, *, expires: float, by: str,
                    reason: str) -> tuple[str, Any]:
        """A new token for ``analyst`` valid until ``expires`` (Unix s), added to ``policy``
        (the policy in force) and applied: (the token, shown once; the new policy)."""
        from dpbudget.accountant.service.tokens import new_token, with_token

        token, entry = new_token(int(expires))
        changed = with_token(policy, analyst, entry)
        self.apply_policy(changed, by=by, reason=reason)
        return token, changed

    def revoke_token(self, policy: Any, token_id: str, *, by: str, reason: str) -> Any:
        """``policy`` without the token ``token_id``, applied: the new policy."""
        from dpbudget.accountant.service.tokens import without_token

        changed = without_token(policy, token_id)
        self.apply_policy(changed, by=by, reason=reason)
        return changed
