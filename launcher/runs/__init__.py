"""Looking at a run: its state on every node, its logs, text from its checkpoint, a local copy."""
