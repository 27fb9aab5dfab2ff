"""Test doubles shipped with the launcher (as Fabric ships fabric.testing), for tests and benchmarks.

    nodes.py     TestNodes: real sshd nodes in network namespaces on this machine, described by a contract
    fab.py       Fab: the real `fab` CLI against one contract, with its own operator state directory
    fixtures.py  pytest fixtures: nodes (three test nodes per module), fab, tiny_config
"""
