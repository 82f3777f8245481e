"""A forged or extreme Rényi curve is refused cleanly, never crashes a debit or the audit
(independent review of issue 14)."""
import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import Refused, RenyiComposition
from dpbudget.accountant.values.errors import PrivacyError
from dpbudget.accountant.ledger import open_ledger
from dpbudget.accountant.audit.transfer import export_jsonl
from dpbudget.mechanisms import SubsampledGaussian


@pytest.mark.parametrize("z", [1e-200])
def test_debit_with_tiny_z_raises_a_library_error(z):
    rule = RenyiComposition(Budget(3.0, 1e-5))
    charge = Charge(1.0, 1e-6, rdp=("poisson-zcdp", 0.5, z))
    with pytest.raises((Refused, PrivacyError)):
        rule.debit(rule.initial_state(), charge)


def test_audit_of_forged_tiny_z_reports_not_crashes(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Accountant(Budget(3.0, 1e-5), composition="renyi", ledger=url, rng=1,
                    simulation=True) as acc:
        acc.release(SubsampledGaussian(1.0, sampling_rate=0.01, sensitivity=1.0), np.ones((10, 2)))
    out = tmp_path / "l.jsonl"
    with open_ledger(url) as ledger:
        export_jsonl(ledger, out)
    text = out.read_text()
    assert '"rdp":["poisson-discrete-gaussian",0.01,1.0]' in text
    out.write_text(text.replace('"rdp":["poisson-discrete-gaussian",0.01,1.0]',
                                '"rdp":["poisson-discrete-gaussian",0.01,1e-200]'))
    report = audit(out)
    assert not report.ok
