"""Stock nanoGPT's train.py against `python -m model.train`, side by side on one CUDA GPU.

    python bench/gpu_vs_nanogpt.py --nanogpt /path/to/nanoGPT [--rounds 2] [--steps 10] [--batch-size 12]

Both train GPT-2 small from scratch (12 layers x 768, block 1024, no gradient accumulation) with the
same micro-batch (default 12 sequences, nanoGPT's own default for GPT-2 small, which fits a 40 GB
GPU with room to spare and an 80 GB one easily), both compiled (torch.compile), both in bf16 autocast,
on the same synthetic tokens (uniform random GPT-2 ids, written once as the uint16 train.bin/val.bin
both programs read), in rounds whose order rotates. Each round starts the programs in batches of --ahead
(default 4), each batch compiled at once and then timed one program at a time, the others paused
(bench/compile_ahead.py: compiling is most of a GPU comparison's wall time). nanoGPT runs
from the directory given (its train.py, model.py and configurator.py; never copied here) with
device=cuda, dtype=bfloat16, compile=True. The trainer runs with device=cuda, mixed_precision=bf16,
compile=true (and so, in one process, CUDA graphs: cuda_graphs auto). Shape arguments differ only
where the programs' own defaults do: nanoGPT pads the vocabulary to 50,304 and has no biases; the
trainer keeps GPT-2's 50,257 and biases.

Each program's step time is what it logs per iteration; the steps before its pause and the first
--warmup after it are left out and the median of the next --steps is kept, then the process is killed
(neither writes a checkpoint). Tokens/s = micro-batch x 1024 / step time. MFU, for both, is
tokens/s x F / peak with one F: nanoGPT's estimate_mfu formula 6N + 12·L·H·Q·T (PaLM appendix B),
N = GPT-2 small's parameters less the position embedding as the trainer counts them (123.7M), so the
two MFUs differ exactly as the tokens/s do; the peak is --peak-tflops, by default 989 TFLOP/s, an H100
SXM's dense bf16. The summary line compares the two at their own defaults, which are two models;
with --shape (nanoGPT in GPT-2's shape) and with the nobias variant (the trainer in nanoGPT's) a line
each compares the same model on both sides. Without a CUDA GPU it refuses in one line.

--diagnose adds the trainer with one thing changed, to tell what each is worth: without its per-step
health work (health.interval=0 health.guard=false: no statistics, no step guard), with the plain loss
(fused_loss=false: the logits, then F.cross_entropy, as nanoGPT computes it), with Inductor's C++
wrapper (TORCHINDUCTOR_CPP_WRAPPER=1: the compiled kernels launched from C++, not Python; slower to
compile), with deterministic=true (what exact resume on a GPU costs), in nanoGPT's shape
(model.bias=false), without CUDA graphs (cuda_graphs=false: what they are worth), with choices the
trainer leaves out: max-autotune (TORCHINDUCTOR_MAX_AUTOTUNE=1, kernels picked by timing),
coordinate-descent tuning (TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1: block sizes refined by timing) and
Programmatic Dependent Launch on Hopper (TORCHINDUCTOR_ENABLE_PDL=1: a kernel starts while the one before
it drains), and with
Triton GEMM templates chosen by rule under deterministic=true (tritongemm). A variant
that fails or outlasts --timeout is left out with one line. --shape adds nanoGPT in
the trainer's shape (GPT-2's 50,257-word vocabulary, read from a meta.pkl beside the tokens as nanoGPT
does, and biases).
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.checkouts import rotated  # noqa: E402
from bench.compile_ahead import measure  # noqa: E402
from bench.vs_nanogpt import (  # noqa: E402
    NANOGPT_FILES,
    NANOGPT_STEP,
    TRAINER_STEP,
    Program,
    gpt2_small_run,
    nanogpt_arguments,
    synthetic_tokens,
    trainer_overrides,
)
from model.gpt.model import GPT, GPTConfig  # noqa: E402
from model.monitoring.mfu import datasheet_peak  # noqa: E402
from model.tokenizer import VOCAB_SIZE  # noqa: E402

BLOCK, LAYERS, HEADS, WIDTH = 1024, 12, 12, 768
SYNTHETIC_TOKENS = 4_000_000  # more than 24 steps of 16 x 1024 tokens read at random offsets
H100_SXM_BF16_PEAK_TFLOPS = 989.0
"""An H100 SXM's dense bf16 tensor-core peak (NVIDIA's datasheet: 1,979 TFLOP/s with sparsity)."""


def flops_per_token() -> int:
    """6N + 12·L·H·Q·T for GPT-2 small at block 1024, N counted by model.gpt.model (built on the meta
    device: no memory, no initialisation)."""
    with torch.device("meta"):
        model = GPT(GPTConfig(n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH, block_size=BLOCK, vocab_size=VOCAB_SIZE))
    return model.flops_per_token(BLOCK)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--nanogpt", required=True, type=Path, help="a nanoGPT checkout (train.py, model.py, configurator.py)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of both programs")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per program and round")
    parser.add_argument(
        "--warmup", type=int, default=3, help="steps left out after a program's pause (the pause's, graph recordings)"
    )
    parser.add_argument("--batch-size", type=int, default=12, help="micro-batch (sequences of 1024) for both")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the GPU's dense bf16 peak MFU is against (default: the trainer's data sheet table for this GPU, "
        f"model/monitoring/mfu.py; {H100_SXM_BF16_PEAK_TFLOPS:g}, an H100 SXM's, for a GPU not in it)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds a program may take to compile, and again to take its steps"
    )
    parser.add_argument(
        "--ahead",
        type=int,
        default=4,
        help="programs compiled at once, each then timed alone (default %(default)s: GPT-2 small at micro-batch 12 "
        "holds ~15 GB of GPU memory each, paused; 1: one after another)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="no program runs past this many seconds after the start (nanoGPT's and the trainer's first figures "
        "excepted): what it leaves out is said and the summary still printed (for a call with a hard limit)",
    )
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="also the trainer with one choice changed (--variants)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(name.removeprefix("nanocluster-") for name in TRAINER_VARIANTS),
        help="with --diagnose, which trainer variants (default: all of %(default)s); a+b changes both at once",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a trainer setting for every trainer run, the variants too (e.g. cuda_graphs=false)",
    )
    parser.add_argument("--shape", action="store_true", help="also nanoGPT in GPT-2's shape (50,257 words, biases)")
    args = parser.parse_args()
    missing = [f for f in NANOGPT_FILES if not (args.nanogpt / f).is_file()]
    if missing:
        parser.error(f"--nanogpt {args.nanogpt}: no {', '.join(missing)} there; give a nanoGPT checkout's directory")
    known = [name.removeprefix("nanocluster-") for name in TRAINER_VARIANTS]
    unknown = [part for v in args.variants.split(",") for part in v.split("+") if part not in known]
    if unknown:
        parser.error(f"--variants: no variant {', '.join(unknown)}; choose among {','.join(known)} (a+b for both)")
    malformed = [setting for setting in args.settings if "=" not in setting.strip("=")]
    if malformed:
        parser.error(f"--set {malformed[0]}: give KEY=VALUE, a trainer setting such as cuda_graphs=false")
    if min(args.rounds, args.steps, args.warmup, args.batch_size, args.ahead) < 1 or (
        args.peak_tflops is not None and args.peak_tflops <= 0
    ):
        parser.error("--rounds, --steps, --warmup, --batch-size, --ahead and --peak-tflops must be positive")
    if args.deadline is not None and args.deadline <= 0:
        parser.error(f"--deadline {args.deadline:g}: give the seconds the whole comparison may take, more than 0")

    if not torch.cuda.is_available():
        sys.exit(
            f"gpu_vs_nanogpt: refused: torch {torch.__version__} sees no CUDA GPU; this benchmark needs one "
            "(bench/vs_nanogpt.py compares on the CPU)"
        )

    gpu = torch.cuda.get_device_name(0)
    print(f"GPU: {gpu}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    args.peak_tflops, note = peak_tflops(gpu, args.peak_tflops)
    if note:
        print(note)
    with tempfile.TemporaryDirectory(prefix="gpu-vs-nanogpt-") as work:
        compare(args, gpu, Path(work))


def peak_tflops(gpu: str, given: float | None) -> tuple[float, str | None]:
    """MFU's peak: --peak-tflops when given, else the trainer's data sheet figure for the GPU (the one its
    own MFU uses), else an H100 SXM's with a note saying so."""
    if given is not None:
        return given, None
    sheet = datasheet_peak(gpu, torch.bfloat16)
    if sheet is not None:
        return sheet / 1e12, None
    return H100_SXM_BF16_PEAK_TFLOPS, (
        f"note: {gpu} is not in the data sheet table: MFU is against an H100 SXM's "
        f"{H100_SXM_BF16_PEAK_TFLOPS:g} TFLOP/s (--peak-tflops sets it)"
    )


