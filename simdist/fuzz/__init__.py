"""Fuzz campaigns: Hypothesis properties run under a wall-clock budget.

Writing a property::

    from hypothesis import given
    from simdist import fuzz

    @given(case=my_cases())
    @fuzz.replayable(MyCase.from_json)
    def test_split_equals_monolithic(case):
        fuzz.cover(tp=case.layout.tp, dtype=case.dtype)
        ...  # run on every rank, compare with an independent reference

Running a campaign: ``simdist fuzz --budget 60 tests/fuzz``; replaying a
written failure: ``simdist replay fixtures/regressions/<case>.json``.
"""

from ._campaign import CampaignConfig, CampaignResult, ExitCode, run_campaign
from ._corpus import CaseFile, CaseFileError, read_case, replay_case, write_case
from ._property import FuzzSpec, cover, replayable

__all__ = [
    "CampaignConfig",
    "CampaignResult",
    "CaseFile",
    "CaseFileError",
    "ExitCode",
    "FuzzSpec",
    "cover",
    "read_case",
    "replay_case",
    "replayable",
    "run_campaign",
    "write_case",
]
