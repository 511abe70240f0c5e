"""Every test here starts and ends with no speed-up installed in its process (`isolation.restored_speedups`).

tests/conftest.py's fixtures (the Cloud Storage emulator, the fake hub, fast retries) serve the tasks' cores; nothing
here reads Cloud Storage, a hub or a URL, so they are not needed. Tests under tests/ that load the plugin import the
same fixture from `speedups.tests.isolation`.
"""

from speedups.tests.isolation import restored_speedups  # noqa: F401 (autouse: every test in this folder)
