"""Test doubles shipped with the launcher (as Fabric ships fabric.testing), for tests and benchmarks.

nodes.py     TestNodes: real sshd nodes in network namespaces on this machine, described by a contract;
             stop_sshd/start_sshd take a node away and bring it back (a preempted VM)
fab.py       Fab: the real `fab` CLI against one contract, with its own operator state directory
fixtures.py  pytest fixtures: nodes (three test nodes per module), fab, tiny_config; sshd_nodes(count)
interrupt.py train_interrupted: a `fab train` interrupted once its first snapshot exists
pulumi_standin.py  StandinPulumi: a stand-in `pulumi` CLI on PATH (stack output, up) for stack clusters
"""
