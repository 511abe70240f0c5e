"""Tests of the train-lora plugin start and end with no speed-up installed in their process.

The plugin patches transformers, peft, accelerate, Liger and ms-swift in the process that loads it, and those
libraries are shared by every test a pytest process runs: a test that loaded the plugin used to leave its patches
to the tests after it (on the GPU, test_liger_waits' Liger test then found Liger's forward already replaced and its
count hook unset: `TypeError: 'NoneType' object is not callable` when the GPU files ran together, a pass alone).
`plugin.reset` puts back every symbol an item replaced (each item declares them: registry.Target) and forgets the
walk, so the next `import ...speedups.swift_plugin` installs afresh. speedups/tests/conftest.py applies the fixture
to every test in that folder; a test module elsewhere that loads the plugin imports it:

    from speedups.tests.isolation import restored_speedups  # noqa: F401 (autouse)
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def restored_speedups(monkeypatch):
    """`plugin.reset` before and after the test; after it, before the test's own `monkeypatch` changes are undone.

    The order matters: a test that deletes a target (`monkeypatch.delattr(Trainer, "_track_num_input_tokens")`)
    and then installs the plugin has the plugin remember "missing"; a reset after monkeypatch put the method back
    would delete it again, for every later test in the process. Asking for `monkeypatch` here sets it up first, so
    pytest undoes it last.
    """
    from speedups import plugin

    plugin.reset()
    yield
    plugin.reset()


@pytest.fixture
def plugin_context():
    """The plugin installed in this process for the test (its context), and taken out after it."""
    from speedups import swift_plugin

    return swift_plugin.CONTEXT
