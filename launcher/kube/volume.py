"""The objects that put things on the shared volume, as the API's camelCase dicts (pure functions).

    namespace, claim      what a kubeconfig cluster gets when it lacks them
    staging ConfigMap     model/ as a tarball, the node requirements and the run's files, named by
                          their digest (a ConfigMap holds at most 1 MiB: the code is ~80 KB)
    staging Job           builds <root>/store/venv-<digest> once per requirements digest and
                          <root>/store/code-<digest> once per code digest (each in a temporary
                          directory renamed into place, never changed or removed after), points
                          <root>/venv and <root>/code at them, writes the run's files; then exits
    prepare Job           `python -m model.prepare` writing <root>/data/<dataset> once
    tool Job              one program of the node environment (sample, a metrics tail): its log is the answer

They run the stock image on any node of the training nodes' architecture (no training-pool selector,
so the pool is not scaled up for them), with small requests and limits (HELPER_RESOURCES), and the
claim at MOUNT_PATH, as the training pods see it. None requests a GPU (building the
CUDA venv, preparing data and sampling need none) or tolerates a taint: they keep off a tainted
training pool (GKE taints its GPU pools nvidia.com/gpu) and run on the cluster's other nodes. The one
exception is the doctor's GPU check (launcher.kube.doctor), whose pod is placed on a GPU node as a
training pod is.
"""

from __future__ import annotations

import base64
import hashlib
import shlex

from launcher.cluster.inventory import NAME_PATTERN
from launcher.cluster.kube_contract import POD_SECURITY_LABELS, KubeAccess
from launcher.cluster.node_layout import data_dir, run_dir
from launcher.kube.pod_spec import (
    APP,
    CODE_DIR,
    DEFAULT_IMAGE,
    LABEL_APP,
    LABEL_RUN,
    MOUNT_PATH,
    NODE_PYTHON,
    RUN_AS_ID,
    VOLUME,
    restricted,
)

CONFIGMAP_LIMIT_BYTES = 1024 * 1024
"""The API server refuses a ConfigMap whose data exceeds 1 MiB."""
STAGE_DIR = "/staging"
"""Where the staging Job mounts its ConfigMap."""
LABEL_ROLE = "nanocluster.dev/role"
"""What a helper object is for: staging, prepare, tool."""
STORE = f"{MOUNT_PATH}/store"
"""Node environments and code trees by digest: written once, then only read. A run's pods name the
ones it staged (code_dir, venv_dir), so another run's staging never changes what they execute."""
VENV_MARKER = f"{MOUNT_PATH}/venv/.nanocluster-ready"
"""The newest node environment's marker (through the <root>/venv link), holding its requirements digest."""
HELPER_DEADLINE_S = {"staging": 3600, "prepare": 6 * 3600}
"""activeDeadlineSeconds of a helper Job by role: a stuck helper ends (DeadlineExceeded) instead of
holding a node. Staging may build the CUDA environment (GBs of wheels); preparing may tokenize a large
dataset; the others (sample, fetch, doctor, runs) are minutes."""
HELPER_DEADLINE_DEFAULT_S = 1800


def meta(name: str, namespace: str, role: str, run: str = "") -> dict:
    labels = {LABEL_APP: APP, LABEL_ROLE: role} | ({LABEL_RUN: run} if run else {})
    return {"name": name, "namespace": namespace, "labels": labels}


