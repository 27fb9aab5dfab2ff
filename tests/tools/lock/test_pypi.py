"""tools/lock/pypi.py: the hashes of a pin are those of the PyPI files a node can install."""

import json

import pytest

from tests.tools.lock.copies import INTEL
from tools.lock import pypi


def test_node_files_are_the_wheels_a_node_can_install_or_else_the_source(monkeypatch):
    def file(filename: str, digest: str, yanked: bool = False) -> dict:
        return {"filename": filename, "hashes": {"sha256": digest}, "yanked": yanked}

    listing = {
        "demo": [
            file("demo-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "a"),
            file("demo-1.0-cp312-cp312-manylinux_2_28_aarch64.whl", "b"),
            file("demo-1.0-cp39-abi3-manylinux_2_34_x86_64.whl", "c"),  # abi3: any CPython >= 3.9
            file("demo-1.0-py3-none-any.whl", "d"),
            file("demo-1.0-cp310-cp310-manylinux_2_17_x86_64.whl", "no: CPython 3.10"),
            file("demo-1.0-cp312-cp312-musllinux_1_2_x86_64.whl", "no: musl"),
            file("demo-1.0-cp312-cp312-win_amd64.whl", "no: Windows"),
            file("demo-1.0-cp312-cp312-macosx_11_0_arm64.whl", "no: macOS"),
            file("demo-1.0-cp312-cp312-manylinux_2_41_x86_64.whl", "no: a glibc newer than the nodes'"),
            file("demo-1.0.tar.gz", "no: wheels fit"),
            file("demo-1.1-py3-none-any.whl", "no: another release"),
            file("demo-1.0-py2.py3-none-any.whl", "no: yanked", yanked=True),
            file("demo-0.1-py36+-none-any.whl", "no: a name that does not parse"),
        ],
        "source-only": [file("source_only-2.0.tar.gz", "s"), file("source_only-2.0-cp312-cp312-win32.whl", "w")],
    }

    class Answer:
        def __init__(self, project: str):
            self.body = json.dumps({"files": listing[project]}).encode()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, *args):
            body, self.body = self.body, b""
            return body

    def urlopen(request, timeout):
        assert request.full_url.startswith(f"{pypi.PYPI_SIMPLE}/") and request.get_header("Accept").startswith(
            "application/vnd.pypi.simple.v1+json"
        )
        return Answer(request.full_url.rstrip("/").rsplit("/", 1)[1])

    monkeypatch.setattr(pypi.urllib.request, "urlopen", urlopen)
    demo = {
        "a": "demo-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "b": "demo-1.0-cp312-cp312-manylinux_2_28_aarch64.whl",
        "c": "demo-1.0-cp39-abi3-manylinux_2_34_x86_64.whl",
        "d": "demo-1.0-py3-none-any.whl",
    }
    assert pypi.node_files("demo", "1.0") == demo
    assert pypi.node_files("Source_Only", "2.0") == {"s": "source_only-2.0.tar.gz"}
    assert pypi.pypi_hashes(INTEL, "demo==1.0\ntorch==2.8.0+cpu\nsource-only==2.0\n") == {
        "demo": demo,
        "source-only": {"s": "source_only-2.0.tar.gz"},
    }
    listing["demo"] = listing["demo"][-3:]
    with pytest.raises(RuntimeError, match=r"PyPI has no file a node can install of demo==1.0$"):
        pypi.pypi_hashes(INTEL, "demo==1.0\n")
