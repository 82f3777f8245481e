"""The ``dpbudget`` command line: ``demo``, ``status``, ``policy check``, ``policy schema``.

Exit status: 0 on success; 1 when ``policy check`` finds the policy invalid; 2 for bad usage or
an unreadable ledger or policy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from accountant.errors import PolicyError, PrivacyError
from accountant.ledger import open_ledger
from accountant.report import budget_rows, budget_table
from policies.accounts import policy_accounts
from policies.policy import load_policy, policy_schema

__all__ = ["main"]


def _open_existing(location: str):
    if "://" not in location and not Path(location).exists():
        raise PrivacyError(f"no ledger at {location!r}")
    return open_ledger(location)


def _status(args: argparse.Namespace) -> int:
    policy = None if args.policy is None else load_policy(args.policy)
    with _open_existing(args.ledger) as ledger:
        seq, head = ledger.head()
        if args.json:
            out = {"ledger": ledger.url, "records": seq, "head": head,
                   "accounts": budget_rows(ledger, policy)}
            if policy is not None:
                out["policy"] = args.policy
            print(json.dumps(out, indent=2))
            return 0
        print(f"ledger {ledger.url}: {seq} records, head hash {head}")
        if policy is not None:
            print(f"reported against the limits of the policy {args.policy}")
        print(budget_table(ledger, policy))
        if policy is not None:
            over = [r["account"] for r in budget_rows(ledger, policy) if r["over_limit"]]
            if over:
                print(f"{len(over)} account(s) have spent more than the policy now allows and "
                      f"refuse every release: {', '.join(over)}")
    return 0


def _policy_check(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.file)
        specs = policy_accounts(policy)
    except PolicyError as exc:
        print(f"{args.file}: invalid policy: {exc}", file=sys.stderr)
        return 1
    print(f"{args.file}: valid policy, {len(policy.datasets)} dataset(s), {len(specs)} limit(s)")
    for spec in specs.values():
        limit = spec.rule.limit
        text = "no limit" if limit is None else f"ε={limit.epsilon:g}, δ={limit.delta:g}"
        window = "" if spec.period is None else f", renewed every {spec.period.text} (weaker " \
                                                  f"than a lifetime limit)"
        print(f"  {spec.key:<32} {spec.rule.name:<9} {text}{window}")
    known = _mechanism_names()
    for name, limit in policy.datasets.items():
        extras = []
        if limit.allowed_mechanisms is not None:
            extras.append(f"allowed mechanisms {list(limit.allowed_mechanisms)}")
            unknown = [m for m in limit.allowed_mechanisms if m not in known]
            if unknown:
                print(f"  warning: datasets.{name}.allowed_mechanisms names {unknown}, which "
                      f"this installation does not provide (they admit nothing)")
        if limit.max_per_query is not None:
            extras.append(f"max per query {limit.max_per_query}")
        if limit.other_analysts == "deny":
            extras.append("unlisted analysts denied")
        if extras:
            print(f"  dataset {name}: " + "; ".join(extras))
    if policy.other_analysts == "deny":
        print("  analysts not listed in [analysts] are denied on every dataset")
    return 0


def _mechanism_names() -> set[str]:
    import mechanisms
    from mechanisms.base import Mechanism

    names, todo = set(), [Mechanism]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names | set(mechanisms.__all__)


def _policy_schema(args: argparse.Namespace) -> int:
    print(json.dumps(policy_schema(), indent=2))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from dpbudget_examples.demo import main as demo_main

    return demo_main(args.demo_args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dpbudget", description="Hard privacy budgets around data analysis.")
    sub = parser.add_subparsers(dest="command", required=True)
    # The demo parses its own options (--ledger, --seed, --help).
    demo = sub.add_parser("demo", help="run the bundled example pipeline on an SQLite ledger",
                          add_help=False)
    demo.set_defaults(func=_demo)
    status = sub.add_parser("status", help="spent and remaining budget per dataset")
    status.add_argument("ledger", help="ledger file or URL (sqlite:///..., postgresql://...)")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--policy", metavar="FILE",
                        help="report against this policy's limits, marking accounts over them")
    status.set_defaults(func=_status)
    policy = sub.add_parser("policy", help="check a policy file, or print its JSON Schema")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    check = policy_sub.add_parser("check", help="validate a policy file and summarise it "
                                  "(exit 0 when valid, 1 when not)")
    check.add_argument("file", help="policy file (.toml or .json)")
    check.set_defaults(func=_policy_check)
    schema = policy_sub.add_parser("schema", help="print the JSON Schema of policy files")
    schema.set_defaults(func=_policy_schema)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        args.demo_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.func(args)
    except PrivacyError as exc:
        where = f"{exc.file}: " if isinstance(exc, PolicyError) and exc.file else ""
        print(f"dpbudget {args.command}: {where}{exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
