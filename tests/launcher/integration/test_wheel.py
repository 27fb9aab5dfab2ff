"""The project as a new user meets it: the wheel built from this checkout, installed into a fresh venv
outside the checkout beside the user's own `model` and `launcher` packages, and the `nanocluster`
command run from an empty directory with a fresh home: every task of a first run (prepare-data,
train, status, logs, sample, fetch, cost), then every command those outputs suggest. Everything it
writes goes under NANOCLUSTER_HOME (and the vocabulary under the fresh HOME's cache); the directory
it runs from stays empty.

The fresh venv gets only the two wheels (--no-deps): nanocluster's dependencies are this test's own
venv's, linked into the fresh site-packages one entry each, so nothing is downloaded. (A .pth naming
this venv's site-packages would not do: the local cluster's probe reads site-packages without
running .pth files, as a node's Python would.) The GPT-2 vocabulary is fetched the way a first
prepare-data fetches it, from a stand-in for its PyPI source (a file:// URL): never the network.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.cluster.node_layout import REPO_ROOT
from model import tokenizer
from tests.launcher.test_fabfile import TASKS

pytestmark = pytest.mark.integration

PROGRAM = "nanocluster"
TOP_LEVEL_LEFT_OUT = {".venv", ".git", "build", "tests", "docs", "bench", "data", "runs"}
"""The checkout's directories left out of the copy the wheel is built from (pip builds in the source
tree, so the copy keeps the checkout clean); model/data and launcher/runs are packages, kept."""
USERS_PACKAGES = ("model", "launcher", "infra", "node")
"""Top-level names a user may well have packages of: the repository's own directory names."""


def left_out(directory: str, names: list[str]) -> set[str]:
    top = {n for n in names if n in TOP_LEVEL_LEFT_OUT} if Path(directory) == REPO_ROOT else set()
    return top | {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}


TINY = (
    "max_iters=4",
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=32",
    "block_size=32",
    "batch_size=2",
    "warmup_iters=1",
    "eval_interval=4",
    "eval_iters=2",
    "log_interval=1",
    "peak_flops=1e12",
    "threads=1",
)
"""Overrides of the quickstart config that make a 2-rank run a few steps of a 1-layer model."""


def timed(what: str, command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    print(f"{what}: {time.monotonic() - started:.1f} s (exit {result.returncode})")
    assert result.returncode == 0, f"{what} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def build_wheel(source: Path, into: Path) -> Path:
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    timed(f"pip wheel {source.name}", [*pip_wheel, str(source), "-w", str(into)], timeout=300)
    (wheel,) = into.glob(f"{source.name}-*.whl")
    return wheel


def users_package(root: Path, name: str, owner: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"OWNER = {owner!r}\n")


def users_distribution(work: Path) -> Path:
    """The user's own wheel, named `model`, holding top-level `model` and `launcher` packages."""
    source = work / "model"
    for name in ("model", "launcher"):
        users_package(source, name, "the user's wheel")
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "model"\nversion = "1.0"\n'
        '[tool.setuptools]\npackages = ["model", "launcher"]\n'
    )
    return build_wheel(source, work / "dist")


def whisper_sdist(path: Path) -> Path:
    """A stand-in for the openai-whisper sdist on PyPI: the GPT-2 vocabulary this machine's `make setup`
    placed, where the real one holds it."""
    ranks = tokenizer.cached_vocab_path(tokenizer.DEFAULT_CACHE_DIR).read_bytes()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(f"openai_whisper-0/{tokenizer.WHISPER_MEMBER}")
        info.size = len(ranks)
        tar.addfile(info, io.BytesIO(ranks))
    return path


