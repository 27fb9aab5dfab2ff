"""Data placement: tokenize a dataset on the nodes (model.prepare) and give every node a checked copy."""
