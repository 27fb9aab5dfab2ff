from launcher.launch.monitor import Progress


def test_the_summary_after_the_last_eval_names_the_last_iteration_not_the_last_logged_step():
    progress = Progress()
    progress.update({"kind": "train", "iter": 90, "loss": 5.5, "tokens_per_s": 1000.0})
    assert progress.summary() == "iter 90 | loss 5.5000 | 1,000 tok/s"
    progress.update({"kind": "eval", "iter": 100, "train_loss": 5.4, "val_loss": 5.3})
    assert progress.summary() == "iter 100 | loss 5.5000 | val 5.3000 | 1,000 tok/s"
    assert progress.iter == 100
