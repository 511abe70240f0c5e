"""Tests of the train-lora plugin start and end with no speed-up installed in their process.

The plugin patches transformers, peft, accelerate, Liger and ms-swift in the process that loads it, and those
libraries are shared by every test a pytest process runs: a test that loaded the plugin used to leave its patches
to the tests after it (on the GPU, test_liger_waits' Liger test then found Liger's forward already replaced and its
count hook unset: `TypeError: 'NoneType' object is not callable` when the GPU files ran together, a pass alone).
`plugin.reset` puts back every symbol an item replaced (each item declares them: registry.Target) and forgets the
walk, so the next `import ...speedups.swift_plugin` installs afresh. Import the fixture into a test module:

    from tests.speedups_isolation import restored_speedups  # noqa: F401 (autouse)
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def restored_speedups():
    from speedups import plugin

    plugin.reset()
    yield
    plugin.reset()


@pytest.fixture
def plugin_context():
    """The plugin installed in this process for the test (its context), and taken out after it."""
    from speedups import swift_plugin

    return swift_plugin.CONTEXT
