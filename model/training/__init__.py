"""One rank's run: the Trainer that `python -m model.train` builds and runs, one part per module.

state    what a rank starts from: precision, batches, model, optimizer, DDP, probe and guard, metrics
step     the training step (micro-batches, clipping, the step guard) and the evaluation
outputs  evaluations with snapshots and checkpoints; the log steps' lines and records
trainer  the Trainer: the loop to max_iters, realigning the ranks after evals, stopping on a signal

Each part is a class over the one above it, so every part reads the state under its own name:
Trainer(RunOutputs(TrainingStep(TrainerState))). Callers use the Trainer alone.
"""