def compare(args: argparse.Namespace, gpu: str, work: Path) -> None:
    data = synthetic_tokens(work, SYNTHETIC_TOKENS)
    shape = gpt2_small_run(args.batch_size)
    nanogpt = Program(
        "nanoGPT",
        [
            sys.executable,
            str((args.nanogpt / "train.py").resolve()),
            "--device=cuda",
            "--dtype=bfloat16",
            "--compile=True",
            f"--dataset={data}",
            f"--out_dir={work / 'nanogpt-out'}",
            "--always_save_checkpoint=False",
            *nanogpt_arguments(shape),
        ],
        args.nanogpt.resolve(),  # it reads configurator.py from its working directory
        NANOGPT_STEP,
        precision="bf16 autocast, compile true",
    )
    ours = Program(
        "nanocluster",
        [
            sys.executable,
            "-m",
            "model.train",
            "init_from=scratch",
            "device=cuda",
            "mixed_precision=bf16",
            "compile=true",
            f"peak_flops={args.peak_tflops * 1e12:g}",  # no matmul peak measured at start
            f"data_dir={data}",
            f"out_dir={work / 'nanocluster-out'}",
            *trainer_overrides(shape),
            *args.settings,
        ],
        REPO,
        TRAINER_STEP,
        env={"PYTHONPATH": str(REPO)},
    )
    programs = [nanogpt, ours]
    if args.diagnose:
        programs += trainer_variants(ours, work, args.variants.split(","))
    if args.shape:
        programs.append(nanogpt_in_gpt2_shape(nanogpt, data, work))
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    measure_rounds(programs, args, env)
    programs = [program for program in programs if program.steps_ms]

    flops = flops_per_token()
    peak = args.peak_tflops * 1e12
    tokens_per_step = args.batch_size * BLOCK
    print(
        f"GPT-2 small {LAYERS}x{WIDTH}, block {BLOCK}, micro-batch {args.batch_size}, {args.rounds} rounds x "
        f"{args.steps} steps; MFU = tokens/s x {flops / 1e6:.1f} MFLOP/token (6N + 12LHQT) "
        f"/ {args.peak_tflops:g} TFLOP/s"
    )
    print(f"{'program':<22}{'precision':<44}{'ms/step':>9}{'tokens/s':>11}{'MFU':>8}")
    rates, mfu = {}, {}  # tokens/s and MFU (%) by program
    for program in programs:
        ms = statistics.median(program.steps_ms)
        rates[program.name] = tokens_per_step * 1000 / ms
        mfu[program.name] = 100 * rates[program.name] * flops / peak
        print(
            f"{program.name:<22}{program.precision:<44}{ms:>9.1f}{rates[program.name]:>11.0f}{mfu[program.name]:>7.1f}%"
        )
    ratio = rates["nanocluster"] / rates["nanoGPT"]
    print(
        f"gpu_vs_nanogpt: {ratio:.2f}x stock nanoGPT's tokens/s ({rates['nanocluster']:.0f} vs "
        f"{rates['nanoGPT']:.0f}; MFU {mfu['nanocluster']:.1f}% vs "
        f"{mfu['nanoGPT']:.1f}% of {args.peak_tflops:g} TFLOP/s) on {gpu}, "
        f"micro-batch {args.batch_size}, bf16, compiled"
    )
    for name, rate in rates.items():
        if name.startswith("nanocluster-"):
            print(
                f"diagnosis: {name} runs at {rate / rates['nanocluster']:.3f}x the trainer's tokens/s "
                f"({rate / rates['nanoGPT']:.3f}x nanoGPT's, MFU {mfu[name]:.1f}%)"
            )

    def same_model(shape: str, ours: str, theirs: str) -> None:
        """The trainer and nanoGPT on one model, each side's figures as measured."""
        print(
            f"gpu_vs_nanogpt in {shape} shape: {rates[ours] / rates[theirs]:.3f}x nanoGPT's tokens/s on the same "
            f"model ({rates[ours]:.0f} vs {rates[theirs]:.0f}; MFU {mfu[ours]:.1f}% vs {mfu[theirs]:.1f}%)"
        )

    if "nanocluster-nobias" in rates:  # nanoGPT's model: no biases, 50,304 rows
        same_model("nanoGPT's", "nanocluster-nobias", "nanoGPT")
    if "nanoGPT-gpt2" in rates:
        print(
            f"diagnosis: nanoGPT in GPT-2's shape runs at {rates['nanoGPT-gpt2'] / rates['nanoGPT']:.3f}x its own "
            f"shape's tokens/s"
        )
        same_model("GPT-2's", "nanocluster", "nanoGPT-gpt2")  # the trainer's default model


