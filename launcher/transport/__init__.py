"""How a command reaches a node: a Shell per node, over SSH or as a local subprocess.

shell.py        Shell (run, stream, check, fetch, reopened), Result, NodeError, parallel(), payload(); and
                LocalShell: the local cluster's nodes are bash subprocesses on this machine
ssh.py          SSHShell: Fabric/paramiko with pinned host keys, workers through the head; and the
                cluster's own SSH on the nodes (key, ssh config, known_hosts) for head -> worker
connect.py      connect(cluster, nodes): the right shells for a cluster, in parallel
"""

from launcher.transport.connect import connect, connect_reachable
from launcher.transport.shell import NodeError, Result, Shell, parallel, payload

__all__ = ["NodeError", "Result", "Shell", "connect", "connect_reachable", "parallel", "payload"]