@dataclass(frozen=True)
class Installed:
    bin: Path
    site_packages: Path
    users_path: Path
    """A PYTHONPATH directory of the user's, with packages named like the repository's."""
    vocab_url: str


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Iterator[Installed]:
    """A fresh venv holding nanocluster's wheel and then the user's `model` wheel; beside it, a PYTHONPATH
    directory with the user's own model, launcher, infra and node packages."""
    work = tmp_path_factory.mktemp("wheel")
    source, env = work / "nanocluster", work / "venv"
    shutil.copytree(REPO_ROOT, source, ignore=left_out)
    ours, theirs = build_wheel(source, work / "dist"), users_distribution(work / "user")
    timed("python -m venv", [sys.executable, "-m", "venv", "--without-pip", str(env)], timeout=120)
    site_packages = Path(
        subprocess.run(
            [str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
    )
    shared = Path(sysconfig.get_path("purelib"))
    for entry in shared.iterdir():  # this venv's dependencies, without its own (editable) nanocluster
        if not entry.name.startswith(("nanocluster", "__editable__")):
            (site_packages / entry.name).symlink_to(entry)
    pip_install = [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "--quiet"]
    for wheel in (ours, theirs):  # the user's after ours: what it overwrites would be ours
        timed(f"pip install {wheel.name}", [*pip_install, "--no-deps", "--no-compile", str(wheel)], timeout=300)
    users_path = work / "pythonpath"
    for name in USERS_PACKAGES:
        users_package(users_path, name, "the user's PYTHONPATH")
    vocab_url = whisper_sdist(work / "openai_whisper-0.tar.gz").as_uri()
    yield Installed(env / "bin", site_packages, users_path, vocab_url)
    shutil.rmtree(work)


def record(site_packages: Path, distribution: str) -> list[list[str]]:
    (dist_info,) = site_packages.glob(f"{distribution}-*.dist-info")
    return list(csv.reader((dist_info / "RECORD").read_text().splitlines()))


def test_the_wheel_adds_no_top_level_package_and_keeps_the_users(installed, tmp_path):
    ours = record(installed.site_packages, "nanocluster")
    tops = {Path(path).parts[0] for path, *_ in ours}
    assert tops == {"nanocluster", "nanocluster-0.1.0.dist-info", ".."}, tops  # ..: the bin/nanocluster script
    for path, digest, _size in ours:  # the user's wheel, installed after, overwrote none of it
        if digest:
            data = (installed.site_packages / path).read_bytes()
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert not {path for path, *_ in ours} & {path for path, *_ in record(installed.site_packages, "model")}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    owners = "import model, launcher, nanocluster; print(model.OWNER, '|', launcher.OWNER, '|', nanocluster.__file__)"
    seen = timed("the user's python", [str(installed.bin / "python"), "-c", owners], 60, cwd=tmp_path, env=env)
    ours_init = f"{installed.site_packages}/nanocluster/__init__.py"
    assert seen.stdout.strip().split(" | ") == ["the user's wheel", "the user's wheel", ours_init]
    listing = timed(f"{PROGRAM} -l", [str(installed.bin / PROGRAM), "-l"], 60, cwd=tmp_path, env=env).stdout
    assert {line.split()[0] for line in listing.splitlines() if re.match(r"  \S", line)} >= set(TASKS)


@dataclass(frozen=True)
class Walk:
    home: Path
    cwd: Path
    env: dict[str, str]
    outputs: dict[str, str]
    """Each command as typed (without the program name) -> its stdout and stderr."""
    tasks: set[str]


@pytest.fixture(scope="module")
def walk(installed, tmp_path_factory) -> Walk:
    """A new user's first run, from an empty directory, with the user's packages on PYTHONPATH."""
    base = tmp_path_factory.mktemp("user")
    cwd, home, user_home = base / "cwd", base / "nanocluster-home", base / "home"
    cwd.mkdir()
    user_home.mkdir()
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "TIKTOKEN_CACHE_DIR", "XDG_CACHE_HOME")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("NANOCLUSTER_")}
    env |= {
        "HOME": str(user_home),
        "NANOCLUSTER_HOME": str(home),
        "PYTHONPATH": str(installed.users_path),
        tokenizer.SOURCE_ENV: installed.vocab_url,
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
    }
    outputs: dict[str, str] = {}

    def run(*args: str, timeout: float = 120) -> str:
        command = [str(installed.bin / PROGRAM), *args]
        result = timed(f"{PROGRAM} {' '.join(args[:3])}", command, timeout, cwd=cwd, env=env)
        outputs[shlex.join(args)] = result.stdout + result.stderr
        return result.stdout + result.stderr

    listing = run("-l")
    run("prepare-data")
    run("train", "--nodes", "2", *(a for o in TINY for a in ("--set", o)), timeout=300)
    for task in ("status", "logs", "sample", "fetch", "export", "cost"):
        run(task)
    tasks = {line.split()[0] for line in listing.splitlines() if re.match(r"  \S", line)}  # not wrapped help
    return Walk(home, cwd, env, outputs, tasks)


def test_a_new_user_runs_every_task_from_an_empty_directory(walk, installed):
    home, out = walk.home, walk.outputs
    assert walk.tasks >= set(TASKS)
    fetching = [line for line in out["prepare-data"].splitlines() if "fetching the GPT-2 vocabulary" in line]
    assert len(fetching) == 1 and installed.vocab_url in fetching[0], out["prepare-data"]
    vocab = Path(walk.env["HOME"]) / ".cache" / "nanocluster" / "tiktoken"
    assert tokenizer.cached_vocab_path(vocab).is_file()
    train = next(text for command, text in out.items() if command.startswith("train "))
    assert "done in " in train and "iter 4" in train
    assert (home / "runs" / "main" / "ckpt.pt").stat().st_size > 0
    assert (home / "clusters" / "local" / "runs" / "main" / "metrics.jsonl").read_text().strip()
    assert "main" in out["status"] and "[rank 1" in out["logs"]
    assert out["sample"].strip()
    assert f"fetched into {home / 'clusters' / 'local' / 'fetched' / 'main'}" in out["fetch"]
    assert (home / "clusters" / "local" / "fetched" / "main" / "ckpt.pt").exists()
    assert "main" in out["cost"]
    assert list(walk.cwd.iterdir()) == []


