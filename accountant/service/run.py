"""``dpbudget serve``, ``dpbudget token issue|revoke`` and ``dpbudget owner link``: starting the
service, the owner's token commands on a ledger (each a policy change signed with the owner
key), and the owner's one-time link to a running service's status page.

Invariant: a server process opens ONE accountant (the process rule) and runs one uvicorn worker;
a token's secret is printed once, by ``token issue``, and stored nowhere.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

__all__ = ["owner_link", "serve", "token_issue", "token_revoke"]


def serve(args: argparse.Namespace) -> int:
    """Run the query service until interrupted (``dpbudget serve``)."""
    import uvicorn

    from dpbudget.accountant.service.app import build_app
    from dpbudget.accountant.service.data import load_data
    from dpbudget.accountant.service.state import Held, RateLimit
    from dpbudget.accountant.values.errors import PrivacyError

    if (args.cert is None) != (args.key is None):
        raise PrivacyError("--cert and --key go together (TLS needs both)")
    public_url = args.public_url or _derived_url(args)
    tables = load_data(args.data)
    accountant = _open(args.policy, args.ledger)
    for name, registered in tables.items():  # (a typo in data.toml refuses to start)
        accountant.limit(registered.dataset)
    log = sys.stderr if args.log is None else open(args.log, "a", encoding="utf-8")
    app = build_app(Held(accountant, tables, RateLimit(args.rate, args.burst)),
                    public_url=public_url, max_body=args.max_body, time_limit=args.time_limit, log=log)
    uvicorn.run(app, host=args.host, port=args.port, ssl_certfile=args.cert,
                ssl_keyfile=args.key, workers=1, log_level="warning", access_log=False)
    return 0


def _derived_url(args: argparse.Namespace) -> str:
    """The URL owners reach ``--host``/``--port`` at, when no ``--public-url`` is given; refused
    for a wildcard address (no client reaches it by that name)."""
    from dpbudget.accountant.values.errors import PrivacyError

    if args.host in ("0.0.0.0", "::", ""):
        raise PrivacyError(f"--host {args.host or '(empty)'} is not a name clients reach: give "
                           "--public-url, the URL owners sign their requests for")
    host = f"[{args.host}]" if ":" in args.host else args.host
    return f"{'http' if args.cert is None else 'https'}://{host}:{args.port}"


def _open(policy_file: str, location: str) -> Any:
    """ONE accountant on the existing ledger ``location``, whose first record pins an owner key
    (a service has an owner: it revokes tokens, reads the status) and whose stored policy is
    ``policy_file``'s but for the tokens (issued and revoked by the owner since). A missing or
    empty ledger is refused, never created: serving one would leave it ownerless for good."""
    from dpbudget.accountant.gate import owner_key, policy_record
    from dpbudget.accountant.gate.accountant import Accountant
    from dpbudget.accountant.ledger import open_ledger
    from dpbudget.accountant.values.errors import PrivacyError
    from dpbudget.policies.policy import load_policy
    from dpbudget.policies.stored import differences, document

    given = load_policy(policy_file)
    init = (f"create it with `dpbudget policy apply {policy_file} LEDGER --init --owner-key "
            "owner.pem` first")
    try:
        ledger = open_ledger(location, create=False)
    except PrivacyError:
        raise PrivacyError(f"the ledger does not exist or cannot be opened: {init}") from None
    try:  # (this one ledger is the accountant's: checked here, never reopened by name)
        if policy_record.stored_document(ledger) is None:
            raise PrivacyError(f"the ledger holds no policy: {init}")
        if owner_key.pinned(policy_record._first(ledger)[0]) is None:
            raise PrivacyError("the ledger pins no owner key, so its tokens could never be "
                               "revoked: serve a ledger made with `dpbudget policy apply ... "
                               "--init --owner-key owner.pem`")
        stored, default = policy_record.stored_policy(ledger)
        changed = differences(_untokened(document(stored, default)),
                              _untokened(document(given, None)))
        if changed:
            raise PrivacyError(f"{policy_file} is not the policy stored in the ledger "
                               f"({'; '.join(changed[:3])}): apply it with `dpbudget policy "
                               "apply` first")
        return Accountant.open(ledger)
    except BaseException:
        ledger.close()
        raise


def _untokened(doc: Any) -> Any:
    """``doc`` without tokens, nor the ``[analysts.NAME]`` entries that only held tokens."""
    analysts = doc["policy"]["analysts"]
    for name, own in list(analysts.items()):
        if own.pop("tokens", None) is not None and all(v is None for v in own.values()):
            del analysts[name]
    return doc


def _stored(ledger: Any) -> Any:
    from dpbudget.accountant.gate import policy_record

    policy, default = policy_record.stored_policy(ledger)
    if default is not None:
        from dpbudget.accountant.values.errors import PrivacyError

        raise PrivacyError("the ledger's policy has a stored default limit: change it with "
                           "`dpbudget policy apply` first")
    return policy


def _change(args: argparse.Namespace, edit: Any, reason: str) -> Any:
    from dpbudget.accountant.gate import owner_key, policy_record
    from dpbudget.accountant.ledger import open_ledger

    owner = owner_key.from_env() if args.owner_key is None else owner_key.load(args.owner_key)
    with open_ledger(args.ledger, create=False) as ledger:
        policy = edit(_stored(ledger))
        return policy_record.replace(ledger, policy, by=args.by or policy_record.actor(),
                                     reason=args.reason or reason, owner=owner)


def token_issue(args: argparse.Namespace) -> int:
    """A new token for ``--analyst``: printed once, its hash written into the policy."""
    from dpbudget.accountant.service.tokens import new_token, with_token

    token, entry = new_token(int(time.time() + args.days * 86400))
    change = _change(args, lambda p: with_token(p, args.analyst, entry),
                     f"API token {entry.id} issued to {args.analyst}")
    print(f"token {entry.id} for {args.analyst}, valid {args.days:g} days (policy record "
          f"{change.seq}); shown once, give it to the analyst only:\n{token}")
    return 0


def owner_link(args: argparse.Namespace) -> int:
    """Print a link that opens the service's status page once, within 30 s."""
    from dpbudget.accountant.service.client import Owner

    print(Owner(args.url, args.owner_key, ledger=args.ledger).status_link())
    return 0


