"""Where things are on the nodes: the local cluster is this machine, every other cluster ~/nanocluster."""

import shlex
import socket
import sys

from launcher.cluster.contract import parse_contract
from launcher.cluster.node_layout import QUICKSTART_CONFIG, REPO_ROOT, site_of
from launcher.cluster.staged_code import code_archive


def test_the_local_cluster_runs_this_checkout_with_this_python_in_its_home(local3, local_home):
    site = site_of(local3)
    assert site.root == shlex.quote(str(local_home)) and site.shown_root == str(local_home)
    assert site.python == shlex.quote(sys.executable)
    assert site.code_dir == shlex.quote(str(REPO_ROOT))
    assert not (site.ships_code or site.ships_keys or site.bootstraps or site.checks_contract)
    assert site.default_config == str(QUICKSTART_CONFIG)
    assert site.run_dir("r1") == f"{site.root}/runs/r1"
    assert site.shown(f"{site.root}/runs/r1/ckpt.pt") == f"{local_home}/runs/r1/ckpt.pt"


def test_the_local_cluster_picks_a_free_port_unless_one_is_asked_for(local3):
    site = site_of(local3)
    port = site.port(None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nothing listens on it
    assert site.port(29611) == 29611


def test_a_contract_cluster_uses_the_nodes_nanocluster_directory(contract):
    site = site_of(parse_contract(contract, "lab.json"))
    assert site.root == '"$HOME"/nanocluster' and site.shown_root == "~/nanocluster"
    assert site.python == '"$HOME"/nanocluster/venv/bin/python'
    assert site.code_dir == f'"$HOME"/nanocluster/code/{code_archive(REPO_ROOT)[1]}'  # this checkout's version
    assert site.ships_code and site.ships_keys and site.bootstraps and site.checks_contract
    assert site.port(None) == 29500 and site.default_config == ""
    assert site.shown(f"{site.root}/runs/main/ckpt.pt") == "~/nanocluster/runs/main/ckpt.pt"


def test_node_python_from_the_contract_replaces_the_bootstrap_venv(contract):
    contract["node_python"] = "/opt/my env/bin/python"
    assert site_of(parse_contract(contract, "lab.json")).python == "'/opt/my env/bin/python'"
