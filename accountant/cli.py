"""The ``dpbudget`` command line (``--help`` lists its subcommands; ``serve``: the query service).

Exit status: 0 on success; 1 when ``policy check`` finds the policy invalid, 3 when it is valid
with warnings; 2 for bad usage or an unreadable ledger or policy; ``audit`` documents its own
problem bits (``dpbudget.accountant.audit.run``).

Each subcommand imports what it needs when it runs: ``--help`` and ``--version`` load argparse and
importlib.metadata only, not the ledger, pydantic or SciPy (benchmarks/startup.py measures it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpbudget.accountant.service.run import add_commands  # (serve, token: argparse only)
from dpbudget.accountant.values.errors import PolicyError, PrivacyError

if TYPE_CHECKING:
    from dpbudget.accountant.ledger import Ledger

__all__ = ["main"]


def _open_existing(location: str) -> Ledger:
    from dpbudget.accountant.ledger import open_ledger

    if "://" not in location and not Path(location).exists():
        raise PrivacyError(f"no ledger at {location!r}")
    return open_ledger(location, create=False)


def _status(args: argparse.Namespace) -> int:
    from dpbudget.accountant.gate import policy_record
    from dpbudget.accountant.audit.text import SIMULATION, STATUS_NOISE
    from dpbudget.accountant.audit.status import budget_rows, budget_table, check_states
    from dpbudget.policies.policy import load_policy

    with _open_existing(args.ledger) as ledger:
        default, source = None, args.policy
        if args.policy is not None:
            policy = load_policy(args.policy)
        elif policy_record.stored_document(ledger) is not None:
            policy, default = policy_record.stored_policy(ledger)
            source = "the policy stored in the ledger"
        else:
            policy = None  # a ledger from before stored policies: the recorded limits
        (seq, head), checked = ledger.head(), check_states(ledger)
        rows, identity = budget_rows(ledger, policy, default), getattr(ledger.entry(1), "hash", None)
        if args.json:
            out = {"ledger": ledger.url, "identity": identity, "records": seq, "head": head,
                   "accounts": rows, "states": checked, "simulation": ledger.simulation}
            if policy is not None:
                out["policy"] = source
            print(json.dumps(out, indent=2))
            return 0
        count = f"records numbered up to {seq}" if ledger.lanes else f"{seq} records"
        print(f"ledger {ledger.url}: {count}, head hash {head}, identity {identity}; {checked}")
        if ledger.simulation:
            print(SIMULATION)
        if policy is not None:
            print(f"reported against the limits of {source}")
        print(budget_table(ledger, policy, default))
        print(STATUS_NOISE)
        over = [r["account"] for r in rows if r.get("over_limit")]
        if over:
            print(f"{len(over)} account(s) have spent more than the policy now allows and "
                  f"refuse every release: {', '.join(over)}")
    return 0


def _policy_check(args: argparse.Namespace) -> int:
    import importlib

    from dpbudget.policies.accounts import policy_accounts
    from dpbudget.policies.policy import load_policy

    try:
        for module in args.imports or ():
            importlib.import_module(module)  # registers the custom mechanisms it defines
    except ImportError as exc:
        raise PrivacyError(f"cannot import {exc.name!r} (--import)") from None
    try:
        policy = load_policy(args.file)
        specs = policy_accounts(policy)
    except PolicyError as exc:
        print(f"{args.file}: invalid policy: {exc}", file=sys.stderr)
        return 1
    warnings = _contradictions(policy)
    print(f"{args.file}: valid policy, {len(policy.datasets)} dataset(s), {len(specs)} limit(s)")
    for spec in specs.values():
        limit = spec.rule.limit
        text = "no limit" if limit is None else f"ε={limit.epsilon:g}, δ={limit.delta:g}"
        window = "" if spec.period is None else f", renewed every {spec.period.text} (weaker " \
                                                  f"than a lifetime limit)"
        print(f"  {spec.key:<32} {spec.rule.name:<9} {text}{window}")
    for name, dataset in policy.datasets.items():
        extras = []
        if dataset.allowed_mechanisms is not None:
            extras.append(f"allowed mechanisms {list(dataset.allowed_mechanisms)}")
        if dataset.max_per_query is not None:
            extras.append(f"max per query {dataset.max_per_query}")
        if dataset.other_analysts == "deny":
            extras.append("unlisted analysts denied")
        if extras:
            print(f"  dataset {name}: " + "; ".join(extras))
    if policy.other_analysts == "deny":
        print("  analysts not listed in [analysts] are denied on every dataset")
    other = policy.other_datasets
    if other is None:
        print("  datasets not listed are refused")
    else:
        limit = other.limit
        text = "no limit" if limit is None else f"ε={limit.epsilon:g}, δ={limit.delta:g}"
        print(f"  datasets not listed: each gets a budget of its own ({other.composition}, "
              f"{text})")
    for text in warnings:
        print(f"  warning: {text}")
    return 3 if warnings else 0


def _contradictions(policy: Any) -> list[str]:
    """What ``policy check`` warns of beyond validity (``load_policy`` runs every validity check,
    ``dpbudget.policies.limits.mechanism_problem`` among them): settings that can never matter, or that
    another limit makes moot (a cap above its limit, an analyst limit above the dataset's), and
    custom mechanism names left unchecked because their module is not imported (``--import``)."""
    from dpbudget.policies.limits import unchecked_mechanism

    warnings = []
    for name, dataset in policy.datasets.items():
        where = f"datasets.{name}"
        for i, mechanism in enumerate(dataset.allowed_mechanisms or ()):
            if unchecked_mechanism(mechanism):
                warnings.append(f"{where}.allowed_mechanisms.{i}: {mechanism!r} not checked: "
                                f"its module is not imported (name it with --import)")
        limit, cap = dataset.limit, dataset.max_per_query
        if limit is not None and cap is not None and (
                (cap.epsilon is not None and cap.epsilon > limit.epsilon)
                or (cap.delta is not None and cap.delta > limit.delta)):
            warnings.append(f"{where}.max_per_query {cap} is above the limit {limit}: the limit "
                            "refuses such a release anyway")
        for who, own in dataset.analysts.items():
            if limit is not None and own.limit is not None and not own.limit <= limit:
                warnings.append(f"{where}.analysts.{who}.limit {own.limit} is above the "
                                f"dataset's limit {limit}: the dataset's limit binds first")
    return warnings


def _policy_apply(args: argparse.Namespace) -> int:
    from dpbudget.accountant.gate import owner_key, policy_record
    from dpbudget.accountant.ledger import open_ledger
    from dpbudget.policies.policy import load_policy
    from dpbudget.policies.stored import document

    policy = load_policy(args.file)
    owner = owner_key.from_env() if args.owner_key is None else owner_key.load(args.owner_key)
    if args.init:  # a new ledger whose first record pins the owner key
        if owner is None:
            raise PrivacyError("--init needs the owner key (--owner-key, or DPBUDGET_OWNER_KEY)")
        with open_ledger(args.ledger) as ledger:
            if ledger.head()[0]:
                raise PrivacyError(f"--init: {args.ledger!r} is not a new, empty ledger")
            policy_record.enforce(ledger, document(policy, None), owner=owner,
                                  by=args.by or policy_record.actor())
        print(f"{args.ledger}: created; its first record pins the owner key {owner.public}")
        return 0
    with _open_existing(args.ledger) as ledger:  # a typo must not create a new ledger
        change = policy_record.replace(ledger, policy, by=args.by or policy_record.actor(),
                                       reason=args.reason, owner=owner)
    print(f"{args.ledger}: policy record {change.seq} written, {len(change.changes)} change(s)")
    for line in change.changes:
        print(f"  {line}")
    if change.raised:
        print("WARNING: this policy grants more than the one it replaces, which weakens the "
              "privacy guarantee of everything released under this ledger:")
        for line in change.raised:
            print(f"  {line}")
    return 0


def _keys_new(args: argparse.Namespace) -> int:
    from dpbudget.accountant.gate.owner_key import new_key_file

    public = new_key_file(args.file)  # the private key goes to the file only, never to output
    print(f"{args.file}: new owner key written (mode 0600; keep it off the analysts' machines "
          f"and out of the ledger's directory)\npublic key: {public}")
    return 0


def _policy_schema(args: argparse.Namespace) -> int:
    from dpbudget.policies.policy import policy_schema

    print(json.dumps(policy_schema(), indent=2))
    return 0


def _audit(args: argparse.Namespace) -> int:
    from dpbudget.accountant.audit.run import audit
    from dpbudget.accountant.audit.text import audit_text

    source = args.source[0] if len(args.source) == 1 else args.source
    report = audit(source, args.policy, since=args.since, until=args.until,
                   expected_head=args.expect_head,
                   plot=args.plot is not None or args.blocks_plot is not None,
                   complete=args.complete)
    if args.plot is not None:
        from dpbudget.accountant.audit.plot import plot_audit

        plot_audit(report, args.plot)
    if args.blocks_plot is not None:
        from dpbudget.accountant.audit.plot_blocks import plot_blocks

        if not plot_blocks(report, args.blocks_plot):
            print(f"{args.blocks_plot}: not written (no block was charged)", file=sys.stderr)
    if args.json:
        print(report.model_dump_json(indent=2, exclude={"accounts": {"__all__": {"series"}}}))
    else:
        print(audit_text(report, args.plot))
    return report.exit_status


def _export(args: argparse.Namespace) -> int:
    from dpbudget.accountant.audit.transfer import export_jsonl

    with _open_existing(args.ledger) as ledger:
        n = export_jsonl(ledger, args.out)
        seq, head = ledger.head()
    print(f"exported {n} records to {args.out}; head {seq} {head}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from dpbudget.accountant.ledger import open_ledger
    from dpbudget.accountant.audit.transfer import import_jsonl

    with open_ledger(args.ledger) as ledger:
        n = import_jsonl(args.jsonl, ledger)
    print(f"imported {n} records into {args.ledger}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from dpbudget.examples.demo import main as demo_main
    return int(demo_main(args.demo_args))


_EXIT_HELP = """exit status:
  0    the chain verifies, replay and stored state agree, no limit was exceeded
  otherwise the sum of one bit per kind of problem found:
  1    time       a record's time runs backwards, is in the future (over an hour after the
                  audit's clock), or falls outside a window or block it charges
  4    policy     a policy record unsigned, or not signed by the owner's pinned key
  8    chain      a record was edited, deleted, inserted or reordered; also head (the tail
                  was cut: not the expected head) and malformed (a record or line could not
                  be read)
  16   release    seeded noise on a ledger not created for simulation, or a custom mechanism
                  recorded under a library mechanism's name
  32   state      a stored state disagrees with the replay
  64   limit      a release was admitted that its limit should have refused, or charged
                  other accounts than its plan (another analyst's quota, say)
  128  auth       records not verifiable as HMAC-keyed (missing key, or unkeyed)
  2    bad usage, or a source that cannot be read"""


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("dpbudget")
    except metadata.PackageNotFoundError:  # pragma: no cover - a checkout, not installed
        return "0+unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dpbudget", description="Hard privacy budgets around data analysis.")
    parser.add_argument("--version", action="version", version=f"dpbudget {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    # The demo parses its own options (--ledger, --seed, --help).
    demo = sub.add_parser("demo", help="run the bundled example pipeline on an SQLite ledger",
                          add_help=False)
    demo.set_defaults(func=_demo)
    status = sub.add_parser("status", help="spent and remaining budget per dataset",
                            description="Spent and remaining budget of every account of a "
                            "ledger, against the policy stored in it; a dataset the policy does "
                            "not list, charged under its default limit, is marked 'new dataset' "
                            "(a misspelt name shows so). Human output rounds for reading; --json "
                            "keeps the exact values.")
    status.add_argument("ledger", help="ledger file or URL (sqlite:///..., postgresql://...)")
    status.add_argument("--json", action="store_true", help="machine-readable output, exact "
                        "values (not rounded)")
    status.add_argument("--policy", metavar="FILE",
                        help="report against this policy file's limits instead of the policy "
                        "stored in the ledger, marking accounts over them")
    status.set_defaults(func=_status)
    aud = sub.add_parser(
        "audit", help="replay and verify a ledger or JSONL export/log",
        description="Verify the hash chain, replay every debit and compare it with the stored "
        "state, check each release against the policy in force, and report.",
        epilog=_EXIT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    aud.add_argument("source", nargs="+", help="ledger file/URL, or JSONL files (exports, or "
                     "per-process logs, merged in record order)")
    aud.add_argument("--policy", help="also check the limits of this policy file")
    aud.add_argument("--json", action="store_true", help="machine-readable report")
    aud.add_argument("--plot", metavar="PNG", help="write cumulative spend per account (needs "
                     "matplotlib)")
    aud.add_argument("--blocks-plot", metavar="PNG", help="write a heat map of per-block spend "
                     "(blocks x time) for datasets divided into blocks (needs matplotlib)")
    aud.add_argument("--since", help="tally only records at or after this ISO 8601 time")
    aud.add_argument("--until", help="tally and replay only up to this ISO 8601 time")
    aud.add_argument("--expect-head", metavar="HASH", help="the head hash kept elsewhere; a "
                     "different end means a truncated or rewritten tail")
    aud.add_argument("--complete", action="store_true", help="the JSONL must hold every record "
                     "(an export): a record absent from it is reported as deleted")
    aud.set_defaults(func=_audit)
    exp = sub.add_parser("export", help="write a ledger's records as JSONL",
                         description="Write every record of a ledger, hash chain intact, as "
                         "JSON Lines: for archives, auditors and `dpbudget import`.")
    exp.add_argument("ledger", help="the ledger (file or URL)")
    exp.add_argument("out", help="the JSONL file to write")
    exp.set_defaults(func=_export)
    imp = sub.add_parser("import", help="load a verified JSONL export into a new ledger",
                         description="Verify a JSONL export (chain and replay) and load it into "
                         "a new, empty ledger, which then continues the same chain.")
    imp.add_argument("jsonl", help="the JSONL export to load")
    imp.add_argument("ledger", help="the new ledger (file or URL); must be empty")
    imp.set_defaults(func=_import)
    policy = sub.add_parser("policy", help="check a policy file, or print its JSON Schema")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    check = policy_sub.add_parser(
        "check", help="validate a policy file and summarise it",
        description="Validate a policy file, summarise its limits, and report contradictions.",
        epilog="exit status: 0 valid; 3 valid with warnings (a per-query cap above its limit, an "
        "analyst limit above the dataset's, a custom mechanism whose module is not imported); "
        "1 invalid (a malformed file, an unknown key, a mechanism name no mechanism has: the "
        "checks load_policy and Accountant.from_policy make too); 2 bad usage.")
    check.add_argument("file", help="policy file (.toml or .json)")
    check.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                       help="import MODULE first, so that the custom mechanisms it defines are "
                       "known, each as MODULE.Class (repeatable)")
    check.set_defaults(func=_policy_check)
    apply_ = policy_sub.add_parser(
        "apply", help="replace the policy stored in a ledger with FILE's, as one audited record "
        "naming who and why (lowering always works; raising is recorded as a weaker guarantee)")
    apply_.add_argument("file", help="policy file (.toml or .json)")
    apply_.add_argument("ledger", help="the ledger (file or URL)")
    apply_.add_argument("--reason", help="why the policy changes (recorded; required but with "
                        "--init)")
    apply_.add_argument("--by", help="who changes it (recorded; default: DPBUDGET_ACTOR or the "
                        "OS user)")
    apply_.add_argument("--owner-key", metavar="FILE", help="the ledger owner's private key file "
                        "(`dpbudget keys new`), whose public key the ledger's first record pins; "
                        "default: the file DPBUDGET_OWNER_KEY names")
    apply_.add_argument("--init", action="store_true", help="create LEDGER (new, empty) with "
                        "FILE as its policy, pinning the owner key: only policy records signed "
                        "with it can change the policy later")
    apply_.set_defaults(func=_policy_apply)
    keys = sub.add_parser("keys", help="the ledger owner's signing key")
    new = keys.add_subparsers(dest="keys_command", required=True).add_parser(
        "new", help="write a new owner key (Ed25519, PEM) to FILE, mode 0600, never overwritten "
        "and never printed, and print its public key (needs dpbudget[owner])")
    new.add_argument("file", help="where to write the private key (must not exist)")
    new.set_defaults(func=_keys_new)
    schema = policy_sub.add_parser("schema", help="print the JSON Schema of policy files")
    schema.set_defaults(func=_policy_schema)
    add_commands(sub)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        args.demo_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if getattr(args, "policy_command", "") == "apply" and not args.init and not args.reason:
        parser.error("policy apply: the following arguments are required: --reason")
    try:
        return int(args.func(args))
    except PrivacyError as exc:
        where = f"{exc.file}: " if isinstance(exc, PolicyError) and exc.file else ""
        print(f"dpbudget {args.command}: {where}{exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an output file in a missing folder, a full disk, no permission
        print(f"dpbudget {args.command}: cannot write or read a file: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a damaged file read back as values of the wrong shape
        if args.command not in ("audit", "status") or not isinstance(exc, _DAMAGE) and type(
                exc).__module__.split(".")[0] not in ("sqlite3", "psycopg"):  # (its own errors)
            raise
        print(f"dpbudget {args.command}: the ledger is damaged ({type(exc).__name__}); nothing "
              "was written. Keep a copy; audit it or restore it from a backup", file=sys.stderr)
        return 2


# What reading a damaged ledger raises, named by type only (its text may quote the file).
_DAMAGE = (ValueError, TypeError, LookupError, AttributeError, RecursionError)


if __name__ == "__main__":
    raise SystemExit(main())
