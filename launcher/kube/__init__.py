"""The kubernetes cluster kind: every task through the official `kubernetes` client (no kubectl).

    api        the connection: the kubeconfig loaded into a client of its own, errors as one line
    connect    a task's start (resolve, connect, the checks before anything is created: namespace,
               ReadWriteMany storage class, claim) and a run's objects (list, delete)
    nodes      a kubeconfig cluster's nodes: which train, their cpu, memory, GPUs and DaemonSets
    pod_spec   what a run's pods are made of: the launch, its names and labels, the trainer's environment and
               torchrun shell; what every pod shares (claim, image, Pod Security)
    pod_placement  what a training pod asks of its node (cpu, memory, GPUs, /dev/shm) and where it may go
    objects    the Jobs and Service holding them: a run's Indexed Job (pod k is rank k), headless Service,
               supervisor Job
    volume     what puts things on the shared claim: namespace, claim, staging ConfigMap, helper Jobs
    jobs       helper Jobs run to their end with their log streamed; staging (node env, code, run files)
    watch      a run's pods: [rank R host] logs, progress, fail-fast, the pending timeout
    train      `fab train`: budget, record, and restarts with launcher.recover's policy
    tasks      setup, prepare-data, status, logs, stop, sample, doctor
    pod_exec   commands in a pod through the exec websocket, read as they arrive in bounded memory
    fetch      `fab fetch`: the run's files by ranges through a helper pod's exec, checked by sha256
    run_dirs   `fab runs`, `rm`, `prune`: the run directories on the claim (its RunStore), live by their Job

The contract keys of this kind are launcher/cluster/kube_contract.py's (below launcher.cluster.contract, which
builds the Cluster); launcher/tasks/drivers.py sends a task here when the cluster's kind is kubernetes.
"""
