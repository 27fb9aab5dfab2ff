"""One rank's run: the Trainer that `python -m model.train` builds and runs.

state    what a rank starts from: precision, batches, model, optimizer, DDP, probe and guard, metrics
trainer  the Trainer over that state: the loop to max_iters (realigning the ranks after evals, stopping
         on a signal), the training step and the evaluation, the snapshots, checkpoints and log steps
"""
