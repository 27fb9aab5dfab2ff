"""What a node needs before a run, placed from this machine.

nodes   ready nodes: the node environment (bootstrap), the cluster's SSH, model/ code; `fab setup`
data    `fab prepare-data`: tokenize a dataset on the nodes (model.prepare), give every node a
        checked copy
"""
