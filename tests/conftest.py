"""For every test: launcher code run in the test process (a cluster's key file, its sightings, its
runs' records) writes under NANOCLUSTER_HOME, so that is a temporary directory, never the user's
~/nanocluster. A test that needs its own home still sets one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from launcher.inventory import LOCAL_HOME_ENV


@pytest.fixture(autouse=True, scope="session")
def local_home_outside_the_users(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LOCAL_HOME_ENV, str(tmp_path_factory.mktemp("nanocluster-home")))
        yield