def test_the_trainers_programs_run_by_hand_from_the_installed_package(walk, installed, tmp_path):
    """As docs/training.md gives them, beside the user's own `model` on PYTHONPATH."""
    fetched = walk.home / "clusters" / "local" / "fetched" / "main"
    assert sorted(p.name for p in (fetched / "hf").iterdir()) == ["config.json", "model.safetensors"]
    python = str(installed.bin / "python")
    exported = tmp_path / "gpt2-finetuned"
    export = [python, "-m", "nanocluster.model.export", "--ckpt", str(fetched / "ckpt.pt"), "--out", str(exported)]
    timed("python -m nanocluster.model.export", export, 120, cwd=walk.cwd, env=walk.env)
    assert sorted(p.name for p in exported.iterdir()) == ["config.json", "model.safetensors"]
    sample = [python, "-m", "nanocluster.model.sample", "--ckpt", str(fetched / "ckpt.pt"), "--max-new-tokens", "5"]
    assert timed("python -m nanocluster.model.sample", sample, 120, cwd=walk.cwd, env=walk.env).stdout.strip()
    assert list(walk.cwd.iterdir()) == []


PLACEHOLDER = re.compile(r"<|(?:^|[\s=])[A-Z][A-Z_]*(?:\s|$)")
"""A word the reader fills in (SOURCE, N, <more than 2.00>): such a hint is shown, not run."""


def hints(text: str, tasks: set[str], program: str = PROGRAM) -> list[str]:
    """The commands a text suggests, each as typed after the program's name: `program TASK ARGS` up to a
    backtick, parenthesis, comma, semicolon, " / " or the line's end."""
    found = []
    pattern = re.compile(rf"(?<![\w/.~$-]){re.escape(program)} ([a-z][a-z-]*(?:(?! / )[^`(),;\n])*)")
    for match in pattern.finditer(text):
        command = match.group(1).strip().rstrip(".:").strip()
        if command.split()[0] in tasks and command not in found:
            found.append(command)
    return found


def test_hints_are_found_where_the_outputs_put_them():
    tasks = {"sample", "fetch", "train", "status", "stop", "prepare-data"}
    text = (
        "best checkpoint runs/main/ckpt.pt on this machine (nanocluster sample, nanocluster fetch)\n"
        "its model: nanocluster sample --run a, nanocluster fetch --run a; to train further rerun with --set x\n"
        "stop what holds port 1 (a running job: nanocluster status / nanocluster stop) or pass --port\n"
        "no run 'b': start one with `nanocluster train --run b`. data in ~/nanocluster/data, $NANOCLUSTER_HOME\n"
        "run `nanocluster prepare-data --sharded --nodes 3` again; the nanocluster home is ~/nanocluster\n"
    )
    assert hints(text, tasks) == [
        "sample",
        "fetch",
        "sample --run a",
        "fetch --run a",
        "status",
        "stop",
        "train --run b",
        "prepare-data --sharded --nodes 3",
    ]
    assert PLACEHOLDER.search("train --run a --budget <more than 2.00>")
    assert PLACEHOLDER.search("prepare-data --source SOURCE --dataset b")
    assert not PLACEHOLDER.search("train --run main --set max_iters=8")


def test_every_hint_names_the_program_and_runs(walk, installed):
    """Outside a checkout there is no `fab`: every command an output suggests is `nanocluster ...`, and
    each one runs as it is printed."""
    with_fab = [line for text in walk.outputs.values() for line in text.splitlines() if re.search(r"\bfab\b", line)]
    suggested = [h for text in walk.outputs.values() for h in hints(text, walk.tasks)]
    runnable = list(dict.fromkeys(h for h in suggested if not PLACEHOLDER.search(h)))
    print(f"hints run: {runnable}; shown only: {sorted(set(suggested) - set(runnable))}")
    failed = []
    for hint in runnable:
        result = subprocess.run(
            [str(installed.bin / PROGRAM), *shlex.split(hint)],
            cwd=walk.cwd,
            env=walk.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            failed.append(f"{PROGRAM} {hint}: exit {result.returncode}\n{result.stdout[-1500:]}{result.stderr[-1500:]}")
    assert not failed, "\n".join(failed)
    assert not with_fab, "outputs outside a checkout name fab:\n" + "\n".join(with_fab)
    assert runnable, f"no output suggested a `{PROGRAM}` command:\n" + "\n".join(walk.outputs.values())
    assert list(walk.cwd.iterdir()) == []
