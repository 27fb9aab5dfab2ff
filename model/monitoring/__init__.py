"""Watching a run and stopping it well: health, records, timing, signals and the budget.

health           per-layer health records and the `fab status` line (torch-free)
health_probe     the trainer's side: per-block statistics over a step, and the health.* objects
step_guard       whether to apply each optimizer step: skip a bad one, roll back when they persist
metrics          metrics.jsonl, one record per line (torch-free)
tensorboard_log  TensorBoard event files with metrics.jsonl's scalars
mfu              model FLOPs utilisation against this CPU's measured matmul peak
step_timing      each rank's step split into compute and waiting for the others
stop_signal      SIGTERM/SIGINT: finish the step, agree across ranks, snapshot, exit
budget           the trainer's budget stop: a snapshot before the next step would cross it
spend            what compute costs: the rule the trainer and the launcher share (torch-free)
"""
