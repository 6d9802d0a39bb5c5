"""The pytest plugin's old module name, kept for installs whose ``pytest11``
entry point still names it (an editable install made before the move); the
plugin lives in ``simdist._pytest.plugin``. Loading it by hand needs the entry
point's copy blocked first: ``-p no:simdist -p simdist.pytest_plugin``."""

from ._pytest.plugin import (
    RankFailed,
    _simdist_trace_dir,
    pytest_addoption,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_generate_tests,
    pytest_pyfunc_call,
    pytest_runtest_makereport,
    pytest_unconfigure,
    simdist_run,
)

__all__ = [
    "RankFailed",
    "_simdist_trace_dir",
    "pytest_addoption",
    "pytest_collection_finish",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_pyfunc_call",
    "pytest_runtest_makereport",
    "pytest_unconfigure",
    "simdist_run",
]