def namespace(name: str) -> dict:
    """The namespace of a kubeconfig cluster: its pods must pass Pod Security "restricted" (as ours do)."""
    labels = {LABEL_APP: APP} | POD_SECURITY_LABELS
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def claim(access: KubeAccess) -> dict:
    """The ReadWriteMany claim of a kubeconfig cluster (a stack creates its own)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta(access.storage_claim, access.namespace, "storage"),
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": access.storage_class,
            "resources": {"requests": {"storage": f"{access.storage_gib}Gi"}},
        },
    }


def digest_of(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def code_dir(code_sha: str) -> str:
    return f"{STORE}/code-{code_sha}"


def venv_dir(requirements_sha: str) -> str:
    return f"{STORE}/venv-{requirements_sha}"


HASH_OPTION = b"--hash=sha256:"
"""What marks a requirement line pip checks against sha256 hashes (tools/lock/pypi.py writes one on each
PyPI pin)."""


def split_requirements(requirements: bytes) -> tuple[bytes, bytes]:
    """The lines with hashes and the rest of a node requirements file: two pip commands, as
    --require-hashes holds for a whole command and torch, from its own index, has no hash. The rest
    is empty where it pins nothing (the cuda profile: every pin from PyPI, hashed)."""
    lines = requirements.splitlines(keepends=True)
    hashed = b"".join(line for line in lines if HASH_OPTION in line)
    rest = [line for line in lines if HASH_OPTION not in line]
    pins_any = any(line[:1].isalnum() for line in rest)  # not a comment, an option (the indexes) or blank
    return hashed, b"".join(rest) if pins_any else b""


def staging_configmap(namespace_name: str, files: dict[str, bytes], name: str = "") -> dict:
    """files (key -> bytes) as the ConfigMap <name> of one staging Job (deleted when it ends: another
    staging's Job never mounts it); a ValueError past the 1 MiB limit."""
    size = sum(len(base64.b64encode(v)) for v in files.values())
    if size > CONFIGMAP_LIMIT_BYTES:
        raise ValueError(
            f"the staged files take {size} bytes, over a ConfigMap's {CONFIGMAP_LIMIT_BYTES}: "
            "keep model/ and the trainer config small"
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(name or f"nanocluster-stage-{digest_of(files)[:12]}", namespace_name, "staging"),
        "binaryData": {k: base64.b64encode(v).decode() for k, v in files.items()},
    }


def staged_once(final: str, what: str, build: list[str], marker: str) -> list[str]:
    """Shell building <final> once: into a temporary directory beside it, then renamed into place
    (rename(2) is atomic on one file system, NFS included). Two stagings at once both build; the
    second rename finds <final> there and fails, and that one's copy is dropped. Nothing removes
    <final> afterwards: a live run's pods keep executing it."""
    return [
        f"if [ ! -e {final}/{marker} ]; then",
        f"  tmp=$(mktemp -d {final}.tmp.XXXXXX) && chmod 755 $tmp",
        f"  echo '{what}'",
        *(f"  {line.replace('TMP', '$tmp')}" for line in build),
        f"  mv -T $tmp {final} 2>/dev/null || {{ rm -rf $tmp; echo 'another staging built it meanwhile: kept it'; }}",
        "fi",
    ]


def point(link: str, target: str) -> list[str]:
    """Shell pointing the symlink <link> at <target>, atomically (a new link renamed over the old one);
    a directory there from before the store (the old layout) is moved into the store first."""
    return [
        f"if [ -d {link} ] && [ ! -L {link} ]; then mv -T {link} {STORE}/legacy-$(basename {link})-$(date +%s); fi",
        f"ln -sfn {target} {link}.new.$$ && mv -T {link}.new.$$ {link}",
    ]


STAGED_RECORD = "staged"
"""The file in a run's directory naming the store entries it staged (venv-<digest>, code-<digest>, a
line each): what its pods and its helper Jobs run, and what a prune of the store keeps."""
STORE_GRACE_MIN = 90
"""A store entry touched this recently is never pruned: a staging touches what it uses before it
records it in its run's directory, and runs at most HELPER_DEADLINE_S["staging"] (60 minutes)."""


DATA_REPORT = "data report: "
"""The staging log's line with what launcher/node_scripts/probe.py (in the ConfigMap as probe.py)
reports of data/<dataset> on the claim: a run checks it before any pod starts (launcher.launch.data_check)."""
RUNS_DIR = f"{MOUNT_PATH}/runs"
RUNS_REPORT = "@runs"
"""A helper pod's line naming every run directory on the claim (runs_report_script): the staging Job's,
which completes the index of runs (launcher.kube.run_index), and that of a task's pod that found no
directory of its run (enter_run_script)."""
NO_RUN_EXIT = 5
"""A task pod's exit status where the claim has no directory of its run (enter_run_script)."""


def runs_report_script() -> str:
    """Shell: the RUNS_REPORT line, each directory under runs/ on the claim a word after it."""
    return f'echo "{RUNS_REPORT}$(for r in {RUNS_DIR}/*; do [ -d "$r" ] && printf \' %s\' "${{r##*/}}"; done)"'


def reported_runs(line: str) -> set[str] | None:
    """The run names of a RUNS_REPORT line (only names a run can have); None for any other line."""
    if not line.startswith(RUNS_REPORT):
        return None
    return {word for word in line.removeprefix(RUNS_REPORT).split() if NAME_PATTERN.match(word)}


def enter_run_script(run: str) -> str:
    """Shell: cd into the run's directory on the claim; where there is none, the RUNS_REPORT line and
    exit NO_RUN_EXIT, so the task names the nearest run (launcher.kube.run_dirs.refuse_unlisted) and
    keeps "train first" for a run whose directory holds no checkpoint yet."""
    directory = shlex.quote(run_dir(MOUNT_PATH, run))
    return f"cd {directory} 2>/dev/null || {{ {runs_report_script()}; exit {NO_RUN_EXIT}; }}"


def staging_script(
    requirements_sha: str,
    code_sha: str,
    run_files: dict[str, str],
    run: str = "",
    hashed: bool = False,
    unhashed: bool = True,
    dataset: str = "",
    stale: tuple[str, ...] = (),
) -> str:
    """Shell for the staging Job: the venv and the code into the store when their digest is not there
    (staged_once), touched (store_prune_script's grace), <root>/venv and <root>/code pointed at them
    (what helper Jobs of no run use), the run's record of them (STAGED_RECORD) and the run's files; last
    the RUNS_REPORT line (the claim's runs, for their index: launcher.kube.run_index).
    The pins file names its own package indexes (the CPU or the CUDA wheels of torch: tools/lock/profiles.py).
    hashed: the ConfigMap holds hashed.txt, the pins with hashes (split_requirements), installed first
    with --require-hashes (--no-deps: torch, accelerate's dependency, has no hash in the default
    profile; the second command installs it from requirements.txt, with what it needs beyond the
    hashed pins). unhashed: the ConfigMap holds requirements.txt, the rest (none in the cuda profile,
    whose every pin is hashed: the first command installs it all). dataset: the
    DATA_REPORT line of data/<dataset> first (the stock image's Python runs the probe). stale: files of
    an earlier run removed before the run starts (a state a new supervisor would be read by until it
    writes its own)."""
    venv, code = venv_dir(requirements_sha), code_dir(code_sha)
    pip = "TMP/bin/pip install --no-cache-dir -q"
    hashed_install = [f"{pip} --require-hashes --no-deps -r {STAGE_DIR}/hashed.txt"] if hashed else []
    lines = [
        "set -eu",
        f"if [ ! -w {MOUNT_PATH} ]; then",
        f"  echo 'the claim is not writable by uid {RUN_AS_ID}, the user every pod runs as: give its root to "
        f"{RUN_AS_ID}:{RUN_AS_ID} (chown) or use a storage class whose volumes are (docs/kubernetes.md)'",
        "  exit 1",
        "fi",
        *(
            [f"echo \"{DATA_REPORT}$(python -S - {MOUNT_PATH} '' {shlex.quote(dataset)} < {STAGE_DIR}/probe.py)\""]
            if dataset
            else []
        ),
        f"mkdir -p {STORE}",
        *staged_once(
            venv,
            f"building the node environment {requirements_sha[:12]} (once per requirements digest)",
            [
                "python -m venv TMP",
                *hashed_install,
                *([f"{pip} -r {STAGE_DIR}/requirements.txt"] if unhashed else []),
                f"echo {requirements_sha} > TMP/.nanocluster-ready",
            ],
            ".nanocluster-ready",
        ),
        *staged_once(
            code,
            f"installing model code {code_sha[:12]}",
            [f"tar -xzf - -C TMP < {STAGE_DIR}/code.tar.gz", f"echo {code_sha} > TMP/.sha256"],
            ".sha256",
        ),
        f"touch {venv} {code}",
        *point(f"{MOUNT_PATH}/venv", venv),
        *point(CODE_DIR, code),
    ]
    if run:
        record = shlex.quote(run_path(run, STAGED_RECORD))
        lines += [
            f"mkdir -p {shlex.quote(run_dir(MOUNT_PATH, run))}",
            f"printf '%s\\n' venv-{requirements_sha} code-{code_sha} > {record}.new.$$",
            f"mv -f {record}.new.$$ {record}",
        ]
    lines += [f"rm -f {shlex.quote(path)}" for path in stale]
    for path, key in sorted(run_files.items()):
        lines += [f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}", f"cp {STAGE_DIR}/{key} {shlex.quote(path)}"]
    return "\n".join([*lines, runs_report_script()]) + "\n"


ARCH_LABEL = "kubernetes.io/arch"
"""The kubelet's label of a node's CPU architecture, amd64 or arm64
(kubernetes.io/docs/reference/labels-annotations-taints)."""
HELPER_RESOURCES = {
    "requests": {"cpu": "250m", "memory": "512Mi"},
    "limits": {"cpu": "1", "memory": "2Gi"},
}
"""A helper pod's size: requests so the scheduler counts it (not BestEffort, the first evicted) and fits
it on a small system node (GKE's e2-standard-2: 1.93 CPU, about 5.8 GiB allocatable beside kube-dns and
friends); limits so pip resolving torch or a tokenizer cannot take the node's memory from its daemons."""


def helper_job(
    name: str, access: KubeAccess, role: str, script: str, run: str = "", configmap: str = "", workdir: str = MOUNT_PATH
) -> dict:
    """A one-pod Job running `sh -c script` in the stock image with the claim mounted (and the
    staging ConfigMap, if any), as Pod Security "restricted" admits it (pod_spec.restricted); ended
    after HELPER_DEADLINE_S, kept 10 minutes after it ends so its log can be read."""
    mounts: list[dict] = [{"name": VOLUME, "mountPath": MOUNT_PATH}]
    volumes: list[dict] = [{"name": VOLUME, "persistentVolumeClaim": {"claimName": access.storage_claim}}]
    if configmap:
        mounts.append({"name": "staging", "mountPath": STAGE_DIR, "readOnly": True})
        volumes.append({"name": "staging", "configMap": {"name": configmap}})
    labels = meta(name, access.namespace, role, run)["labels"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(name, access.namespace, role, run),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": HELPER_DEADLINE_S.get(role, HELPER_DEADLINE_DEFAULT_S),
            "ttlSecondsAfterFinished": 600,
            "template": {
                "metadata": {"labels": labels},
                "spec": restricted(
                    {
                        "restartPolicy": "Never",
                        "enableServiceLinks": False,
                        # The node environment it builds runs on the training nodes: their architecture.
                        "nodeSelector": {ARCH_LABEL: access.arch} if access.arch else {},
                        "containers": [
                            {
                                "name": role,
                                "image": DEFAULT_IMAGE,
                                "command": ["sh", "-c", script],
                                "workingDir": workdir,
                                "env": [
                                    {"name": "PYTHONPATH", "value": CODE_DIR},
                                    {"name": "PYTHONUNBUFFERED", "value": "1"},
                                ],
                                "volumeMounts": mounts,
                                "resources": HELPER_RESOURCES,
                            }
                        ],
                        "volumes": volumes,
                    }
                ),
            },
        },
    }