def measure_rounds(programs: list[Program], args: argparse.Namespace, env: dict[str, str]) -> None:
    """args.rounds rounds; in each, the programs in batches of args.ahead, each batch compiled at once
    and timed one program at a time (bench.compile_ahead), nanoGPT and the trainer in the first. Those
    two failing before either has a figure ends the comparison; otherwise what fails, or what --deadline
    leaves no time for, is left out of that round with one line, its earlier rounds' figures kept."""
    started, left_out = time.monotonic(), set[str]()
    until = math.inf if args.deadline is None else started + args.deadline
    compared = {program.name for program in programs[:2]}  # without these two there is no comparison
    for round_ in range(args.rounds):
        for first in range(0, len(programs), args.ahead):
            batch = [p for p in programs[first : first + args.ahead] if p.name not in left_out]
            if not batch:
                continue
            first_figures = any(p.name in compared and not p.steps_ms for p in batch)
            if until - time.monotonic() < 10 and not first_figures:
                for program in batch:
                    print(f"{program.name}: left out of round {round_ + 1}: --deadline {args.deadline:g} s reached")
                    left_out.add(program.name)
                continue
            # Each round times the batch in another order, as the machine's speed may drift. The first
            # figures of nanoGPT and the trainer are taken whatever the deadline.
            failures = measure(
                rotated(batch, round_), env, args.warmup, args.steps, args.timeout, math.inf if first_figures else until
            )
            for program in batch:
                if program.name in failures:
                    if program.name in compared and not program.steps_ms:
                        sys.exit(f"error: {program.name} {failures[program.name]}")
                    print(f"{program.name}: left out of round {round_ + 1}: {failures[program.name].splitlines()[0]}")
                    left_out.add(program.name)
                else:
                    median = statistics.median(program.steps_ms[-args.steps :])
                    print(f"round {round_ + 1}: {program.name} median {median:.1f} ms/step")


