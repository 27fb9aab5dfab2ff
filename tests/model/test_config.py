from __future__ import annotations

import textwrap

import pytest

from model.gpt.model import GPTConfig
from model.settings.config import ConfigError, TrainConfig, load_config


def write(tmp_path, text: str):
    path = tmp_path / "cfg.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_defaults_are_fine_tuning_defaults():
    cfg = load_config()
    assert cfg.init_from == "gpt2"
    assert cfg.peak_learning_rate() == pytest.approx(6e-5)
    assert cfg.final_learning_rate() == pytest.approx(6e-6)
    assert cfg.decay_lr and cfg.warmup_iters < cfg.max_iters // 5


def test_scratch_gets_a_scratch_learning_rate_unless_set():
    assert load_config(overrides=["init_from=scratch"]).peak_learning_rate() == pytest.approx(1e-3)
    assert load_config(overrides=["init_from=scratch", "learning_rate=5e-4"]).peak_learning_rate() == 5e-4


def test_yaml_then_overrides_with_dotted_keys_and_types(tmp_path):
    path = write(
        tmp_path,
        """
        batch_size: 2
        learning_rate: 3e-5     # PyYAML reads this as a string; it is converted to float
        model: {n_layer: 3}
        """,
    )
    cfg = load_config(path, ["batch_size=5", "model.n_embd=96", "compile=true", "expected_world_size=3"])
    assert (cfg.batch_size, cfg.learning_rate, cfg.model.n_layer, cfg.model.n_embd) == (5, 3e-5, 3, 96)
    assert cfg.compile is True and cfg.expected_world_size == 3
    assert cfg.to_dict()["model"]["n_layer"] == 3


def test_intel_guide_layout_is_accepted(tmp_path):
    path = write(
        tmp_path,
        """
        data_dir: ./data
        block_size: 128
        optimizer_config:
          learning_rate: 6e-4
          weight_decay: 1e-1
          beta1: 0.9
          beta2: 0.95
        trainer_config:
          device: cpu
          mixed_precision: bf16
          eval_interval: 5
          log_interval: 1
          eval_iters: 2
          eval_only: False
          batch_size: 32
          max_iters: 10
          model_path: runs/a/ckpt.pt
          snapshot_path: runs/a/snapshot.pt
          gradient_accumulation_steps: 2
          grad_clip: 1.0
          decay_lr: True
          warmup_iters: 2
          lr_decay_iters: 10
          max_lr: 3e-5
          min_lr: 3e-6
        """,
    )
    cfg = load_config(path)
    assert cfg.data_dir == "./data" and cfg.block_size == 128 and cfg.out_dir == "runs/a"
    assert cfg.learning_rate == 3e-5  # max_lr is the schedule's peak
    assert (cfg.weight_decay, cfg.beta2, cfg.min_lr, cfg.lr_decay_iters) == (0.1, 0.95, 3e-6, 10)
    assert (cfg.batch_size, cfg.gradient_accumulation_steps, cfg.mixed_precision) == (32, 2, "bf16")


def test_intel_layouts_device_is_the_trainers_device(tmp_path):
    """The guides' `device: cpu` trains on CPUs on a GPU machine too; a GPU is asked for as at the top level."""
    assert load_config(write(tmp_path, "trainer_config: {device: cpu}\n")).device == "cpu"
    assert load_config(write(tmp_path, "trainer_config: {device: cuda}\n")).device == "cuda"
    assert load_config(write(tmp_path, "trainer_config: {batch_size: 2}\n")).device == "auto"
    with pytest.raises(ConfigError, match=r"device must be one of auto, cpu, cuda, got 'xpu'"):
        load_config(write(tmp_path, "trainer_config: {device: xpu}\n"))


