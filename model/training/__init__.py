"""One rank's run: the Trainer that `python -m model.train` builds and runs, in the order it is built.

state    what a rank starts from: precision, batches, model, optimizer, DDP, probe and guard, metrics
step     the training step (micro-batches, clipping, the step guard) and the evaluation
outputs  evaluations with snapshots and checkpoints; the log steps' lines and records
trainer  the Trainer: the loop to max_iters, realigning the ranks after evals, stopping on a signal
"""
