"""The quick and the full test suite.

``pytest -m "not slow"`` (the README's test command) leaves out the modules below: they start
real processes (torchrun across emulated nodes, a private Slurm, framework builds), regenerate
every example, fuzz hundreds of random problems, or run every README command. ``.ci/run`` runs
everything. A test elsewhere can mark itself ``@pytest.mark.slow``.
"""

from __future__ import annotations

import pytest

SLOW_MODULES = frozenset({
    "test_emulate.py",                 # network namespaces, shaped links, torchrun across nodes
    "test_examples.py",                # every example searched and rendered again
    "test_launch_accept_torchtitan.py",  # torchtitan builds every example candidate
    "test_launch_emulated.py",         # emitted launch files run under torchrun
    "test_readme_commands.py",         # every README tour command as written
    "test_robust_fuzz.py",             # hundreds of random problems end to end
    "test_verify_emulated.py",         # calibrate + verify on an emulated 2x2 cluster
    "test_verify_local.py",            # verify on local ranks
    "test_verify_model.py",            # real model blocks under torchrun
    "test_verify_slurm.py",            # a private Slurm
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
