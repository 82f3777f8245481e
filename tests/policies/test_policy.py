"""``Policy`` (``policies.policy``): TOML and JSON files, every key, and malformed files →
PolicyError naming the key path, with nothing opened, drawn or debited; one validator shared by
``load_policy``, ``Accountant.from_policy`` and ``dpbudget policy check`` (issue 30). The policy
on the command line (``policy check``, ``policy schema``, ``status --policy``, the demo) is
tested with the command line, in tests/test_cli.py."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path

import pytest

from dpbudget.accountant import (
    Accountant, Budget, InvalidArgumentError, InvalidTypeError, PolicyError,
)
from dpbudget.accountant.cli import main
from dpbudget.accountant.ledger import MemoryLedger
from dpbudget.accountant.values.errors import MechanismNotAllowedError
from dpbudget.mechanisms import Laplace
from dpbudget.policies import AnalystLimit, Cap, DatasetLimit, Period, limits as policy_limits
from dpbudget.policies.policy import Policy, load_policy, policy_schema
from dpbudget.policies.stored import document, from_document
from tests.support import HALVER_MODULE

FULL = """
    limit = { epsilon = 10.0, delta = 1e-5 }
    composition = "basic"
    period = "30d"
    other_analysts = "allow"

    [datasets.adult]
    limit = { epsilon = 3.0, delta = 1e-6 }
    composition = "basic"
    per_query = { epsilon = 1.0, delta = 1e-6 }
    max_per_query = { epsilon = 0.5 }
    allowed_mechanisms = ["Laplace", "AnalyticGaussian", "Sparse", "Exponential"]
    other_analysts = "deny"
    period = "1d"

    [datasets.adult.analysts.alice]
    limit = { epsilon = 1.0, delta = 1e-7 }

    [datasets.adult.analysts.carol]
    limit = { epsilon = 0.5 }
    period = "1h"

    [datasets.census]

    [analysts.bob]
    limit = { epsilon = 2.0 }
