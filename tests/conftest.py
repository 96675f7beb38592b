"""The quick and the full test suite.

``pytest -m "not slow"`` (the README's test command) leaves out the modules below: they start
real processes (torchrun across emulated nodes, a private Slurm, framework builds), regenerate
every example, fuzz hundreds of random problems, or run every README command. ``.ci/run`` runs
everything. A test elsewhere can mark itself ``@pytest.mark.slow``.

``.ci/run`` runs the tests in two passes: two pytest-xdist workers for everything not marked
``serial``, then the ``serial`` tests alone, so that nothing else shares the two cores with the
tests that time shaped links, ranks, hung candidates or Slurm jobs (``SERIAL_MODULES``, or
``@pytest.mark.serial``).
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

SERIAL_MODULES = frozenset({
    "test_check_world.py",             # a private Slurm
    "test_emulate.py",
    "test_launch_emulated.py",
    "test_launch_slurm.py",
    "test_verify_emulated.py",         # calibrated bandwidth within 20 %, measured step order
    "test_verify_local.py",            # calibration sweep, a hung candidate's timeout
    "test_verify_model.py",            # measured step times refit
    "test_verify_slurm.py",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if item.path.name in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
