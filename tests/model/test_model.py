"""The GPT-2 model itself (model.gpt.model): shapes, presets, cropping, loss and generation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.gpt.model import GPT, PRESETS, GPTConfig, gelu


def tiny(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**({"n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 16, "vocab_size": 50} | overrides)))


@pytest.mark.parametrize(
    ("preset", "parameters"),
    # OpenAI's released sizes, counted with the tied output projection once.
    [
        ("gpt2", 124_439_808),
        ("gpt2-medium", 354_823_168),
        ("gpt2-large", 774_030_080),
        ("gpt2-xl", 1_557_611_200),
    ],
)
def test_presets_have_openai_parameter_counts(preset: str, parameters: int) -> None:
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = GPT(GPTConfig(**PRESETS[preset]))
    assert model.num_params(non_embedding=False) == parameters
    assert model.lm_head.weight is model.transformer.wte.weight


def test_flops_per_token_is_6n_plus_attention() -> None:
    with torch.device("meta"):
        model = GPT(GPTConfig())
    n = model.num_params()  # without the position embedding
    assert n == 124_439_808 - 1024 * 768
    assert model.flops_per_token(1024) == 6 * n + 12 * 12 * 12 * 64 * 1024


def test_logits_and_loss_shapes() -> None:
    model = tiny()
    idx = torch.randint(0, 50, (3, 16))
    logits, loss = model(idx)
    assert logits.shape == (3, 16, 50) and loss is None
    # With targets only the loss: the logits are never materialised (model.gpt.fused_loss).
    logits, loss = model(idx, idx)
    assert logits is None
    assert loss.shape == () and loss.item() == pytest.approx(torch.log(torch.tensor(50.0)).item(), rel=0.1)


def test_targets_of_minus_one_are_ignored() -> None:
    model = tiny().eval()
    idx = torch.randint(0, 50, (1, 16))
    targets = idx.clone()
    targets[0, 8:] = -1
    loss = model(idx, targets)[1]
    expected = torch.nn.functional.cross_entropy(model(idx)[0][0, :8], idx[0, :8])
    torch.testing.assert_close(loss, expected)


def test_sequence_longer_than_block_size_is_refused() -> None:
    with pytest.raises(ValueError, match="sequence of length 17 is longer than the model's block_size 16"):
        tiny()(torch.zeros(1, 17, dtype=torch.long))


def test_crop_keeps_the_first_positions_logits() -> None:
    model = tiny().eval()
    idx = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        full = model(idx)[0]
        model.crop_block_size(8)
        cropped = model(idx[:, :8])[0]
    assert model.config.block_size == 8
    assert model.transformer.wpe.weight.shape == (8, 16)
    assert model.transformer.wpe.weight.untyped_storage().nbytes() == 8 * 16 * 4  # a copy, not a view
    torch.testing.assert_close(cropped, full[:, :8])


def test_crop_cannot_grow_the_context() -> None:
    with pytest.raises(ValueError, match=r"block_size must be in \[1, 16\]"):
        tiny().crop_block_size(32)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_embd": 10, "n_head": 3}, r"n_embd \(10\) must be divisible by n_head \(3\)"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"n_layer": 0}, "n_layer must be >= 1"),
    ],
)
def test_invalid_config_names_the_field(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GPTConfig(**overrides)


def test_dropout_acts_only_in_training_mode() -> None:
    model = tiny(dropout=0.5)
    idx = torch.randint(0, 50, (1, 16))
    assert not torch.equal(model.train()(idx)[0], model(idx)[0])
    model.eval()
    assert torch.equal(model(idx)[0], model(idx)[0])


def test_gradient_reaches_the_tied_embedding_from_both_uses() -> None:
    model = tiny()
    idx = torch.randint(0, 50, (2, 16))
    model(idx, idx)[1].backward()
    unused_rows = sorted(set(range(50)) - set(idx.flatten().tolist()))
    # Rows never used as input still get gradient through the output projection.
    assert model.transformer.wte.weight.grad[unused_rows].abs().sum() > 0


def test_generate_greedy_matches_argmax_of_forward() -> None:
    model = tiny().eval()
    idx = torch.randint(0, 50, (1, 5))
    out = model.generate(idx, 3, temperature=0)
    for step in range(3):
        context = out[:, : 5 + step]
        assert out[0, 5 + step] == model(context)[0][0, -1].argmax()


def test_generate_beyond_block_size_slides_the_context() -> None:
    out = (
        tiny()
        .eval()
        .generate(torch.zeros(1, 1, dtype=torch.long), 40, top_k=5, generator=torch.Generator().manual_seed(0))
    )
    assert out.shape == (1, 41)
    assert 0 <= out.min() and out.max() < 50


def test_top_k_one_is_greedy() -> None:
    model = tiny().eval()
    idx = torch.randint(0, 50, (2, 4))
    torch.testing.assert_close(
        model.generate(idx, 6, temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(0)),
        model.generate(idx, 6, temperature=0),
    )


def test_gelu_is_gpt2s_tanh_form_in_fp32_and_within_a_bf16_rounding_step_of_it_in_bf16() -> None:
    x = torch.linspace(-8, 8, 200_001)
    assert torch.equal(gelu(x), F.gelu(x, approximate="tanh"))
    inputs = x.bfloat16().unique()  # every bf16 value in [-8, 8]
    assert len(inputs) > 2000
    tanh_form = F.gelu(inputs.float(), approximate="tanh").bfloat16().float()
    ours = gelu(inputs)
    assert ours.dtype == torch.bfloat16
    difference = (ours.float() - tanh_form).abs()
    # Where bf16's rounding step exceeds the forms' 4.7e-4 gap, they round to the same value or a
    # neighbour; near zero the gap itself bounds them.
    step = torch.finfo(torch.bfloat16).eps * tanh_form.abs()
    assert (difference <= torch.clamp(step, min=1e-3)).all()
    assert (difference > 0).any(), "bf16 runs the erf form: some values round to a neighbour"
