"""The operator's record of runs and clusters, on this machine (no node needed): each run's events and
metrics copy (record.py's RunRecord, metrics_stream.py's RunRecorder while a run streams), budget and
estimates read from them, plots, the cost ledger."""
