"""Self-healing runs (no controller: the launcher itself recovers): which failures `fab train` retries, and how many times."""
