"""One locked set of versions for development, CI and the nodes: requirements.lock, and from it the
pins each node profile installs (node/requirements-PROFILE.txt), hashed, with the PyPI file name of
each hash (node/pypi-files.json).

    python -m tools.lock update [--upgrade]   what `make lock` / `make lock-upgrade` run (resolve.py)
    python -m tools.lock check                what `make lint` runs: offline, no resolver (check.py)

requirements.py  where the lock's files are; how a requirement line reads (its pin, its hashes)
profiles.py      the node profiles (extras, indexes, own stack) and the node platforms
resolve.py       `update`: pip-compile for the lock and the profiles, uv for the cuda profile's stack
pypi.py          the sha256 and file name of each PyPI file a node can install, from PyPI's simple API
node_file.py     a node file as written: its hashed pins, its seal and the record of its inputs
check.py         `check`: each node file against the lock, its profile, its seal and its inputs
"""
