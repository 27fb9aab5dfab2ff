"""The sshd test nodes of test_key_delivery come from the launcher's shipped fixtures."""

from launcher.testing.fixtures import nodes  # noqa: F401 (pytest fixture)
