"""The operator's side of nanocluster: the tasks (`fab` in the checkout, the installed
`nanocluster` command) and the library behind them, in layers (.importlinter: each imports only
the ones below it):

    cli.py          the `nanocluster` console command over tasks/
    tasks/          every task's flags and help (commands), the driver of each cluster kind (drivers)
    train.py        `fab train` on machines over SSH: what that kind supplies to the run lifecycle
    machine_runs.py `fab runs`, `rm`, `prune` on machines: each node's run directories (its RunStore)
    kube/           every task on a Kubernetes cluster through the official client
    lifecycle.py    one run's lifecycle for every kind: checks, budget, record, restart loop, the end
    run_files.py    every run's files on the cluster and here, for every kind: `runs`, `rm`, `prune`
    recover/        which failures are retried (policy), OOM kills, lost nodes waited for and revived
    launch/         plan, rendered files, units (start, identity, stop), monitor, status and logs
    checkpoints.py  `fab sample` and `fab fetch`: what a run produced
    doctor.py       preflight checks with their fixes, the link bandwidth
    setup/          ready nodes (bootstrap, the cluster's SSH, model/ code) and their data
    session.py      a task's nodes, connected once and probed once
    runs/           the operator's record of runs on this machine: events, attempts, spend, budget,
                    estimates, metrics, plots, the cost ledger (`fab cost`); no node needed
    transport/      how a command reaches a node (SSH, or a subprocess for the local cluster)
    cluster/        which cluster (--cluster to a validated contract) and where things are on its nodes
    console.py      output and the one-line errors
    trainer_config.py  the trainer's config (--config, --set) checked before any node is touched
    node_scripts/   standard-library scripts run with the node's Python
    testing/        sshd test nodes and the fab runner, for tests and bench/launch.py
"""
