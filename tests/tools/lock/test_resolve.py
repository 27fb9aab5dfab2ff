"""tools/lock/resolve.py, what `make lock` runs: the lock without the machine's own path, and the cuda
profile's stack, PyPI's torch and the CUDA libraries it pulls in, resolved by uv (faked here)."""

import pytest

from tests.tools.lock.copies import CUDA
from tools.lock import resolve
from tools.lock.node_file import node_requirements
from tools.lock.profiles import TORCH_CUDA
from tools.lock.requirements import LOCK, ROOT, pins


def test_the_lock_holds_no_path_of_the_machine_that_made_it():
    text = (ROOT / LOCK).read_text()
    assert "file://" not in text and "nanocluster @" not in text
    compiled = "aaa==1\n    # via x\nnanocluster @ file:///home/someone/nanocluster\n    # via nanocluster\nzzz==2\n"
    assert resolve.without_project(compiled) == "aaa==1\n    # via x\nzzz==2\n"


# --- the cuda profile's stack: PyPI's torch and the CUDA libraries it pulls in, resolved by uv ---


class FakeUv:
    """uv_compile as the real one behaves: reads the stack and the constraints, keeps the output file's
    pins where they still fit unless upgrade (here cuda-bindings, a range in torch's metadata), writes
    the resolution to the output file and returns it. It resolves to `answer`, or on a (platform,
    python) of `others` to that one's."""

    def __init__(self, answer: str, others: dict[tuple[str, str], str] | None = None):
        self.answer, self.others, self.calls = answer, others or {}, []

    def __call__(self, requirements, constraints, output, platform, python, upgrade):
        kept = pins(output.read_text())
        self.calls.append((platform, python, requirements.read_text(), constraints.read_text(), kept, upgrade))
        resolved = pins(self.others.get((platform, python), self.answer))
        if not upgrade and "cuda-bindings" in kept:
            resolved["cuda-bindings"] = kept["cuda-bindings"]
        output.write_text("".join(f"{name}=={version}\n" for name, version in sorted(resolved.items())))
        return output.read_text()


CLOSURE = "filelock==4.3.1\nnumpy==2.4.6\ntorch==2.13.0+cpu\n"
STACK = "cuda-bindings==13.5.0\ncuda-toolkit==13.0.3.0\nfilelock==4.3.1\nnvidia-nccl-cu13==2.29.7\ntorch==2.13.0\n"


def test_the_cuda_stack_is_resolved_for_every_node_platform_under_the_closures_versions(tmp_path, monkeypatch):
    uv = FakeUv(STACK)
    monkeypatch.setattr(resolve, "uv_compile", uv)
    previous = "cuda-bindings==13.0.3 --hash=sha256:ab\ntorch==2.13.0 --hash=sha256:cd\n"
    stack = resolve.stack_closure(CUDA, CLOSURE, previous, upgrade=False, scratch=tmp_path)
    assert sorted((platform, python) for platform, python, *_ in uv.calls) == [
        ("aarch64-manylinux_2_36", "3.11"),
        ("aarch64-manylinux_2_36", "3.12"),
        ("x86_64-manylinux_2_36", "3.11"),
        ("x86_64-manylinux_2_36", "3.12"),
    ]
    for _, _, requirements, constraints, kept, upgrade in uv.calls:
        assert requirements == "torch==2.13.0\n"
        assert constraints == "filelock==4.3.1\nnumpy==2.4.6\n"  # the closure, its CPU torch left out
        assert kept == {"cuda-bindings": "13.0.3", "torch": "2.13.0"} and not upgrade
    assert pins(stack)["cuda-bindings"] == "13.0.3"  # kept from the file, as pip-compile keeps the lock's
    merged = resolve.with_stack(CLOSURE, stack)
    assert pins(merged) == {
        "filelock": "4.3.1",
        "numpy": "2.4.6",
        "torch": "2.13.0+cpu",  # replaced by the profile's own stack in the node file
        "cuda-bindings": "13.0.3",
        "cuda-toolkit": "13.0.3.0",
        "nvidia-nccl-cu13": "2.29.7",
    }
    text = node_requirements(CUDA, merged)
    assert pins(text)["torch"] == "2.13.0" and pins(text)["nvidia-nccl-cu13"] == "2.29.7"

    uv.calls.clear()
    upgraded = resolve.stack_closure(CUDA, CLOSURE, previous, upgrade=True, scratch=tmp_path)
    assert pins(upgraded)["cuda-bindings"] == "13.5.0" and all(call[-1] for call in uv.calls)


def test_a_cuda_stack_that_differs_between_node_platforms_is_refused(tmp_path, monkeypatch):
    """The nodes install one list with --no-deps: a package only one platform needs would fail the others."""
    aarch64 = STACK + "nvidia-only-on-arm==1.0\n"
    monkeypatch.setattr(resolve, "uv_compile", FakeUv(STACK, {("aarch64-manylinux_2_36", "3.12"): aarch64}))
    with pytest.raises(RuntimeError) as refused:
        resolve.stack_closure(CUDA, CLOSURE, "", upgrade=False, scratch=tmp_path)
    assert str(refused.value) == (
        "the cuda stack pulls in other pins on aarch64-manylinux_2_36 Python 3.12 than on x86_64-manylinux_2_36 "
        "Python 3.11 (nvidia-only-on-arm==1.0): the nodes install one list"
    )


@pytest.mark.parametrize(
    ("stack", "built_for"),
    [
        (STACK.replace("cuda-toolkit==13.0.3.0", "cuda-toolkit==13.2.1.0"), "cuda-toolkit==13.2.1.0"),
        (STACK.replace("cuda-toolkit==13.0.3.0\n", ""), "no cuda-toolkit"),
    ],
    ids=["cuda-13.2", "no-toolkit"],
)
def test_pypis_torch_built_for_another_cuda_is_refused(tmp_path, monkeypatch, stack, built_for):
    """A new torch release on PyPI may be built for another CUDA, which may need a newer driver."""
    monkeypatch.setattr(resolve, "uv_compile", FakeUv(stack))
    with pytest.raises(RuntimeError) as refused:
        resolve.stack_closure(CUDA, CLOSURE, "", upgrade=False, scratch=tmp_path)
    assert str(refused.value) == (
        f"PyPI's torch==2.13.0 is not built for CUDA {TORCH_CUDA} (it pulls in {built_for}): check the NVIDIA "
        "driver it needs, then change TORCH_CUDA in tools/lock/profiles.py"
    )
