"""tools/lock/node_file.py: the file a node installs, its indexes, hashed pins and seal, written from a
resolution; written anew from the same pins, it is the committed file."""

from tests.tools.lock.copies import CUDA, INTEL, copy_of_the_lock, regenerate
from tools.lock.node_file import SEAL, node_requirements, seal_of
from tools.lock.profiles import PROFILES
from tools.lock.requirements import ROOT, pins


def test_node_files_carry_their_indexes_and_the_intel_stack_replaces_torch():
    intel = INTEL
    resolved = "numpy==2.4.6\ntorch==2.13.0+cpu\nimpi-rt==2021.18.1\n"
    text = node_requirements(intel, resolved)
    assert [line for line in text.splitlines() if line.startswith("--")] == [
        f"--extra-index-url {url}" for url in intel.indexes
    ]
    assert pins(text) == {
        "numpy": "2.4.6",
        "impi-rt": "2021.18.1",
        "torch": "2.8.0+cpu",
        "intel-extension-for-pytorch": "2.8.0",
        "oneccl-bind-pt": "2.8.0+cpu",
    }


def test_node_requirements_hash_each_pypi_pin_and_seal_them():
    text = node_requirements(CUDA, "numpy==2.4.6\ntorch==2.13.0+cpu\n", {"numpy": ["ab", "cd"], "torch": ["ef"]})
    assert "numpy==2.4.6 --hash=sha256:ab --hash=sha256:cd" in text.splitlines()
    assert "torch==2.13.0 --hash=sha256:ef" in text.splitlines()
    assert not any(line.startswith("--") for line in text.splitlines())
    (seal,) = [line for line in text.splitlines() if line.startswith(SEAL)]
    assert seal == SEAL + seal_of(text)


def test_regenerating_the_node_files_unchanged_writes_them_as_they_are(tmp_path):
    root = copy_of_the_lock(tmp_path)
    regenerate(root)
    for profile in PROFILES:
        assert (root / profile.path).read_text() == (ROOT / profile.path).read_text()
