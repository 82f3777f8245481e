"""How an ``Accountant`` is opened: from arguments, a policy file or a ledger's stored policy, and
how a policy is replaced (``apply_policy``). The releasing API is ``dpbudget.accountant.gate.accountant``.

Invariant: every way of opening builds one ``Planner`` and one ``Gate`` and checks the ledger
(continuity, the stored policy) before the accountant is returned; nothing is released here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from dpbudget.accountant.gate import owner_key as owner_keys
from dpbudget.accountant.gate import policy_record
from dpbudget.accountant.gate.continuity import refuse_raised
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidTypeError
from dpbudget.accountant.gate.gate import Gate
from dpbudget.accountant.ledger import Ledger, MemoryLedger, open_ledger
from dpbudget.accountant.gate.planner import Planner
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.policy import Policy, load_policy, validated
from dpbudget.policies.stored import POLICY_KEY, document

__all__ = ["Opening"]


class Opening:
    """The constructors and policy handling the ``Accountant`` inherits."""

    _gate: Gate
    _policy: Policy
    _default: DatasetLimit | None

    @classmethod
    def from_policy(cls, path: "str | os.PathLike[str] | Policy", *,
                    ledger: Ledger | str | None = None, rng: Any = None,
                    clock: Callable[[], float] | None = None,
                    owner_key: "owner_keys.OwnerKey | str | os.PathLike[str] | None" = None,
                    simulation: bool = False) -> Any:
        """An accountant enforcing a policy file (TOML or JSON; see ``dpbudget.policies.policy``).

        Every release is checked, before anything is drawn, against: the datasets' allowed
        mechanisms, their per-query caps, and every limit that applies to it — the global
        limit, each dataset's, the analyst's on each dataset, the analyst's across datasets —
        all debited in one ledger transaction, or none.

        Who is held to which limit (analysts not listed, joins, windows) is documented in
        ``dpbudget.accountant.gate.planner``, with what happens when a policy changes under an existing ledger.

        Args:
            path: the policy file, or a ``Policy`` (checked again, as a file is).
            ledger: as for ``Accountant``.
            rng: as for ``Accountant``.
            clock: for an in-memory ledger only (tests, simulations): seconds since the epoch
                (default ``time.time``), the time of its debits — their renewal windows, blocks
                and unlock shares. A durable ledger keeps its own time (the server's on
                PostgreSQL; on SQLite this process's wall clock, never earlier than its last
                record's), which its records carry and the audit checks.
            owner_key: as for ``Accountant``: the owner's private key file, for a new ledger
                whose policy ``apply_policy`` may change later.
            simulation: as for ``Accountant``.

        Raises:
            PolicyError: a malformed policy file, naming the key path; nothing was opened.
            InvalidArgumentError: ``clock`` given with a durable ledger; nothing was opened.
            LedgerConflictError: the ledger holds an account under another rule or period.

        >>> import tempfile, pathlib
        >>> from dpbudget.accountant import Accountant
        >>> from dpbudget.mechanisms import Laplace
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "policy.toml"
        >>> _ = f.write_text('''
        ... [datasets.adult]
        ... limit = { epsilon = 1.0 }
        ... [datasets.adult.analysts.alice]
        ... limit = { epsilon = 0.3 }
        ... ''')
        >>> acc = Accountant.from_policy(f, rng=0)
        >>> _ = acc.release(Laplace(0.25, sensitivity=1.0), 10.0, dataset="adult", analyst="alice")
        >>> acc.remaining("adult", analyst="alice")
        Budget(epsilon=0.04999999999999999, delta=0.0)
        >>> acc.can_afford(Laplace(0.25, sensitivity=1.0), dataset="adult", analyst="alice")
        False
        >>> acc.can_afford(Laplace(0.25, sensitivity=1.0), dataset="adult", analyst="bob")
        True
        """
        # A Policy object passes the same checks as a file (policies.policy.validated).
        policy = validated(path) if isinstance(path, Policy) else load_policy(path)  # type: ignore[arg-type]
        acc = cls.__new__(cls)
        acc._setup(policy, None, ledger, rng, clock, owner_key, simulation)
        return acc

    @classmethod
    def open(cls, ledger: Ledger | str, *, rng: Any = None,
             clock: Callable[[], float] | None = None, simulation: bool = False) -> Any:
        """An accountant enforcing the policy stored in ``ledger`` (the one its creator set, or
        the latest ``apply_policy``): no limits are passed, so none can be raised by opening.
        ``rng`` and ``simulation`` as for ``Accountant``: a seed needs ``simulation=True``, which
        only a ledger created for simulation accepts.

        ``clock``: as for ``from_policy`` (an in-memory ledger only).

        Raises:
            InvalidArgumentError: ``clock`` given with a durable ledger; nothing was opened.
            LedgerError: the ledger cannot be opened, or stores no policy (one created before
                policies were stored: open it once with its limits, which records them).
            LedgerCorruptedError: the stored policy was edited outside dpbudget.

        >>> import tempfile, pathlib
        >>> from dpbudget.accountant import Accountant, Budget
        >>> url = f"sqlite:///{pathlib.Path(tempfile.mkdtemp()) / 'b.db'}"
        >>> Accountant(Budget(2.0), ledger=url).close()
        >>> acc = Accountant.open(url)
        >>> acc.remaining("people")
        Budget(epsilon=2.0, delta=0.0)
        >>> acc.close()
        """
        _check_clock(clock, ledger)
        _refuse_seed(ledger, Sampler(rng), simulation)  # before anything is opened
        policy, default = policy_record.stored_policy(ledger)
        acc = cls.__new__(cls)
        acc._setup(policy, default, ledger, rng, clock, None, simulation)
        return acc

    def apply_policy(self, policy: "str | os.PathLike[str] | Policy", *, by: str,
                     reason: str, owner_key: "owner_keys.OwnerKey | str | os.PathLike[str] | None"
                     = None) -> policy_record.PolicyChange:
        """Replace the limits stored in this accountant's ledger with ``policy``'s (a policy file
        or ``Policy``), as one audited record naming ``by`` and ``reason``, signed with
        ``owner_key`` (the private key file whose public key the ledger's first record pins: a
        ledger created with ``owner_key=``), and enforce them from now on. Lowering a limit
        always works; a change that grants more (``raised`` in the result is non-empty) weakens
        the guarantee and is recorded as such. Spend already recorded stays: a limit below it
        simply refuses every further release.

        Raises:
            OwnerKeyError: no owner key, another key than the pinned one, or a ledger created
                without one (its policy cannot change); nothing was written.
            PolicyError: a malformed policy file; nothing was written.
            LedgerConflictError: the new policy gives an account another composition rule or
                renewal window than its recorded spend; nothing was written.
        """
        new = validated(policy) if isinstance(policy, Policy) else load_policy(policy)  # type: ignore[arg-type]
        gate = self._gate
        owner = None if owner_key is None else owner_keys.load(owner_key)
        change = policy_record.replace(gate.ledger, new, by=by, reason=reason, owner=owner)
        self._policy, self._default = new, None
        self._gate = Gate(gate.ledger, Planner(new, None, gate.planner.analyst), gate.sampler)
        self._gate.policy_seq = change.seq
        return change

    def _setup(self, policy: Policy, default: DatasetLimit | None, ledger: Any, rng: Any,
               clock: Callable[[], float] | None,
               owner_key: "owner_keys.OwnerKey | str | os.PathLike[str] | None" = None,
               simulation: bool = False) -> None:
        _check_clock(clock, ledger)
        owner = None if owner_key is None else owner_keys.load(owner_key)
        self._policy = policy
        planner = Planner(policy, default)
        sampler = Sampler(rng)
        _refuse_seed(ledger, sampler, simulation)
        opened = open_ledger(ledger)
        planner.analyst = opened.authenticated_analyst  # (read once: not the caller's to name)
        if clock is not None:
            opened.clock = clock  # type: ignore[attr-defined]  # (a MemoryLedger: _check_clock)
        self._gate = Gate(opened, planner, sampler)
        self._default = default
        try:
            self._gate.check_ledger()
            # An in-memory ledger cannot be reopened by anyone else: it records a policy only
            # when given an owner key, and is then held to it like any other.
            if opened.durable or owner is not None or opened.account(POLICY_KEY) is not None:
                self._gate.policy_seq = policy_record.enforce(
                    opened, document(policy, default), by=policy_record.actor(),
                    adopting=lambda: refuse_raised(opened, planner), owner=owner,
                    simulation=simulation and opened.durable)
        except BaseException:
            if not isinstance(ledger, Ledger):  # ours to close; a caller's ledger stays open
                opened.close()
            raise

    @property
    def policy(self) -> Policy:
        """The policy enforced (for an accountant built from arguments: its dataset limits)."""
        return self._policy

    @property
    def ledger(self) -> Ledger:
        return self._gate.ledger


def _refuse_seed(ledger: Any, sampler: Sampler, simulation: bool) -> None:
    """Refuse a seeded ``rng`` on a durable ledger unless the caller says it is a simulation
    (``simulation=True``, which ``policy_record.enforce`` then holds the ledger's first record
    to). Anyone who knows a seed subtracts the noise it drew: on a ledger that outlives the
    process, its releases would be recorded as spent while protecting no one. Checked before
    anything is opened; an in-memory ledger takes seeds (tests, examples)."""
    if not isinstance(simulation, bool):
        raise InvalidTypeError("simulation", simulation, "a bool")
    durable = ledger.durable if isinstance(ledger, Ledger) else ledger not in (None, "memory://")
    if durable and not simulation and not sampler.is_cryptographic:
        raise InvalidArgumentError(
            "rng", "a seed", "None (the OS CSPRNG) on a durable ledger: anyone who knows a seed "
            "subtracts its noise", "Nothing was opened or written. Pass simulation=True to "
            "create (or open) a ledger for simulation, which says so in its first record")


def _check_clock(clock: Any, ledger: Any) -> None:
    """Refuse a ``clock`` unless the ledger is in memory (``None``, ``"memory://"`` or a
    ``MemoryLedger``), before anything is opened: a durable ledger keeps its own time, and a
    caller that chose it would choose its renewal windows and unlock shares (ε a day, spent
    every second).

    Raises:
        InvalidTypeError: ``clock`` is not callable.
        InvalidArgumentError: ``clock`` given with a durable ledger.
    """
    if clock is None:
        return
    if not callable(clock):
        raise InvalidTypeError("clock", clock, "a callable returning seconds since the epoch")
    if not (ledger is None or ledger == "memory://" or isinstance(ledger, MemoryLedger)):
        raise InvalidArgumentError(
            "clock", "given", "omitted with a durable ledger (it keeps its own "
            "time: the server's, or this process's wall clock never earlier than its last "
            "record's); a clock is for an in-memory ledger (tests, simulations)",
            "nothing was opened")
