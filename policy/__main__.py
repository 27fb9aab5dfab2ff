"""Entry point the Pulumi CLI runs for `--policy-pack policy` (python -m pulumi.policy runs this
file with the pack's folder on sys.path; the repository root goes there too, for `policy.*`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack

from policy.pack import PACK_NAME, POLICIES

PolicyPack(name=PACK_NAME, policies=POLICIES, enforcement_level=EnforcementLevel.MANDATORY)
