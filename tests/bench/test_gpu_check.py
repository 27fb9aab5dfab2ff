"""bench/gpu_check.sh's own plumbing, on a CPU: a stand-in python plays a CUDA machine whose programs
print what the script reads, so the parts' order, their verdicts, the summary and the exit code are
checked here; what the parts measure needs a GPU (the script itself, on one)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FAKE_PYTHON = r"""#!/usr/bin/env bash
# Plays python for bench/gpu_check.sh on a machine with one CUDA GPU.
if [ "$1" = -c ]; then
    case "$2" in
        *get_device_name*)
            if [ -n "${FAKE_NO_GPU:-}" ]; then
                echo "no GPU; torch 2.13.0+cpu, CUDA None, cuda available: False"
                exit 4
            fi
            echo "Fake H100 (capability (9, 0)); torch 2.13.0, CUDA 13.0, cuda available: True" ;;
        *write_split*) mkdir -p "$3" ;;
    esac
    exit 0
fi
if [ "$1 $2" = "-m pytest" ]; then
    # As pytest -v under pytest-xdist prints. Passes only when a training run started while it ran: the
    # resume and sample parts run beside it.
    echo "4 workers [13 items]"
    echo "[gw0] [  7%] PASSED tests/model/test_gpu.py::test_one"
    echo "[gw1] [ 15%] PASSED tests/model/test_gpu.py::test_two"
    [ -n "${FAKE_TESTS_CUT_SHORT:-}" ] && exit 124  # what `timeout` returns when the part's time ran out
    if [ -n "${FAKE_TESTS_USAGE:-}" ]; then echo "ERROR: unrecognized arguments: --fake"; exit 4; fi
    for _ in $(seq 300); do
        [ -e "$FAKE_MARKS/trained" ] && { echo "======== 13 passed in 3.00s ========"; exit 0; }
        sleep 0.1
    done
    echo "======== 1 failed in 30.00s ========"
    exit 1
