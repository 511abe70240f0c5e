"""The errors serving and deploying raise; each message says what failed and how to fix it."""

from __future__ import annotations


class DeployError(RuntimeError):
    """Serving or deploying failed; the message says what and how to fix it."""


class ServerNotHealthyError(DeployError):
    """A server did not become healthy within the bounded wait (or exited before)."""


class SmokeTestError(DeployError):
    """A smoke-test request failed or its answer does not parse for the task (raw answer in the message)."""


class EndpointLocationError(DeployError):
    """The endpoint named in the config is in another project or region than the deployment."""
