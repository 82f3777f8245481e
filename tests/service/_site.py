"""A query service site for the tests: a table, a policy with tokens, an owner key, a ledger —
and the real server (``dpbudget serve`` under uvicorn) started in a subprocess on a free loopback
port, stopped (or killed) by the test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

POLICY = """
[datasets.visits]
limit = { epsilon = 10.0, delta = 1e-5 }
privacy_unit = "pid"
bounds = { max_rows_per_unit = 10, max_groups_per_unit = 3, max_rows_per_group = 5 }
[datasets.visits.analysts.{alice}]
limit = { epsilon = 0.3 }
[datasets.visits.analysts.bob]
limit = { epsilon = 5.0 }
"""
FAR = 4_000_000_000  # an expiry (Unix s) far ahead; 1 (1970) is long past


class Site(NamedTuple):
    folder: Path
    ledger: str
    key: Path
    tokens: dict[str, str]  # who -> token ("alice", "bob", "expired")
    identity: str  # the ledger's (its first record's hash): what the owner pins


def make_site(folder: Path, ledger: str | None = None, alice: str = "alice") -> Site:
    """The files of a site; the ledger created with the policy, its tokens and the owner key."""
    from dpbudget.accountant.gate.accountant import Accountant
    from dpbudget.accountant.gate.owner_key import new_key_file
    from dpbudget.accountant.service.tokens import new_token, with_token
    from dpbudget.policies.policy import parse_policy

    rng = np.random.default_rng(7)
    n = 3000
    pd.DataFrame({"pid": rng.integers(0, 600, n), "city": rng.choice(["a", "b", "c"], n),
                  "amount": rng.uniform(0.0, 100.0, n)}).to_parquet(folder / "visits.parquet")
    (folder / "data.toml").write_text('[tables.visits]\ndataset = "visits"\n'
                                      'source = "visits.parquet"\n')
    text = POLICY.replace("{alice}", alice)
    (folder / "policy.toml").write_text(text)
    key = folder / "owner.pem"
    new_key_file(key)
    policy, tokens = parse_policy(text, "toml"), {}
    for who, analyst, expires in ((alice, alice, FAR), ("bob", "bob", FAR),
                                  ("expired", alice, 1)):
        tokens[who], entry = new_token(expires)
        policy = with_token(policy, analyst, entry)
    url = ledger or f"sqlite:///{folder / 'ledger.db'}"
    with Accountant.from_policy(policy, ledger=url, owner_key=key) as acc:
        first = acc.ledger.entry(1)
    assert first is not None
    return Site(folder, url, key, tokens, first.hash)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(site: Site, *extra: str) -> Iterator[tuple[str, subprocess.Popen[Any]]]:
    """``dpbudget serve`` on ``site``: (its URL, its process), its request log in
    ``site.folder / "requests.jsonl"``."""
    port = free_port()
    cmd = [sys.executable, "-m", "dpbudget.accountant.cli", "serve", "--policy",
           str(site.folder / "policy.toml"), "--ledger", site.ledger, "--data",
           str(site.folder / "data.toml"), "--port", str(port), "--log",
           str(site.folder / "requests.jsonl"), *extra]
    err = open(site.folder / "server.err", "w")
    proc = subprocess.Popen(cmd, stdout=err, stderr=err, env={**os.environ})
    try:
        for _ in range(600):  # (up to a minute on a busy machine)
            if proc.poll() is not None:
                raise RuntimeError("the server exited: "
                                   + (site.folder / "server.err").read_text())
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("the server did not start")
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        err.close()


def head(ledger: str) -> tuple[int, str]:
    """The ledger's (seq, hash) head, read by a fresh connection."""
    from dpbudget.accountant.ledger import open_ledger

    with open_ledger(ledger, create=False) as opened:
        return opened.head()
