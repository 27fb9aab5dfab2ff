"""The rendered per-rank accelerate configs start a real multi-rank world, not N worlds of one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cluster.local import local_cluster
from launcher.launch.plan import LaunchPlan, NodeFacts
from launcher.launch.render import run_files

WORLD_PROBE = """\
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print(f"rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.integration
def test_accelerate_launch_with_rendered_configs_joins_one_world(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path))
    cluster = local_cluster(2)
    plan = LaunchPlan(
        cluster=cluster,
        nodes=cluster.nodes,
        run="acc",
        dataset="d",
        python=sys.executable,
        code_dir=str(tmp_path),
        master_port=29731,
        facts={n.index: NodeFacts(interface="lo") for n in cluster.nodes},
    )
    for name, text in run_files(plan, cluster.nodes[0]).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "probe.py").write_text(WORLD_PROBE)
    accelerate = Path(sys.executable).with_name("accelerate")
    procs = [
        subprocess.Popen(
            [
                "sh",
                "-c",
                f". ./env.sh && . ./rank{r}.env && exec {accelerate} launch "
                f"--config_file accelerate/rank{r}.yaml probe.py",
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=120)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert "rank 0 of 2" in outputs[0] and "rank 1 of 2" in outputs[1], outputs