fi
if [ "$1 $2" = "-m model.train" ]; then
    touch "$FAKE_MARKS/trained"
    for arg; do case $arg in out_dir=*) out=${arg#out_dir=} ;; max_iters=*) iters=${arg#max_iters=} ;; esac; done
    mkdir -p "$out"
    [ -f "$out/at" ] && echo "[rank 0 fake] resumed from $out/snapshot.pt at iteration $(cat "$out/at")"
    echo "[rank 0 fake] iter $iters: loss 3.0000"
    echo "$iters" >"$out/at"
    touch "$out/snapshot.pt"
    # FAKE_RESUME_DRIFT: the resumed run ends with other weights than the uninterrupted one.
    digest=$(echo "$iters${FAKE_RESUME_DRIFT:+${out##*/}}" | sha256sum | cut -c1-16)
    echo "[rank 0 fake] final parameters sha256 $digest"
    exit 0
fi
if [ "$1 $2" = "-m model.sample" ]; then
    echo "The import statement imports a fake module"
    exit 0
fi
if [ "$1" = bench/gpu_vs_nanogpt.py ]; then
    echo "gpu_vs_nanogpt: 1.10x stock nanoGPT's tokens/s (MFU 40.0% vs 36.4%)"
    echo "gpu_vs_nanogpt in nanoGPT's shape: 1.12x stock nanoGPT's tokens/s (MFU 40.8% vs 36.4%)"
    exit 0
fi
echo "fake python: unexpected arguments: $*" >&2
exit 3
"""


def run_check(tmp_path: Path, *, nanogpt: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    marks = tmp_path / "marks"
    marks.mkdir()
    checkout = tmp_path / "nanogpt"
    checkout.mkdir()
    if nanogpt:
        (checkout / "train.py").write_text("")
    return subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "TMPDIR": str(tmp_path),
            "PYTHON": str(python),
            "NANOGPT": str(checkout),
            "FAKE_MARKS": str(marks),
            **env,
        },
    )


def summary(stdout: str) -> list[list[str]]:
    """The summary's rows, each [part, status, seconds, figure...]."""
    rows = stdout.split("== summary", 1)[1].splitlines()[1:-1]
    return [row.replace("gpu tests", "gpu-tests").replace("vs nanoGPT", "vs-nanoGPT").split() for row in rows]


def test_every_part_passes_and_resume_and_sample_run_beside_the_gpu_tests(tmp_path):
    check = run_check(tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    rows = summary(check.stdout)
    assert [row[:2] for row in rows] == [
        ["environment", "PASS"],
        ["gpu-tests", "PASS"],
        ["resume", "PASS"],
        ["sample", "PASS"],
        ["vs-nanoGPT", "PASS"],
    ]
    assert all(row[2].endswith("s") and row[2][:-1].isdigit() for row in rows)
    assert check.stdout.rstrip().endswith("gpu_check: PASS")
    # The background parts' output is printed under their own headings, after the tests.
    tests_at, resume_at, sample_at, bench_at = (
        check.stdout.index(heading) for heading in ("== 2. gpu tests", "== 3. resume", "== 4. sample", "== 5. vs")
    )
    assert tests_at < resume_at < sample_at < bench_at
    assert "iter 8: loss" in check.stdout[resume_at:sample_at]
    assert "The import statement imports a fake module" in check.stdout[sample_at:bench_at]
    # The goal's figure, the same model on both sides, is in the summary.
    assert "in nanoGPT's shape: 1.12x" in " ".join(rows[-1])


def test_a_resume_that_ends_elsewhere_fails_its_part_and_the_check(tmp_path):
    check = run_check(tmp_path, FAKE_RESUME_DRIFT="1")
    assert check.returncode == 1
    rows = {row[0]: row for row in summary(check.stdout)}
    assert rows["resume"][1] == "FAIL"
    assert "vs uninterrupted" in " ".join(rows["resume"])
    assert [rows[part][1] for part in ("environment", "gpu-tests", "sample", "vs-nanoGPT")] == ["PASS"] * 4
    assert check.stdout.rstrip().endswith("gpu_check: FAIL")


def test_without_a_nanogpt_checkout_that_part_fails_naming_the_fix(tmp_path):
    check = run_check(tmp_path, nanogpt=False)
    assert check.returncode == 1
    rows = {row[0]: row for row in summary(check.stdout)}
    assert rows["vs-nanoGPT"][1] == "FAIL"
    assert "copy one to ./.nanogpt or set NANOGPT=" in " ".join(rows["vs-nanoGPT"])


def test_gpu_tests_cut_short_say_how_far_they_got_and_the_other_parts_still_run(tmp_path):
    check = run_check(tmp_path, FAKE_TESTS_CUT_SHORT="1")
    assert check.returncode == 1
    rows = {row[0]: row for row in summary(check.stdout)}
    assert " ".join(rows["gpu-tests"][1:2] + rows["gpu-tests"][3:]) == (
        "FAIL timed out: 2 of 13 passed, 0 failed, the rest unfinished"
    )
    assert [rows[part][1] for part in ("environment", "resume", "sample", "vs-nanoGPT")] == ["PASS"] * 4


def test_without_a_gpu_it_refuses_in_one_line_before_any_part(tmp_path):
    check = run_check(tmp_path, FAKE_NO_GPU="1")
    assert check.returncode == 2
    assert "gpu_check: refused: torch sees no CUDA GPU here (no GPU; torch 2.13.0+cpu" in check.stdout
    assert "== 2." not in check.stdout and not (tmp_path / "marks" / "trained").exists()


def test_tests_that_end_on_an_error_say_it_not_that_they_were_cut_short(tmp_path):
    check = run_check(tmp_path, FAKE_TESTS_USAGE="1")
    rows = {row[0]: row for row in summary(check.stdout)}
    assert " ".join(rows["gpu-tests"][1:2] + rows["gpu-tests"][3:]) == (
        "FAIL exit 4: ERROR: unrecognized arguments: --fake"
    )


def test_a_python_that_does_not_run_is_refused_naming_the_fix_before_any_part(tmp_path):
    check = run_check(tmp_path, PYTHON=str(tmp_path / "no-such-python"))
    assert check.returncode == 2
    last = check.stdout.strip().splitlines()[-1]
    assert last.startswith(f"gpu_check: refused: {tmp_path / 'no-such-python'} did not run (exit 127: ")
    assert last.endswith("or set PYTHON=/path/to/python") and "== 2." not in check.stdout
