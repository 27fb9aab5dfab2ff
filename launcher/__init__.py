"""The operator's side of nanocluster: the tasks (`fab` in the checkout, the installed
`nanocluster` command) and the library behind them.

    tasks/        every task, one thin module each: flags and help over a library function
    cli.py        the `nanocluster` console command over tasks/
    inventory.py  which machines: --cluster -> a validated Cluster (the output contract)
    site.py       where things are on the nodes; what the local cluster does differently
    trainer_config.py  the trainer's config (--config, --set) checked before any node is touched
    transport/    how a command reaches a node (SSH, or a subprocess for the local cluster)
    session.py    a task's nodes, connected once and probed once (probe.py, remote/probe.py)
    setup/        ready nodes: bootstrap, the cluster's SSH, model/ code
    data/         prepare a dataset and give every node a checked copy
    runs/         the operator's record of runs and clusters on this machine: events, attempts, spend,
                  budget, estimates, the cost ledger (`fab cost`); no node needed
    launch/       plan, rendered files, unit commands and identities, start, monitor, stop, status, logs
    recover/      the restart loop: which failures are retried, waiting for lost nodes
    train.py      `fab train` from start to end: budget, launches, restarts, the run's record
    checkpoints.py  `fab sample` and `fab fetch`: what a run produced
    doctor.py     preflight checks with their fixes
    remote/       standard-library scripts run with the node's Python
    testing/      sshd test nodes and the fab runner, for tests and bench/launch.py
"""