def node_program(module: str, args: list[str]) -> str:
    """`python -m module args` with the node environment, as a shell line."""
    return " ".join([NODE_PYTHON, "-m", module, *(shlex.quote(a) for a in args)])


def run_program(run: str, module: str, args: list[str]) -> str:
    """`python -m module args` with the venv and code the run staged (its STAGED_RECORD), as its pods
    ran them, not the newest staging's; the newest (node_program's) for a run staged before the record."""
    record = shlex.quote(run_path(run, STAGED_RECORD))
    return "; ".join(
        [
            f"py={NODE_PYTHON}; code={CODE_DIR}",
            f"if [ -f {record} ]; then while read -r entry; do case $entry in "
            f"venv-*) py={STORE}/$entry/bin/python;; code-*) code={STORE}/$entry;; esac; done < {record}; fi",
            " ".join(['PYTHONPATH="$code"', '"$py"', "-m", module, *(shlex.quote(a) for a in args)]),
        ]
    )


def store_prune_script(keep: list[str]) -> str:
    """Shell deleting the store entries no run uses: neither named by a run directory's STAGED_RECORD,
    nor by keep (what live Jobs' pods name), nor pointed at by <root>/venv and <root>/code, nor touched
    within STORE_GRACE_MIN (a staging under way); one `@freed ENTRY KB` line each. Left-over temporary
    builds (a staging that died) go the same way."""
    return (
        "\n".join(
            [
                f"cd {STORE} 2>/dev/null || exit 0",
                f"keep=' {' '.join(shlex.quote(k) for k in keep)} '",
                f"for f in {RUNS_DIR}/*/{STAGED_RECORD}; do",
                '  [ -f "$f" ] && keep="$keep $(tr \'\\n\' \' \' < "$f")"',
                "done",
                f"for l in {MOUNT_PATH}/venv {CODE_DIR}; do",
                '  [ -L "$l" ] && keep="$keep $(basename "$(readlink "$l")")"',
                "done",
                "for e in venv-* code-*; do",
                '  [ -e "$e" ] || continue',
                '  case "$keep " in *" $e "*) continue;; esac',
                f'  [ -n "$(find "$e" -maxdepth 0 -mmin -{STORE_GRACE_MIN})" ] && continue',
                '  kb=$(du -sk -- "$e" 2>/dev/null | cut -f1)',
                '  rm -rf -- "$e" 2>/dev/null; [ -e "$e" ] || echo "@freed $e ${kb:-0}"',
                "done",
            ]
        )
        + "\n"
    )


def prepare_script(args: list[str], env: dict[str, str] | None = None) -> str:
    """model.prepare in the claim's root (the Job's working directory), with env (NAME -> value) in its
    environment: it makes data/ itself, and removes it again when the preparation fails."""
    assignments = "".join(f"{name}={shlex.quote(value)} " for name, value in (env or {}).items())
    return f"set -eu\n{assignments}{node_program('model.prepare', args)}\n"


def run_path(run: str, name: str) -> str:
    return f"{run_dir(MOUNT_PATH, run)}/{name}"


def dataset_path(dataset: str) -> str:
    return data_dir(MOUNT_PATH, dataset)
