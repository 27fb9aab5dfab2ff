"""GPT-2 BPE through tiktoken, fetched on first use from PyPI, or placed by hand offline.

tiktoken's r50k_base is GPT-2's vocabulary. tiktoken itself downloads it from openaipublic's blob
store; here it comes from where pip already reaches: the openai-whisper source distribution on PyPI
ships the same file as whisper/assets/gpt2.tiktoken. The first program that needs it (model.prepare,
model.sample) fetches it into the cache with one line on stderr, so `fab prepare-data` (or
`nanocluster prepare-data`) needs no step before it.

    python -m model.tokenizer install                 # fetch it now (make setup does, for the tests)
    python -m model.tokenizer install --from FILE     # from a file you already have

Both write it where tiktoken looks (TIKTOKEN_CACHE_DIR, default ~/.cache/nanocluster/tiktoken),
checked against the sha256 tiktoken itself expects. Where PyPI cannot be reached, SOURCE_ENV names
another place to fetch it from (a file:// URL of a copy, or a mirror).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import io
import os
import sys
import tarfile
import urllib.request
from pathlib import Path

import tiktoken

from model.atomic import atomic_open

R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT_TOKEN = 50256
VOCAB_SIZE = 50257
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "nanocluster" / "tiktoken"
WHISPER_SDIST_URL = (
    "https://files.pythonhosted.org/packages/35/8e/d36f8880bcf18ec026a55807d02fe4c7357da9f25aebd92f85178000c0dc/"
    "openai_whisper-20250625.tar.gz"
)
"""openai-whisper 20250625's source distribution (0.8 MB, MIT licence, OpenAI), as PyPI's JSON API lists
it (https://pypi.org/pypi/openai-whisper/20250625/json): a file PyPI never changes once uploaded."""
WHISPER_MEMBER = "whisper/assets/gpt2.tiktoken"
SOURCE_ENV = "NANOCLUSTER_GPT2_VOCAB_URL"
"""Fetch from this URL instead (https:// or file://): the vocabulary itself (r50k_base.tiktoken or
whisper's gpt2.tiktoken), or a source distribution holding it as WHISPER_MEMBER."""
FETCH_TIMEOUT_S = 30
"""Seconds a stalled connection may stay silent: under the 60 s bench/gpu_check.sh gives its tokenizing
step, so an offline machine reports the vocabulary missing rather than a timeout."""


class TokenizerUnavailable(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("TIKTOKEN_CACHE_DIR") or DEFAULT_CACHE_DIR)


def cached_vocab_path(directory: Path | None = None) -> Path:
    # tiktoken names cached files by the sha1 of their URL.
    return (directory or cache_dir()) / hashlib.sha1(R50K_URL.encode()).hexdigest()


def vocab_source() -> str:
    return os.environ.get(SOURCE_ENV) or WHISPER_SDIST_URL


def _how_to_provide() -> str:
    return (
        f"Where {vocab_source()} cannot be reached, set {SOURCE_ENV} to a copy of the vocabulary "
        "(file:///path/to/gpt2.tiktoken or r50k_base.tiktoken, or a mirror's URL) and run again, "
        f"or place that file as {cached_vocab_path()}."
    )


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """The GPT-2 encoding, fetched into the cache first if it is not there; raises TokenizerUnavailable
    with the fix when it cannot be had."""
    try:
        if not cached_vocab_path().exists():
            print(f"fetching the GPT-2 vocabulary from {vocab_source()} into {cache_dir()}", file=sys.stderr)
            install_vocab()
        # tiktoken reads the cached copy (it checks the sha256 again) instead of downloading its own.
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(DEFAULT_CACHE_DIR))
        return tiktoken.get_encoding("r50k_base")
    except Exception as err:  # network errors, hash mismatch, unreadable cache
        raise TokenizerUnavailable(
            f"could not load the GPT-2 BPE vocabulary (tiktoken r50k_base): {err}. {_how_to_provide()}"
        ) from err


def install_vocab(source: Path | None = None, directory: Path | None = None) -> Path:
    """Place the GPT-2 ranks where tiktoken finds them, from a file or (None) fetched from vocab_source();
    verified, written atomically."""
    if source is None:
        origin = vocab_source()
        data = _download(origin)
    else:
        origin = str(source)
        data = Path(source).read_bytes()
    data = _ranks_in(data, origin)
    target = cached_vocab_path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(target) as f:
        f.write(data)
    return target


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            return response.read()
    except (OSError, ValueError) as err:  # URLError is an OSError; ValueError: not a URL
        raise TokenizerUnavailable(f"could not fetch {url}: {err}") from err


def _ranks_in(data: bytes, origin: str) -> bytes:
    """The GPT-2 ranks: data itself, or the WHISPER_MEMBER inside a source distribution."""
    if hashlib.sha256(data).hexdigest() != R50K_SHA256:
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                member = next((m for m in tar.getmembers() if m.name.endswith(WHISPER_MEMBER)), None)
                if member is None:
                    raise TokenizerUnavailable(f"{origin} holds no {WHISPER_MEMBER}")
                extracted = tar.extractfile(member)
                if extracted is None:  # a link or a directory under the vocabulary's name
                    raise TokenizerUnavailable(f"{origin}: {member.name} is not a regular file")
                data = extracted.read()
        except tarfile.TarError:
            pass  # neither the ranks nor an archive: refused below, by its digest
    digest = hashlib.sha256(data).hexdigest()
    if digest != R50K_SHA256:
        raise TokenizerUnavailable(
            f"{origin} is not the GPT-2 vocabulary: sha256 {digest[:12]}…, expected {R50K_SHA256[:12]}…"
        )
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m model.tokenizer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="place the GPT-2 vocabulary where tiktoken finds it")
    install.add_argument(
        "--from", dest="source", type=Path, help="an existing gpt2.tiktoken / r50k_base.tiktoken (or the whisper sdist)"
    )
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