def token_revoke(args: argparse.Namespace) -> int:
    """Remove token ``ID`` from the policy: refused by the service from its next request."""
    from dpbudget.accountant.service.tokens import without_token

    change = _change(args, lambda p: without_token(p, args.id), f"API token {args.id} revoked")
    print(f"token {args.id} revoked (policy record {change.seq})")
    return 0


def add_commands(sub: Any) -> None:
    """The ``serve`` and ``token`` subcommands, added to ``dpbudget``'s parser."""
    serve_ = sub.add_parser("serve", help="run the query service (needs dpbudget[serve])",
                            description="Serve registered tables to analysts holding API "
                            "tokens: every query checked and debited by one accountant on "
                            "LEDGER under POLICY (docs/serving.md).")
    serve_.add_argument("--policy", required=True, help="the policy file (as stored in LEDGER)")
    serve_.add_argument("--ledger", required=True, help="the ledger URL or SQLite file")
    serve_.add_argument("--data", required=True, help="data.toml: the tables it serves")
    serve_.add_argument("--host", default="127.0.0.1")
    serve_.add_argument("--port", type=int, default=8000)
    serve_.add_argument("--public-url", metavar="URL", help="the URL owners reach the service "
                        "at, which their requests are signed for (default: http(s)://HOST:PORT)")
    serve_.add_argument("--cert", help="TLS certificate (PEM); with --key")
    serve_.add_argument("--key", help="TLS private key (PEM); with --cert")
    serve_.add_argument("--log", metavar="FILE", help="the request log (JSONL; default stderr)")
    serve_.add_argument("--max-body", type=int, default=65536, help="bytes (default 65536)")
    serve_.add_argument("--rate", type=float, default=20.0, help="requests a second per token "
                        "(default 20; per process)")
    serve_.add_argument("--burst", type=int, default=40, help="requests at once per token")
    serve_.add_argument("--time-limit", type=float, default=30.0, help="seconds per query "
                        "(default 30): past it nothing is released and the budget stays spent")
    serve_.set_defaults(func=serve)
    token = sub.add_parser("token", help="issue or revoke an analyst's API token (owner key)")
    actions = token.add_subparsers(dest="token_command", required=True)
    issue = actions.add_parser("issue", help="issue a token (printed once)")
    issue.add_argument("ledger")
    issue.add_argument("--analyst", required=True)
    issue.add_argument("--days", type=float, default=90.0, help="valid for (default 90)")
    issue.set_defaults(func=token_issue)
    revoke = actions.add_parser("revoke", help="revoke a token by its id")
    revoke.add_argument("ledger")
    revoke.add_argument("id")
    revoke.set_defaults(func=token_revoke)
    owner = sub.add_parser("owner", help="the owner's requests to a running service")
    owner_actions = owner.add_subparsers(dest="owner_command", required=True)
    link = owner_actions.add_parser("link", help="print a link that opens the status page "
                                    "once, within 30 s (signed with the owner key)")
    link.add_argument("url", help="the service's URL")
    link.add_argument("--owner-key", required=True, metavar="FILE", help="the owner's key file")
    link.add_argument("--ledger", required=True, metavar="ID", help="the ledger's identity, "
                      "as `dpbudget status LEDGER` prints it: a server on another is refused")
    link.set_defaults(func=owner_link)
    for parser in (issue, revoke):
        parser.add_argument("--owner-key", metavar="FILE", help="the owner's key file "
                            "(default: DPBUDGET_OWNER_KEY)")
        parser.add_argument("--by", help="who (recorded)")
        parser.add_argument("--reason", help="why (recorded)")
