"""The query service's HTTP face (Starlette on uvicorn): ``dpbudget serve``.

Routes:

* ``POST /v1/query`` (analyst token): a ``wire.Query``; the answer and its receipt, or the
  accuracy, or a typed refusal.
* ``GET /v1/remaining?dataset=NAME`` (analyst token): what is left of the token's analyst's limit
  on a dataset, and of the dataset's own.
* ``GET /owner/status`` (HTML), ``GET /owner/status.json``, ``GET /owner/audit``, ``POST
  /owner/policy`` (owner-signed: ``service.owner``; the page also through a signed link, whose
  query string carries the signature, opened once), checked for the service's public URL: a
  request with another Host is refused. Issuing and revoking a token is a policy change the
  owner signs (``client.Owner``): the server never sees a token's secret.

A slow or hostile client never holds a ledger lock: the body is read whole (at most
``max_body`` bytes: 413 beyond) and parsed before anything else happens, and the debit, the
computation and the reading of the ledger run in a worker thread that never waits on the
network. A query that runs past ``time_limit`` seconds releases nothing: if its debit had not
begun, it never will (``state.Deadline``) and the reply says nothing was spent; if it had, the
reply says its budget may be spent (its answer, if it comes, is dropped): the rule of a failed
computation. A refusal never names the datasets or tables the analyst did not ask for.

Every request, answered or refused, is one line of the request log (``_log``): its time, method,
path, status, the token's id and analyst, the table and statistic, the error's class — never a
token, a signature, a value or an answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
import threading
import time
from typing import IO, Any, Callable

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from dpbudget.accountant.gate import owner_key, policy_record
from dpbudget.accountant.service import page, wire
from dpbudget.accountant.service.owner import SIG, TIME, Presigned, Replays, authority
from dpbudget.accountant.service.state import GAVE_UP, Admitted, Deadline, Held
from dpbudget.accountant.values.errors import (InvalidArgumentError, LedgerUnconfirmedError,
                                               OwnerKeyError, PrivacyError, ServiceError,
                                               from_validation_error)

__all__ = ["build_app"]

_STATUS = {"BudgetExceededError": 403, "MechanismNotAllowedError": 403,
           "UnknownAnalystError": 403, "AnalystMismatchError": 403, "UnitRequiredError": 403,
           "OwnerKeyError": 403}


class _JSON(JSONResponse):
    """JSON that keeps an infinite limit (``Infinity``: Python's ``json`` reads it back)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("utf-8")


def build_app(held: Held, *, public_url: str, max_body: int = 65536, time_limit: float = 30.0,
              log: IO[str] | None = None, workers: int = 16) -> Starlette:
    """The service's Starlette application over ``held``, reached by owners at ``public_url``
    (what their requests are signed for)."""
    here = authority(public_url)
    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="dpbudget-query")
    replays, out, log_lock = Replays(), log or sys.stderr, threading.Lock()
    served = {registered.dataset for registered in held.tables.values()}

    def record(request: Request, status: int, started: float, **fields: Any) -> None:
        line = {"time": round(time.time(), 3), "method": request.method,
                "path": request.url.path, "status": status,
                "ms": round((time.monotonic() - started) * 1000, 1), **fields}
        with log_lock:
            out.write(json.dumps(line) + "\n")
            out.flush()

    async def body_of(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_body):
            raise ServiceError(413, f"request body over {max_body} bytes; nothing was read")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                raise ServiceError(413, f"request body over {max_body} bytes; nothing was read")
            chunks.append(chunk)
        return b"".join(chunks)

    async def in_worker(fn: Callable[[Deadline], Any], owner: bool = False) -> Any:
        deadline = Deadline(time.monotonic() + time_limit)
        future = pool.submit(fn, deadline)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), time_limit)
        except asyncio.TimeoutError:
            if owner:  # (an owner request spends no budget)
                raise ServiceError(504, f"the owner request ran past the service's time limit "
                                   f"of {time_limit:g} s; a policy change it carried may still "
                                   "be written: read the status") from None
            if deadline.give_up():  # (its debit had not begun: now it never will)
                raise ServiceError(503, GAVE_UP) from None
            raise LedgerUnconfirmedError(
                f"the query ran past the service's time limit of {time_limit:g} s: its budget "
                "may have been debited and stays spent (a retry pays again); nothing was "
                "released") from None
        except PrivacyError:
            raise
        except Exception as exc:  # a fault of the service: named by type (its text may hold data)
            if owner:  # (an owner request spends no budget: never say it may have)
                raise ServiceError(500, f"the service failed ({type(exc).__name__}) on an owner "
                                   "request; a policy change it carried may be written: read "
                                   "the status") from None
            raise LedgerUnconfirmedError(
                f"the service failed ({type(exc).__name__}): its budget may have been debited "
                "and stays spent; nothing was released") from None

    def admitted(presented: str | None, fields: dict[str, Any]) -> Admitted:
        who = held.admit(presented)
        fields.update(token=who.token, analyst=who.analyst)  # (for the request log)
        held.rate(who)
        return who

    def bearer(request: Request) -> str | None:
        text = request.headers.get("authorization", "")
        return text[7:].strip() if text.lower().startswith("bearer ") else None

    def refusal(exc: PrivacyError) -> JSONResponse:
        status = exc.status if isinstance(exc, ServiceError) else _STATUS.get(
            type(exc).__name__, 500 if isinstance(exc, LedgerUnconfirmedError) else 400)
        return _JSON({"ok": False, "error": wire.error_body(exc)}, status)

    async def query(request: Request) -> Response:
        started, fields = time.monotonic(), dict[str, Any]()
        try:
            body = await body_of(request)  # (whole, before anything else)
            try:
                spec = wire.Query.model_validate_json(body)
            except ValidationError as exc:
                raise from_validation_error(exc) from None
            fields.update(table=spec.table, statistic=spec.statistic, action=spec.action)
            presented = bearer(request)
            answer, receipt = await in_worker(lambda deadline: held.query(
                presented, admitted(presented, fields), spec, deadline))
            reply = {"ok": True, "answer": wire.encode(answer)}
            if receipt is not None:
                reply["receipt"] = wire.encode(receipt.as_dict())
                fields["seq"] = receipt.seq
            response: Response = _JSON(reply)
        except PrivacyError as exc:
            fields["error"] = type(exc).__name__
            response = refusal(exc)
        record(request, response.status_code, started, **fields)
        return response

    async def remaining(request: Request) -> Response:
        started, fields = time.monotonic(), dict[str, Any]()
        dataset = request.query_params.get("dataset")
        try:
            if dataset is None:
                raise InvalidArgumentError("dataset", None, "a dataset's name (?dataset=)")
            presented = bearer(request)

            def run(_: Deadline) -> dict[str, Any]:
                who = admitted(presented, fields)
                if dataset not in served:  # (the policy's other datasets are not named)
                    raise InvalidArgumentError("dataset", dataset, "a dataset this service serves")
                acc = who.accountant
                return {"ok": True, "dataset": dataset,
                        "analyst": acc.remaining(dataset, analyst=who.analyst).model_dump(),
                        "dataset_limit": acc.remaining(dataset).model_dump()}
            response: Response = _JSON(await in_worker(run))
        except PrivacyError as exc:
            fields["error"] = type(exc).__name__
            response = refusal(exc)
        record(request, response.status_code, started, **fields)
        return response

    first, identity = policy_record._first(held.ledger)  # (fixed for the ledger's life)
    public, identity = owner_key.pinned(first), str(identity)
    page_headers = {"content-security-policy": f"{page.CSP}; frame-ancestors 'none'",
                    "cache-control": "no-store", "x-content-type-options": "nosniff",
                    "referrer-policy": "no-referrer"}

    def owner_route(handler: Callable[[bytes], Any], html: bool = False) -> Any:
        async def route(request: Request) -> Response:
            started, fields = time.monotonic(), dict[str, Any](owner=True)
            # (a status link carries its time and signature in the query string: a browser
            # opening it cannot send headers)
            signed = request.query_params if html and TIME not in request.headers else {
                "t": request.headers.get(TIME), "s": request.headers.get(SIG)}
            try:
                body = await body_of(request)

                def run(_: Deadline) -> Any:
                    # (the signature is checked for this service's public URL, never for the
                    # Host a request names: a relay's Host does not make its signature fit)
                    why = "the owner request was sent to another Host than the service's " \
                          "public URL" if request.headers.get("host", "").lower() != here \
                        else replays.check(public, request.method, here, request.url.path,
                                           identity, body, signed.get("t"), signed.get("s"),
                                           time.time())
                    if why is not None:
                        raise ServiceError(401, f"{why}; nothing was done")
                    held.refresh()
                    return handler(body)
                out = await in_worker(run, owner=True)
                response: Response = HTMLResponse(out, headers=page_headers) if html \
                    else _JSON(out)
            except PrivacyError as exc:
                fields["error"] = type(exc).__name__
                response = refusal(exc)
            record(request, response.status_code, started, **fields)
            return response
        return route

    def status(_: bytes) -> dict[str, Any]:
        from dpbudget.accountant.audit.status import budget_rows

        ledger = held.ledger
        seq, head = ledger.head()
        return {"ok": True, "ledger": identity, "owner": public, "records": seq, "head": head,
                "accounts": budget_rows(ledger, held.accountant.policy)}

    def audit(_: bytes) -> dict[str, Any]:
        from dpbudget.accountant.audit.run import audit as run_audit

        report = run_audit(held.ledger, held.accountant.policy)
        return {"ok": True, "exit_status": report.exit_status,
                "report": json.loads(report.model_dump_json(
                    exclude={"accounts": {"__all__": {"series"}}}))}

    def apply(body: bytes) -> dict[str, Any]:
        from dpbudget.policies.stored import from_document

        try:
            sent = json.loads(body)
            policy, default = from_document(sent["document"])
            by, reason, signature = sent["by"], sent["reason"], sent["signature"]
        except (ValueError, KeyError, TypeError):
            raise InvalidArgumentError("body", "<json>", "{document, by, reason, signature}: "
                                       "a policy document signed for its place") from None
        if default is not None or not isinstance(signature, str):
            raise InvalidArgumentError("document", "<json>", "a policy document without a "
                                       "stored default, and a signature")
        if public is None:
            raise OwnerKeyError("this ledger pins no owner key: its policy cannot change; "
                                "nothing was written")
        change = policy_record.replace(held.ledger, policy, by=by, reason=reason,
                                       owner=Presigned(public, signature))  # type: ignore[arg-type]
        held.refresh()
        return {"ok": True, "seq": change.seq, "changes": change.changes,
                "raised": change.raised}

    routes = [Route("/v1/query", query, methods=["POST"]),
              Route("/v1/remaining", remaining, methods=["GET"]),
              Route("/owner/status", owner_route(lambda b: page.render(held.ledger), True),
                    methods=["GET"]),
              Route("/owner/status.json", owner_route(status), methods=["GET"]),
              Route("/owner/audit", owner_route(audit), methods=["GET"]),
              Route("/owner/policy", owner_route(apply), methods=["POST"])]
    return Starlette(routes=routes)

