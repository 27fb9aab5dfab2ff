import hashlib

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


def test_missing_vocabulary_offline_says_how_to_provide_it(tmp_path, monkeypatch, fresh_encoding):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})

    def offline(url, *args, **kwargs):
        raise ConnectionError(f"cannot reach {url}")

    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    with pytest.raises(tokenizer.TokenizerUnavailable, match=r"python -m model\.tokenizer install"):
        tokenizer.gpt2_encoding()


def test_cli_install_reports_bad_source(tmp_path, capsys):
    assert tokenizer.main(["install", "--from", str(tmp_path / "absent"), "--cache-dir", str(tmp_path)]) == 1
    assert "absent" in capsys.readouterr().err
