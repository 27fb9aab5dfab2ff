"""The kube-scheduler's filters for the fake (Script.scheduler): the seeded node a new pod is bound to,
or the message a real scheduler writes on its PodScheduled=False condition. Without it the fake binds
every pod, so a pod that no real node would take (a taint it does not tolerate, requests beyond a
node's allocatable) passed every test.

The filters are those of the default plugins our pods meet (kubernetes.io/docs/reference/scheduling/config):
NodeUnschedulable, TaintToleration (NoSchedule and NoExecute), NodeAffinity (the nodeSelector and the
required node affinity's matchExpressions),
NodeResourcesFit (cpu, memory and nvidia.com/gpu against allocatable, less the requests of the pods
bound there and not ended, and of the node's DaemonSet pods), and InterPodAffinity for the training
pods' required anti-affinity (one pod carrying the attempt label per node). Written from the
documentation, apart from the launcher's own code, so that the two cannot share a mistake."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

from kubernetes.utils import parse_quantity

RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
ATTEMPT_LABEL = "nanocluster.dev/attempt"
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def requests_of(spec: dict) -> dict[str, Decimal]:
    """The pod's requests, summed over its containers (an extended resource is requested by its limit)."""
    total: Counter = Counter()
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name in RESOURCES:
            if name in asked:
                total[name] += parse_quantity(asked[name])
    return dict(total)


def tolerated(tolerations: list[dict], taint: dict) -> bool:
    """The toleration rules of kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration."""
    for t in tolerations:
        operator = t.get("operator") or "Equal"
        key_ok = (not t.get("key") and operator == "Exists") or t.get("key") == taint.get("key")
        value_ok = operator == "Exists" or (t.get("value") or "") == (taint.get("value") or "")
        if key_ok and value_ok and (t.get("effect") or "") in ("", taint.get("effect")):
            return True
    return False


def matches(expression: dict, labels: dict) -> bool:
    """A node selector requirement against a node's labels (In, NotIn, Exists, DoesNotExist; NotIn and
    DoesNotExist match a node without the label)."""
    key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
    return {
        "In": key in labels and labels[key] in values,
        "NotIn": key not in labels or labels[key] not in values,
        "Exists": key in labels,
        "DoesNotExist": key not in labels,
    }[operator]


def anti_affine(spec: dict) -> bool:
    """Whether the pod keeps its node to itself against other pods carrying the attempt label."""
    terms = ((spec.get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or []
    return any(
        any(e.get("key") == ATTEMPT_LABEL for e in (term.get("labelSelector") or {}).get("matchExpressions") or [])
        for term in terms
    )


def why_not(node: dict, spec: dict, labels: dict, bound: list[tuple[dict, dict]], daemonsets: dict) -> str:
    """The reason the node does not take the pod, in the scheduler's words; "" when it does."""
    if (node.get("spec") or {}).get("unschedulable"):
        return "node(s) were unschedulable"
    tolerations = spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in BLOCKING_EFFECTS and not tolerated(tolerations, taint):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value') or ''}}}"
    node_labels = (node.get("metadata") or {}).get("labels") or {}
    if any(node_labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return "node(s) didn't match Pod's node affinity/selector"
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if terms and not any(all(matches(e, node_labels) for e in t.get("matchExpressions") or []) for t in terms):
        return "node(s) didn't match Pod's node affinity/selector"
    if ATTEMPT_LABEL in labels and any(
        ATTEMPT_LABEL in other_labels and anti_affine(other) for other, other_labels in bound
    ):
        return "node(s) didn't match pod anti-affinity rules"
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    used: Counter = Counter({k: parse_quantity(v) for k, v in daemonsets.items()})
    for other, _ in bound:
        used.update(requests_of(other))
    for name, amount in requests_of(spec).items():
        if amount and used[name] + amount > parse_quantity(allocatable.get(name, "0")):
            return f"Insufficient {name}"
    return ""


def place(spec: dict, labels: dict, nodes: list[dict], bound: dict[str, list[tuple[dict, dict]]], daemonsets: dict):
    """(the node's name, "") for the first node that takes the pod, else ("", the scheduler's message).
    bound: node name -> the (spec, labels) of the pods bound there and not ended."""
    reasons: Counter = Counter()
    for node in nodes:
        name = node["metadata"]["name"]
        reason = why_not(node, spec, labels, bound.get(name, []), daemonsets)
        if not reason:
            return name, ""
        reasons[reason] += 1
    listed = ", ".join(
        f"{count} {reason}" for reason, count in sorted(reasons.items(), key=lambda item: (item[0], item[1]))
    )
    return "", f"0/{len(nodes)} nodes are available: {listed}."
