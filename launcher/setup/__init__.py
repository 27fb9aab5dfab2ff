"""Making nodes ready: the node environment (bootstrap), the cluster's SSH, the model code."""
