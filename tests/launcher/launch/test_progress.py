from launcher.launch.monitor import Progress


def test_the_summary_after_the_last_eval_names_its_iteration_and_its_losses_not_the_last_logged_step():
    progress = Progress()
    progress.update({"kind": "train", "iter": 90, "loss": 5.5, "tokens_per_s": 1000.0})
    assert progress.summary() == "iter 90 | loss 5.5000 | 1,000 tok/s"
    progress.update({"kind": "eval", "iter": 100, "train_loss": 5.4, "val_loss": 5.3})
    assert progress.summary() == "iter 100 | loss 5.4000 | val 5.3000 | 1,000 tok/s"  # the eval's own train loss
    assert progress.iter == 100


def test_an_eval_without_a_train_loss_keeps_the_last_loss_on_the_progress_line():
    progress = Progress()
    progress.update({"kind": "train", "iter": 90, "loss": 5.5, "tokens_per_s": 1000.0})
    progress.update({"kind": "eval", "iter": 100, "train_loss": None, "val_loss": 5.3})
    assert progress.summary() == "iter 100 | loss 5.5000 | val 5.3000 | 1,000 tok/s"


REWOUND_FILE = [  # what a relaunch's stream reads first: the file its resumed trainer rewrote up to iter 50
    {"kind": "start", "iter": 0, "resumed": False},
    {"kind": "eval", "iter": 0, "val_loss": 10.8},
    {"kind": "train", "iter": 10, "loss": 9.0, "tokens_per_s": 500.0},
    {"kind": "stop", "iter": 30, "reason": "signal"},
    {"kind": "start", "iter": 30, "resumed": True},
    {"kind": "eval", "iter": 50, "val_loss": 6.0},
]


def test_a_relaunch_shows_its_own_progress_not_the_replay_of_the_rewound_file():
    progress = Progress(resumes_from=50)
    assert not any(progress.update(record) for record in REWOUND_FILE), "the replay is no progress"
    assert progress.stopped_at is None, "an earlier attempt's stop is not this launch's"
    progress.update({"kind": "start", "iter": 50, "resumed": True})
    assert progress.update({"kind": "train", "iter": 51, "loss": 5.9, "tokens_per_s": 900.0})
    assert progress.summary() == "iter 51 | loss 5.9000 | 900 tok/s"


def test_a_fresh_launch_counts_from_its_first_record():
    progress = Progress(resumes_from=0)
    progress.update({"kind": "start", "iter": 0, "resumed": False})
    assert progress.update({"kind": "eval", "iter": 0, "val_loss": 10.8})
    assert progress.summary() == "iter 0 | val 10.8000"


def test_a_file_read_as_it_is_counts_every_record():
    progress = Progress()
    for record in REWOUND_FILE:
        progress.update(record)
    assert progress.summary() == "iter 50 | loss 9.0000 | val 6.0000 | 500 tok/s" and progress.stopped_at == 30


def test_a_relaunch_from_an_older_snapshot_than_recorded_reports_from_past_the_recorded_one():
    """The node went while the newest snapshot was written: the trainer resumes from the one before."""
    progress = Progress(resumes_from=50)
    for record in REWOUND_FILE[:4]:
        progress.update(record)
    assert not progress.update({"kind": "start", "iter": 30, "resumed": True})
    assert not progress.update({"kind": "train", "iter": 40, "loss": 6.5, "tokens_per_s": 800.0})
    assert progress.update({"kind": "train", "iter": 51, "loss": 5.9, "tokens_per_s": 900.0})
    progress.update({"kind": "stop", "iter": 55, "reason": "signal"})
    assert progress.summary() == "iter 51 | loss 5.9000 | 900 tok/s" and progress.stopped_at == 55
