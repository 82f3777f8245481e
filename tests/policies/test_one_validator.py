"""Issue 30: one policy validator. ``load_policy``, ``Accountant.from_policy`` (a file or a
``Policy`` object) and ``dpbudget policy check`` refuse the same policies with the same message,
naming the key path; a misspelt mechanism name no longer loads only to fail at the first release.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dpbudget.policies import limits as policy_limits
from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.cli import main
from dpbudget.accountant.values.errors import MechanismNotAllowedError, PolicyError
from dpbudget.mechanisms import Laplace
from dpbudget.policies import load_policy
from dpbudget.policies.policy import Policy
from dpbudget.policies.stored import document, from_document
from tests.support import HALVER_MODULE

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
