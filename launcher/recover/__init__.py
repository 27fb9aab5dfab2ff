"""Self-healing runs (issue 11): which failures `fab train` retries, and how many times."""