def test_unknown_key_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"learning_rat \(did you mean learning_rate\?\)"):
        load_config(overrides=["learning_rat=1e-4"])
    with pytest.raises(ConfigError, match=r"model\.n_layers \(did you mean model\.n_layer\?\)"):
        load_config(overrides=["model.n_layers=2"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("batch_size=0", "batch_size must be >= 1, got 0"),
        ("mixed_precision=fp8", "mixed_precision must be one of auto, fp32, bf16, fp16, got 'fp8'"),
        ("device=tpu", "device must be one of auto, cpu, cuda, got 'tpu'"),
        ("backend=mpi", "backend must be one of auto, nccl, ccl, gloo"),
        ("beta2=1.5", r"beta2 must be in \[0, 1\), got 1.5"),
        ("batch_size=two", "batch_size must be int, got 'two'"),
        ("compile=maybe", "compile must be bool, got 'maybe'"),
        ("max_iters=null", "max_iters must be int, got 'null'"),
        ("model.n_embd=100", r"model\.n_embd must be >= 1 and divisible by model\.n_head \(6\)"),
        ("collective_timeout_s=0", "collective_timeout_s must be > 0"),
        ("learning_rate", "must look like key=value"),
    ],
)
def test_bad_value_names_field_and_allowed_range(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


def test_missing_and_malformed_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "max_iters: 10\nbatch_size: [4\n",
            "{path}:3:1: expected ',' or ']', but got '<stream end>' (while parsing a flow "
            "sequence at line 2, column 13; fix the YAML there)",
        ),
        (
            "max_iters: 10\n  learning_rate: 3\n",
            "{path}:2:16: mapping values are not allowed here (fix the YAML there)",
        ),
        (
            'max_iters: 10\nname: "a\u0007"\n',
            "{path}:2:9: unacceptable character #x0007: special characters are not allowed (fix the YAML there)",
        ),
    ],
    ids=["unclosed", "indented", "control-character"],
)
def test_a_yaml_syntax_error_is_one_line_with_the_file_line_and_column(tmp_path, text, message):
    path = tmp_path / "train.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as bad:
        load_config(path)
    assert str(bad.value) == message.format(path=path)


def test_errors_about_a_files_keys_name_the_file_and_line(tmp_path):
    path = write(tmp_path, "max_iters: 10\nmax_iter: 3\nmodel:\n  n_layers: 2\n")
    with pytest.raises(ConfigError) as unknown:
        load_config(path, ["foo=1"])
    assert str(unknown.value) == (
        f"{path}: unknown config key(s): max_iter (did you mean max_iters?) on line 2, model.n_layers (did you mean "
        "model.n_layer?) on line 4; and in the overrides: foo"
    )
    path = write(tmp_path, "max_iters: 10\nmodel:\n  n_layer: two\n")
    with pytest.raises(ConfigError) as wrong:
        load_config(path)
    assert str(wrong.value) == f"{path}:3: model.n_layer must be int, got 'two'"
    load_config(path, ["model.n_layer=2"])  # an override replaces the file's value, error and all
    with pytest.raises(ConfigError) as layout:
        load_config(write(tmp_path, "trainer_config:\n  device: cpu\n  max_iters: ten\n"))
    assert str(layout.value) == f"{path}:3: max_iters must be int, got 'ten'"  # the line in its section


def test_a_file_that_is_not_a_mapping_or_not_text_is_named(tmp_path):
    path = write(tmp_path, "- max_iters: 10\n")
    with pytest.raises(ConfigError) as listed:
        load_config(path)
    assert str(listed.value) == (
        f"config file {path} must be a mapping of keys to values (key: value lines), got list [{{'max_iters': 10}}]"
    )
    path.write_bytes(b"max_iters: \xff\n")
    with pytest.raises(ConfigError) as binary:
        load_config(path)
    assert str(binary.value) == f"config file {path} is not UTF-8 text (byte 0xff at offset 11)"


def test_every_field_has_a_docstring():
    import ast
    import inspect

    import model.settings.config as module

    tree = ast.parse(inspect.getsource(module))
    for cls in (c for c in tree.body if isinstance(c, ast.ClassDef) and c.name in ("TrainConfig", "ModelShape")):
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign):
                nxt = body[i + 1] if i + 1 < len(body) else None
                assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), (
                    f"{cls.name}.{node.target.id} has no docstring"
                )
    assert TrainConfig.__doc__


@pytest.mark.parametrize(
    "shape",
    [
        {"n_layer": 0},
        {"n_head": 0},
        {"n_embd": 0},
        {"n_embd": 100, "n_head": 6},
        {"n_embd": 96, "n_head": 4},
        {"dropout": 1.0},
        {"dropout": 0.1},
    ],
)
def test_the_config_accepts_exactly_the_model_shapes_gptconfig_accepts(shape):
    try:
        GPTConfig(**shape)
        gpt_accepts = True
    except ValueError:
        gpt_accepts = False
    overrides = [f"model.{key}={value}" for key, value in shape.items()]
    try:
        load_config(overrides=["init_from=scratch", *overrides])
        config_accepts = True
    except ConfigError:
        config_accepts = False
    assert config_accepts == gpt_accepts
