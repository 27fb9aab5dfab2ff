"""Between two attempts of a run (the restart loop itself is launcher.lifecycle's, for every kind).

policy   which failures `fab train` retries, how many times, on which nodes (--min-nodes)
oom      whether a killed rank was the OOM killer's victim, from its node's own record
nodes    a cluster of machines brought back: lost nodes waited for, the survivors' ranks stopped
revive   a Pulumi stack's lost VMs brought back with `pulumi up`
"""
