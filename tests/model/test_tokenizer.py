import hashlib
import io
import tarfile
from pathlib import Path

import pytest
import tiktoken.load

from model import tokenizer


@pytest.fixture
def installed_vocab() -> bytes:
    """The GPT-2 ranks `make setup` placed; tests copy them rather than fetch them."""
    path = tokenizer.cached_vocab_path(tokenizer.DEFAULT_CACHE_DIR)
    if not path.exists():
        pytest.fail("GPT-2 vocabulary missing: run `python -m model.tokenizer install` (make setup does)")
    return path.read_bytes()


@pytest.fixture
def fresh_encoding(monkeypatch):
    tokenizer.gpt2_encoding.cache_clear()
    yield
    tokenizer.gpt2_encoding.cache_clear()


def test_encodes_like_gpt2(installed_vocab):
    enc = tokenizer.gpt2_encoding()
    assert enc.n_vocab == tokenizer.VOCAB_SIZE
    assert enc.eot_token == tokenizer.EOT_TOKEN
    assert enc.encode_ordinary("Hello world") == [15496, 995]


def test_install_from_file_lands_where_tiktoken_looks(tmp_path, installed_vocab):
    source = tmp_path / "gpt2.tiktoken"
    source.write_bytes(installed_vocab)
    target = tokenizer.install_vocab(source, tmp_path / "cache")
    assert target.name == hashlib.sha1(tokenizer.R50K_URL.encode()).hexdigest()
    assert target.read_bytes() == installed_vocab


def test_install_refuses_a_file_that_is_not_the_gpt2_vocabulary(tmp_path):
    wrong = tmp_path / "vocab.tiktoken"
    wrong.write_bytes(b"not a vocabulary\n")
    with pytest.raises(tokenizer.TokenizerUnavailable, match="is not the GPT-2 vocabulary"):
        tokenizer.install_vocab(wrong, tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def offline(url, *args, **kwargs):
    raise ConnectionError(f"cannot reach {url}")


def whisper_sdist(path: Path, ranks: bytes | None) -> Path:
    """A stand-in for openai-whisper's source distribution: the vocabulary where the real one holds it
    (ranks None: an archive without it)."""
    with tarfile.open(path, "w:gz") as tar:
        readme = tarfile.TarInfo("openai_whisper-0/README.md")
        readme.size = 5
        tar.addfile(readme, io.BytesIO(b"hello"))
        if ranks is not None:
            info = tarfile.TarInfo(f"openai_whisper-0/{tokenizer.WHISPER_MEMBER}")
            info.size = len(ranks)
            tar.addfile(info, io.BytesIO(ranks))
    return path


def test_the_default_source_is_the_whisper_sdist_on_pypi(monkeypatch):
    monkeypatch.delenv(tokenizer.SOURCE_ENV, raising=False)
    assert tokenizer.vocab_source() == tokenizer.WHISPER_SDIST_URL
    assert tokenizer.WHISPER_SDIST_URL.startswith("https://files.pythonhosted.org/packages/")


def test_first_use_fetches_the_vocabulary_with_one_line(tmp_path, monkeypatch, capsys, installed_vocab, fresh_encoding):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(tokenizer.SOURCE_ENV, whisper_sdist(tmp_path / "whisper.tar.gz", installed_vocab).as_uri())
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.setattr(tiktoken.load, "read_file", offline)  # tiktoken's own download is never needed
    assert tokenizer.gpt2_encoding().encode_ordinary("Hello world") == [15496, 995]
    assert tokenizer.cached_vocab_path(tmp_path / "cache").read_bytes() == installed_vocab
    err = capsys.readouterr().err
    assert err.count("fetching the GPT-2 vocabulary") == 1 and len(err.splitlines()) == 1, err
    tokenizer.gpt2_encoding.cache_clear()
    tokenizer.gpt2_encoding()  # cached now: no second fetch
    assert capsys.readouterr().err == ""


def test_fetch_takes_the_vocabulary_itself_from_a_url(tmp_path, monkeypatch, installed_vocab):
    (tmp_path / "r50k_base.tiktoken").write_bytes(installed_vocab)
    monkeypatch.setenv(tokenizer.SOURCE_ENV, (tmp_path / "r50k_base.tiktoken").as_uri())
    assert tokenizer.main(["install", "--cache-dir", str(tmp_path / "cache")]) == 0
    assert tokenizer.cached_vocab_path(tmp_path / "cache").read_bytes() == installed_vocab


def test_fetch_refuses_an_archive_without_the_vocabulary(tmp_path, monkeypatch):
    monkeypatch.setenv(tokenizer.SOURCE_ENV, whisper_sdist(tmp_path / "whisper.tar.gz", None).as_uri())
    with pytest.raises(tokenizer.TokenizerUnavailable, match=r"holds no whisper/assets/gpt2\.tiktoken"):
        tokenizer.install_vocab(None, tmp_path / "cache")
    with pytest.raises(tokenizer.TokenizerUnavailable, match="is not the GPT-2 vocabulary"):
        tokenizer.install_vocab(whisper_sdist(tmp_path / "wrong.tar.gz", b"not the ranks\n"), tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_missing_vocabulary_offline_says_how_to_provide_it(tmp_path, monkeypatch, fresh_encoding):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv(tokenizer.SOURCE_ENV, (tmp_path / "absent.tiktoken").as_uri())
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    with pytest.raises(tokenizer.TokenizerUnavailable, match=rf"could not fetch .*absent.*set {tokenizer.SOURCE_ENV}"):
        tokenizer.gpt2_encoding()


def test_cli_install_reports_bad_source(tmp_path, capsys):
    assert tokenizer.main(["install", "--from", str(tmp_path / "absent"), "--cache-dir", str(tmp_path)]) == 1
    assert "absent" in capsys.readouterr().err