TRAINER_VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "nanocluster-bare": (["health.interval=0", "health.guard=false"], {}),
    # The logits, then F.cross_entropy (torch.compile's kernels) instead of the fused Triton loss.
    "nanocluster-plainloss": (["fused_loss=false"], {}),
    # Inductor's C++ wrapper launches the compiled kernels from C++ rather than Python.
    "nanocluster-cppwrapper": ([], {"TORCHINDUCTOR_CPP_WRAPPER": "1"}),
    # What exact resume on a GPU costs: deterministic algorithms, Inductor's kernels chosen by rule.
    "nanocluster-deterministic": (["deterministic=true"], {}),
    # nanoGPT's own shape (no biases; both pad the output projection to 50,304 rows): the same model.
    "nanocluster-nobias": (["model.bias=false"], {}),
    # What CUDA graphs (on in one process) are worth: each kernel launched on its own instead.
    "nanocluster-nographs": (["cuda_graphs=false"], {}),
    # What the choices the trainer leaves out would be worth. max-autotune (GEMM templates with the
    # bias and GELU in their epilogues) picks kernels by timing, so a resumed run would no longer match
    # bit for bit.
    "nanocluster-autotune": ([], {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}),
    # Programmatic Dependent Launch (Hopper and later): each Triton kernel may start while the one before
    # it finishes, waiting in-kernel for its inputs; the same arithmetic, launched earlier.
    "nanocluster-pdl": ([], {"TORCHINDUCTOR_ENABLE_PDL": "1"}),
    # Inductor's coordinate-descent tuning: each pointwise and reduction kernel's block sizes refined by
    # timing their neighbours (a longer compile; chosen by timing, so not exact across processes).
    "nanocluster-coordesc": ([], {"TORCHINDUCTOR_COORDINATE_DESCENT_TUNING": "1"}),
    # Triton GEMM templates with their epilogues fused, chosen by rule (Inductor's deterministic mode
    # takes a template's first configuration instead of timing them): the fusion, still exact.
    "nanocluster-tritongemm": (
        ["deterministic=true"],
        {"TORCHINDUCTOR_MAX_AUTOTUNE": "1", "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS": "TRITON"},
    ),
}
"""--diagnose: the trainer with one choice changed (overrides, environment), by name."""


