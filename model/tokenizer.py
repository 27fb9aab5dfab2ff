"""GPT-2 BPE through tiktoken, usable offline.

tiktoken downloads its vocabulary on first use. Machines without internet (and CI here) can
pre-place the ranks instead: tiktoken's r50k_base is GPT-2's vocabulary, and the openai-whisper
source distribution on PyPI ships the same file as whisper/assets/gpt2.tiktoken.

    python -m model.tokenizer install                 # from PyPI's openai-whisper sdist
    python -m model.tokenizer install --from FILE     # from a file you already have

Both write it where tiktoken looks (TIKTOKEN_CACHE_DIR, default ~/.cache/nanocluster/tiktoken),
checked against the sha256 tiktoken itself expects.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import tiktoken

from model.atomic import atomic_open

R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT_TOKEN = 50256
VOCAB_SIZE = 50257
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "nanocluster" / "tiktoken"


class TokenizerUnavailable(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("TIKTOKEN_CACHE_DIR") or DEFAULT_CACHE_DIR)


def cached_vocab_path(directory: Path | None = None) -> Path:
    # tiktoken names cached files by the sha1 of their URL.
    return (directory or cache_dir()) / hashlib.sha1(R50K_URL.encode()).hexdigest()


def _how_to_provide() -> str:
    return (
        "Provide the GPT-2 vocabulary offline with `python -m model.tokenizer install` "
        "(extracts it from the openai-whisper sdist on PyPI) or "
        "`python -m model.tokenizer install --from gpt2.tiktoken`, or set "
        f"TIKTOKEN_CACHE_DIR to a directory holding it as {cached_vocab_path().name}."
    )


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """The GPT-2 encoding; raises TokenizerUnavailable with the fix when it cannot be loaded."""
    # Point tiktoken at our cache when the vocabulary is there and the user set nothing.
    if "TIKTOKEN_CACHE_DIR" not in os.environ and cached_vocab_path(DEFAULT_CACHE_DIR).exists():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(DEFAULT_CACHE_DIR)
    try:
        return tiktoken.get_encoding("r50k_base")
    except Exception as err:  # network errors, hash mismatch, unreadable cache
        raise TokenizerUnavailable(
            f"could not load the GPT-2 BPE vocabulary (tiktoken r50k_base): {err}. {_how_to_provide()}"
        ) from err


def install_vocab(source: Path | None = None, directory: Path | None = None) -> Path:
    """Place the GPT-2 ranks where tiktoken finds them; verified, written atomically."""
    target = cached_vocab_path(directory)
    with tempfile.TemporaryDirectory() as tmp:
        if source is None:
            source = _extract_from_whisper_sdist(Path(tmp))
        data = Path(source).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != R50K_SHA256:
            raise TokenizerUnavailable(
                f"{source} is not the GPT-2 vocabulary: sha256 {digest[:12]}…, expected {R50K_SHA256[:12]}…"
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(target) as f:
        f.write(data)
    return target


def _extract_from_whisper_sdist(workdir: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "openai-whisper",
        "-d",
        str(workdir),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sdists = list(workdir.glob("openai*whisper-*.tar.gz"))
    if proc.returncode != 0 or not sdists:
        raise TokenizerUnavailable(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()[-500:]}. {_how_to_provide()}")
    with tarfile.open(sdists[0]) as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken")), None)
        if member is None:
            raise TokenizerUnavailable(f"{sdists[0].name} holds no whisper/assets/gpt2.tiktoken")
        extracted = tar.extractfile(member)
        if extracted is None:  # a link or a directory under the vocabulary's name
            raise TokenizerUnavailable(f"{sdists[0].name}: {member.name} is not a regular file")
        out = workdir / "gpt2.tiktoken"
        out.write_bytes(extracted.read())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m model.tokenizer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="place the GPT-2 vocabulary where tiktoken finds it")
    install.add_argument("--from", dest="source", type=Path, help="an existing gpt2.tiktoken / r50k_base.tiktoken")
    install.add_argument("--cache-dir", type=Path, help="default: $TIKTOKEN_CACHE_DIR or ~/.cache/nanocluster/tiktoken")
    args = parser.parse_args(argv)
    try:
        path = install_vocab(args.source, args.cache_dir)
    except (TokenizerUnavailable, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"GPT-2 vocabulary installed at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