"""


def test_every_key_loads_from_toml(write):
    p = load_policy(write(FULL))
    assert p.limit == Budget(10.0, 1e-5) and p.period == "30d"
    adult = p.datasets["adult"]
    assert adult.limit == Budget(3.0, 1e-6)
    assert adult.max_per_query == Cap(epsilon=0.5) and adult.max_per_query.delta is None
    assert adult.allowed_mechanisms == ("Laplace", "AnalyticGaussian", "Sparse", "Exponential")
    assert adult.other_analysts == "deny" and adult.window() == Period("1d")
    assert adult.analysts["alice"].limit == Budget(1.0, 1e-7)
    assert adult.analysts["alice"].composition is None  # inherits the dataset's
    assert p.datasets["census"].limit is None  # no limit: spend is still recorded
    assert p.analysts["bob"].limit == Budget(2.0)


def test_json_is_the_same_policy(write):
    import tomllib
    import textwrap

    data = tomllib.loads(textwrap.dedent(FULL))
    assert load_policy(write(data, ".json")) == load_policy(write(FULL))


def test_policy_is_frozen(write):
    p = load_policy(write(FULL))
    with pytest.raises(Exception):
        p.limit = None  # type: ignore[misc]
    assert isinstance(p.datasets["adult"].allowed_mechanisms, tuple)


def test_from_policy_accepts_a_policy_object(write):
    acc = Accountant.from_policy(load_policy(write(FULL)))
    assert acc.policy.datasets["adult"].limit == Budget(3.0, 1e-6)


MALFORMED_TOML = [
    # (file text, key path, words in the message)
    ('[datasets.adult]\nlimit = { epsilon = -1 }', "datasets.adult.limit.epsilon",
     "must be a finite number >= 0 (or inf for no limit); got -1"),
    ('[datasets.adult]\nlimit = { epsilon = nan }', "datasets.adult.limit.epsilon", "got nan"),
    ('[datasets.adult]\nlimit = { epsilon = 1.0, delta = -1e-6 }',
     "datasets.adult.limit.delta", "must be a number in [0, 1); got -1e-06"),
    ('[datasets.adult]\nlimit = { epsilon = 1.0, delta = 1.0 }', "datasets.adult.limit.delta",
     "got 1.0"),
    ('[datasets.adult]\nlimit = { epsilon = "1.0" }', "datasets.adult.limit.epsilon",
     "must be a real number; got '1.0'"),
    ('[datasets.adult]\nlimit = { epsilon = true }', "datasets.adult.limit.epsilon",
     "must be a real number; got True"),
    ('[datasets.adult]\nlimit = 3.0', "datasets.adult.limit", "got 3.0"),
    ('[datasets.adult]\nlimit = { delta = 1e-6 }', "datasets.adult.limit.epsilon",
     "required"),
    ('[datasets.adult]\nlimit = { epsilon = 1.0, epsilom = 2 }',
     "datasets.adult.limit.epsilom", "not a known key; did you mean 'epsilon'? (allowed here: delta, epsilon)"),
    ('[datasets.adult]\nlimt = { epsilon = 1.0 }', "datasets.adult.limt", "not a known key"),
    ('budget = 3\n[datasets.adult]', "budget", "not a known key"),
    ('[datasets.adult]\ncomposition = "magic"', "datasets.adult.composition",
     "must be one of ['advanced', 'basic', 'gaussian', 'optimal', 'pld', 'renyi']; got 'magic'"),
    ('[datasets.adult]\ncomposition = 3', "datasets.adult.composition", "got 3"),
    ('composition = "magic"\n[datasets.adult]', "composition", "got 'magic'"),
    ('[datasets.adult.analysts.alice]\ncomposition = "magic"',
     "datasets.adult.analysts.alice.composition", "got 'magic'"),
    ('[datasets.adult]\nperiod = "1m"', "datasets.adult.period", "got '1m'"),
    ('[datasets.adult]\nperiod = "0d"', "datasets.adult.period", "renewal window"),
    ('[datasets.adult]\nperiod = "1.5d"', "datasets.adult.period", "renewal window"),
    ('[datasets.adult]\nperiod = 1', "datasets.adult.period", "got 1"),
    ('period = "daily"\n[datasets.adult]', "period", "renewal window"),
    ('[analysts.bob]\nperiod = "-1d"\n[datasets.adult]', "analysts.bob.period", "renewal"),
    ('[datasets.adult]\nmax_per_query = { epsilon = -0.5 }', "datasets.adult.max_per_query.epsilon",
     "got -0.5"),
    ('[datasets.adult]\nmax_per_query = { eps = 0.5 }', "datasets.adult.max_per_query.eps",
     "not a known key"),
    ('[datasets.adult]\nallowed_mechanisms = "Laplace"', "datasets.adult.allowed_mechanisms",
     "list"),
    ('[datasets.adult]\nallowed_mechanisms = ["Lap lace"]',
     "datasets.adult.allowed_mechanisms.0", "mechanism class name"),
    ('[datasets.adult]\nother_analysts = "maybe"', "datasets.adult.other_analysts",
     "must be 'allow' or 'deny'; got 'maybe'"),
    ('[datasets."adult/analyst:alice"]', "datasets.adult/analyst:alice", "letters, digits"),
    ('[datasets.adult.analysts."al ice"]', "datasets.adult.analysts.al ice", "letters"),
    ('[datasets.adult.analysts.alice]\nlimit = { epsilon = -2 }',
     "datasets.adult.analysts.alice.limit.epsilon", "got -2"),
    ('[analysts.bob]\nlimit = { epsilon = 1, delta = 2 }\n[datasets.adult]',
     "analysts.bob.limit.delta", "got 2"),
    ('limit = { epsilon = inf, delta = 0.1 }\n[datasets.adult]', "limit.delta",
     "0 when epsilon is infinite"),
    ('[datasets.adult]\n[datasets.adult]', "datasets.adult", "twice (at line 2"),
    ('[datasets.adult]\nlimit = { epsilon = 1 }\nlimit = { epsilon = 2 }', "",
     "not valid TOML"),
    ('[datasets.adult', "", "not valid TOML"),
    ('', "datasets", "required"),
    ('[datasets]', "datasets", "at least 1"),
]


@pytest.mark.parametrize("text,path,words", MALFORMED_TOML)
def test_malformed_toml_names_the_key(write, text, path, words):
    f = write(text)
    with pytest.raises(PolicyError) as info:
        load_policy(f)
    err = info.value
    assert err.path == path, str(err)
    assert str(err).startswith(f"{path}: " if path else "")
    assert words in str(err)
    assert err.file == str(f)
    assert isinstance(err, ValueError)


@pytest.mark.parametrize("text,path,words", MALFORMED_TOML[:12])
def test_malformed_policy_debits_nothing(write, text, path, words):
    ledger = MemoryLedger()
    with pytest.raises(PolicyError):
        Accountant.from_policy(write(text), ledger=ledger)
    assert list(ledger.entries()) == [] and ledger.accounts() == []


def test_malformed_policy_does_not_create_a_ledger_file(write, tmp_path):
    db = tmp_path / "budget.db"
    with pytest.raises(PolicyError):
        Accountant.from_policy(write('[datasets.adult]\nlimit = { epsilon = -1 }'), ledger=db)
    assert not db.exists()


MALFORMED_JSON = [
    ('{"datasets": {"adult": {}, "adult": {"limit": {"epsilon": 1}}}}', "datasets.adult",
     "given twice (duplicate key)"),
    ('{"datasets": {"adult": {"limit": {"epsilon": 1, "epsilon": 2}}}}',
     "datasets.adult.limit.epsilon", "twice"),
    ('{"datasets": {}, "datasets": {"adult": {}}}', "datasets", "twice"),
    ('{"datasets": {"adult": {"limit": {"epsilon": -1}}}}', "datasets.adult.limit.epsilon",
     "got -1"),
    ('{"datasets": {"adult": {"limit": {"epsilon": NaN}}}}', "datasets.adult.limit.epsilon",
     "got nan"),
    ('{"datasets": {"adult": {"limit": {"epsilon": "1"}}}}', "datasets.adult.limit.epsilon",
     "real number"),
    ('{"datasets": {"adult": {"composition": "magic"}}}', "datasets.adult.composition",
     "magic"),
    ('{"datasets": {"adult": {"period": "1 day"}}}', "datasets.adult.period", "renewal"),
    ('{"datasets": {"adult": {"colour": 1}}}', "datasets.adult.colour", "not a known key"),
    ('{"datasets": {"adult": {}}', "", "not valid JSON"),
    ('[{"datasets": {}}]', "", "must be an object"),
]


@pytest.mark.parametrize("text,path,words", MALFORMED_JSON)
def test_malformed_json_names_the_key(tmp_path, text, path, words):
    f = tmp_path / "policy.json"
    f.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(f)
    assert info.value.path == path, str(info.value)
    assert words in str(info.value)


def test_unreadable_or_unknown_format(tmp_path):
    with pytest.raises(PolicyError, match="must end in .toml or .json"):
        load_policy(tmp_path / "policy.yaml")
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.toml")


def test_infinite_limit_means_no_limit(write):
    """An infinite limit is no limit: its rule enforces none (``rule.limit`` is None, the one
    meaning of "no limit" inside the library), while the account still records spend."""
    p = load_policy(write('[datasets.adult]\nlimit = { epsilon = inf }'))
    assert p.datasets["adult"].limit.is_unlimited
    assert p.datasets["adult"].rule().limit is None
    assert DatasetLimit(limit=None).rule().limit is None


def test_direct_construction_keeps_typed_errors():
    assert Budget(1.0, 1e-6) == Budget(epsilon=1.0, delta=1e-6)
    with pytest.raises(InvalidArgumentError, match="'epsilon' must be a finite number >= 0"):
        Budget(-1)
    with pytest.raises(InvalidTypeError, match="'epsilon' must be a real number"):
        Budget("1")
    with pytest.raises(InvalidArgumentError, match="'delta'"):
        Budget(1.0, math.nan)
    with pytest.raises(InvalidArgumentError):
        DatasetLimit(composition="magic")
    with pytest.raises(InvalidArgumentError, match="limit.epsilon"):
        DatasetLimit(limit={"epsilon": -1})
    with pytest.raises(InvalidArgumentError, match="period"):
        AnalystLimit(period="soon")
    with pytest.raises(InvalidTypeError):
        Period(1)


def test_json_schema_export():
    schema = policy_schema()
    json.dumps(schema)  # serialisable
    assert schema["title"] == "dpbudget policy"
    assert schema["required"] == ["datasets"]
    assert schema["additionalProperties"] is False
    defs = schema["$defs"]
    assert set(defs["DatasetLimit"]["properties"]) == {
        "limit", "per_query", "period", "composition", "max_per_query", "allowed_mechanisms",
        "analysts", "other_analysts", "conversion_share", "order", "step", "blocks",
        "privacy_unit", "bounds", "raw_values"}
    assert defs["Budget"]["required"] == ["epsilon"]


def test_schema_accepts_the_bundled_policy():
    jsonschema = pytest.importorskip("jsonschema")
    import tomllib
    from pathlib import Path

    import examples

    data = tomllib.loads((Path(examples.__file__).parent / "policy.toml").read_text())
    jsonschema.validate(data, policy_schema())
    assert isinstance(Policy.model_validate(data), Policy)


def test_rules_are_validated_against_the_registry_at_load_time(write, other_rule):
    """Rules registered after import (the other composition rules) are accepted by name."""
    p = load_policy(write(f'[datasets.adult]\ncomposition = "{other_rule}"'))
    acc = Accountant.from_policy(p)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
    record = list(acc.ledger.entries())[-1].record
    assert record["accounts"]["dataset:adult"]["rule"] == other_rule


def test_a_rule_that_cannot_be_built_is_a_policy_error(write, monkeypatch):
    from dpbudget.accountant.composition import RULES, BasicComposition
    from dpbudget.accountant.values.errors import InvalidArgumentError as IAE

    class NeedsPerQuery(BasicComposition):
        name = "needy"

        def __init__(self, limit, per_query=None):
            if per_query is None:
                raise IAE("per_query", None, "a Budget (this rule charges a fixed cost)")
            super().__init__(limit, per_query)

    monkeypatch.setitem(RULES, "needy", NeedsPerQuery)
    f = write('[datasets.adult]\ncomposition = "needy"\n[datasets.adult.analysts.al]')
    with pytest.raises(PolicyError) as info:
        Accountant.from_policy(f)
    assert info.value.path == "datasets.adult" and "per_query" in str(info.value)
    ok = write('[datasets.adult]\ncomposition = "needy"\nper_query = { epsilon = 0.1 }\n'
               '[datasets.adult.analysts.al]\ncomposition = "basic"')
    assert Accountant.from_policy(ok).policy.datasets["adult"].per_query == Budget(0.1)


def test_conversion_share_reaches_the_advanced_rule(tmp_path):
    from dpbudget.accountant import Accountant, Budget, BudgetExceededError
    from dpbudget.accountant.values.errors import PolicyError
    from dpbudget.policies import load_policy

    path = tmp_path / "p.toml"
    path.write_text('[datasets.adult]\nlimit = { epsilon = 1.0, delta = 1e-6 }\n'
                    'composition = "advanced"\nconversion_share = 0.5\n')
    acc = Accountant.from_policy(path, rng=0)
    # Half of delta is left for non-Gaussian approximate steps, such as a pipeline allocation.
    with acc.pipeline("p", dataset="adult", budget=Budget(0.2, 4e-7)) as p:
        p.release(__import__("dpbudget.mechanisms").mechanisms.Laplace(0.1, sensitivity=1.0), 1.0)
    with pytest.raises(BudgetExceededError):
        acc.pipeline("q", dataset="adult", budget=Budget(0.2, 2e-7)).__enter__()
    path.write_text('[datasets.adult]\nlimit = { epsilon = 1.0 }\nconversion_share = 0.5\n')
    load_policy(path)  # the file's structure is fine; building its rules is not
    with pytest.raises(PolicyError, match="conversion_share"):
        Accountant.from_policy(path)


def test_not_a_path_and_hostile_nesting_are_typed_errors():
    for bad in (123, None, b"policy.toml", 1.5):
        with pytest.raises(InvalidTypeError) as info:
            Accountant.from_policy(bad)
        assert info.value.argument == "path"
    from dpbudget.policies import parse_policy

    deep_toml = "[datasets.a]\nlimit = " + "{x = " * 100_000 + "1" + "}" * 100_000
    deep_json = '{"datasets": ' + "[" * 100_000 + "]" * 100_000 + "}"
    for text, fmt in ((deep_toml, "toml"), (deep_json, "json")):
        with pytest.raises(PolicyError, match="nested too deeply"):
            parse_policy(text, fmt)


# -- one policy validator (issue 30): load_policy, Accountant.from_policy and ``dpbudget policy
# check`` refuse the same policies with the same message, naming the key path

MISSPELT = '[datasets.adult]\nlimit = { epsilon = 1.0 }\nallowed_mechanisms = ["Laplce"]\n'
EXPECTED = ("datasets.adult.allowed_mechanisms.0: must name a mechanism class (no mechanism is "
            "called that; did you mean 'Laplace'?); got 'Laplce'")


def _refusals(path: Path, capsys) -> list[str]:
    """The message each of the three entry points gives for the policy file at ``path``."""
    out = []
    with pytest.raises(PolicyError) as by_load:
        load_policy(path)
    out.append(str(by_load.value))
    with pytest.raises(PolicyError) as by_file:
        Accountant.from_policy(path)
    out.append(str(by_file.value))
    capsys.readouterr()
    assert main(["policy", "check", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{path}: invalid policy: ")
    out.append(err.removeprefix(f"{path}: invalid policy: "))
    return out


def test_a_misspelt_mechanism_is_refused_alike_by_all_three(write, tmp_path, capsys) -> None:
    path = write(MISSPELT)
    assert _refusals(path, capsys) == [EXPECTED] * 3
    # from_policy with a Policy object built without validation: the same message, and the
    # ledger it names is never created.
    valid = load_policy(write('[datasets.adult]\nlimit = { epsilon = 1.0 }\n'))
    adult = valid.datasets["adult"].model_construct(
        **{**valid.datasets["adult"].__dict__, "allowed_mechanisms": ("Laplce",)})
    unchecked = Policy.model_construct(**{**valid.__dict__, "datasets": {"adult": adult}})
    db = tmp_path / "never.db"
    with pytest.raises(PolicyError) as by_object:
        Accountant.from_policy(unchecked, ledger=f"sqlite:///{db}")
    assert str(by_object.value) == EXPECTED and by_object.value.path.startswith(
        "datasets.adult.allowed_mechanisms")
    assert not db.exists()


def test_negative_control_without_the_check_it_loads_and_fails_at_release(write, monkeypatch
                                                                           ) -> None:
    """The issue as it was: with the name check removed, the file loads, and the first release
    of the mechanism its author meant is refused."""
    monkeypatch.setattr(policy_limits, "mechanism_problem", lambda name: None)
    acc = Accountant.from_policy(write(MISSPELT), rng=0)
    with pytest.raises(MechanismNotAllowedError):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")


def test_a_valid_policy_loads_everywhere(write, capsys) -> None:
    path = write('[datasets.adult]\nlimit = { epsilon = 1.0 }\n'
                 'allowed_mechanisms = ["Laplace", "AnalyticGaussian"]\n')
    policy = load_policy(path)
    for acc in (Accountant.from_policy(path, rng=0), Accountant.from_policy(policy, rng=0)):
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="adult")
        assert acc.spent("adult") == Budget(0.25)
    assert main(["policy", "check", str(path)]) == 0


def test_a_library_class_by_its_module_path_is_refused(write) -> None:
    with pytest.raises(PolicyError, match=r"allowed_mechanisms\.0: .*did you mean 'Laplace'\?"):
        load_policy(write('[datasets.a]\nallowed_mechanisms = ["dpbudget.mechanisms.laplace.Laplace"]\n'))


def test_a_custom_name_whose_module_is_absent_loads_and_admits_nothing_else(write, capsys
                                                                            ) -> None:
    """An auditor's machine without the custom module still loads the policy (the name is taken
    as written); it admits only that exact class, so no library mechanism gets through, and
    ``policy check`` warns that the name went unchecked (exit 3)."""
    assert "no_such_pkg_q" not in sys.modules
    path = write('[datasets.a]\nlimit = { epsilon = 1.0 }\n'
                 'allowed_mechanisms = ["no_such_pkg_q.mech.Clipped"]\n')
    acc = Accountant.from_policy(load_policy(path), rng=0)
    with pytest.raises(MechanismNotAllowedError):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")
    assert main(["policy", "check", str(path)]) == 3
    assert "allowed_mechanisms.0: 'no_such_pkg_q.mech.Clipped' not checked" in \
        capsys.readouterr().out


def test_a_custom_name_is_checked_once_its_module_is_imported(write, tmp_path, monkeypatch
                                                              ) -> None:
    module = tmp_path / "my_mechs_v.py"
    module.write_text(HALVER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_mechs_v", raising=False)
    typo = '[datasets.a]\nallowed_mechanisms = ["my_mechs_v.Halvr"]\n'
    load_policy(write(typo))  # not imported yet: taken as written
    __import__("my_mechs_v")
    with pytest.raises(PolicyError, match=r"did you mean 'my_mechs_v\.Halver'\?"):
        load_policy(write(typo))
    load_policy(write('[datasets.a]\nallowed_mechanisms = ["my_mechs_v.Halver"]\n'))


def test_a_stored_policy_is_read_as_recorded(write) -> None:
    """A ledger's stored policy was checked when applied; an auditor (an older version, no
    custom modules) must still read it: its names are not checked again. Negative control: the
    same entry in a file is refused."""
    doc = document(load_policy(write('[datasets.a]\nallowed_mechanisms = ["Laplace"]\n')), None)
    doc["policy"]["datasets"]["a"]["allowed_mechanisms"] = ["Laplce"]
    policy, _ = from_document(doc)
    assert policy.datasets["a"].allowed_mechanisms == ("Laplce",)
    with pytest.raises(PolicyError, match="Laplce"):
        load_policy(write(MISSPELT))


def test_a_token_id_listed_under_two_analysts_is_refused() -> None:
    """One token id under two analysts would authenticate whichever is read last, and removing
    one copy would move the token without a raise: refused when the policy is read."""
    from dpbudget.policies.policy import parse_policy

    entry = "0123456789abcdef:" + "ab" * 32 + ":2000000000"  # (id:sha256:expiry)
    text = ('[datasets.d]\nlimit = { epsilon = 1.0 }\n'
            f'[analysts.alice]\ntokens = ["{entry}"]\n')
    assert parse_policy(text, "toml").analysts["alice"].tokens == (entry,)
    with pytest.raises(PolicyError, match="more than once"):
        parse_policy(text + f'[analysts.mallory]\ntokens = ["{entry}"]\n', "toml")