def trainer_variants(ours: Program, work: Path, chosen: list[str]) -> list[Program]:
    """The trainer once per chosen variant, in the order given; "a+b" changes a's and b's choices at once."""
    programs = []
    for choice in chosen:
        overrides: list[str] = []
        env: dict[str, str] = {}
        for part in choice.split("+"):
            part_overrides, part_env = TRAINER_VARIANTS[f"nanocluster-{part}"]
            overrides += part_overrides
            env |= part_env
        name = f"nanocluster-{choice}"
        programs.append(
            Program(
                name,
                [*ours.command, *overrides, f"out_dir={work / name}"],
                ours.cwd,
                ours.step_line,
                env=ours.env | env,
            )
        )
    return programs


def nanogpt_in_gpt2_shape(nanogpt: Program, data: Path, work: Path) -> Program:
    """nanoGPT with GPT-2's 50,257 words and biases (--shape)."""
    gpt2_shape = work / "data-gpt2-shape"  # the same tokens, with the meta.pkl nanoGPT takes its vocabulary from
    gpt2_shape.mkdir()
    for split in ("train", "val"):
        (gpt2_shape / f"{split}.bin").symlink_to(data / f"{split}.bin")
    with open(gpt2_shape / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": VOCAB_SIZE}, f)
    nanogpt_args = [a for a in nanogpt.command if not a.startswith(("--dataset=", "--out_dir="))]
    return Program(
        "nanoGPT-gpt2",
        [*nanogpt_args, f"--dataset={gpt2_shape}", f"--out_dir={work / 'nanogpt-gpt2-out'}", "--bias=True"],
        nanogpt.cwd,
        nanogpt.step_line,
        precision=f"{nanogpt.precision}, {VOCAB_SIZE} words, biases",
    )


if __name__ == "__main__":
    main()
