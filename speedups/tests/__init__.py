"""Tests of the speed-up layer (`speedups/`), run with the project's suite (`make test`; pyproject's testpaths).

A package, so that pytest imports these files as `speedups.tests.test_*`: no clash with a file of the same name under
tests/. Not shipped: pyproject's package find leaves `speedups.tests` out of the wheel.
"""
