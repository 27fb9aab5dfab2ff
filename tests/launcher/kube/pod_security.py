"""A checker of Pod Security Standards "restricted" (which includes "baseline") for a pod spec in the
API's camelCase form, written from the documented controls (kubernetes.io/docs/concepts/security/
pod-security-standards, policy version latest): a test's stand-in for the admission controller.

Every rule reads the pod's containers, initContainers and ephemeralContainers alike."""

from __future__ import annotations

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
PROFILES = {"RuntimeDefault", "Localhost"}


def containers(spec: dict) -> list[dict]:
    return [c for key in ("containers", "initContainers", "ephemeralContainers") for c in spec.get(key) or []]


def violations(spec: dict) -> list[str]:
    """What "restricted" refuses in a pod spec, one line per control and place ([] when it passes)."""
    pod_context = spec.get("securityContext") or {}
    found: list[str] = []
    places = [("pod", pod_context)]
    places += [(f"container {c.get('name')}", c.get("securityContext") or {}) for c in containers(spec)]

    # --- baseline ---
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"host namespaces: {key}")
    for where, context in places:
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"{where}: hostProcess")
        if context.get("privileged"):
            found.append(f"{where}: privileged")
        if (context.get("appArmorProfile") or {}).get("type", "RuntimeDefault") not in PROFILES:
            found.append(f"{where}: appArmorProfile")
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append(f"{where}: seLinuxOptions")
        if context.get("procMount", "Default") != "Default":
            found.append(f"{where}: procMount")
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"{where}: seccompProfile Unconfined")
        if context.get("runAsUser") == 0:
            found.append(f"{where}: runAsUser 0")
        if context.get("runAsNonRoot") is False:
            found.append(f"{where}: runAsNonRoot false")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"pod: sysctl {sysctl.get('name')}")
    for volume in spec.get("volumes") or []:
        kind = next((k for k in volume if k != "name"), "")
        if kind not in RESTRICTED_VOLUMES:  # hostPath (baseline) and every other inline type (restricted)
            found.append(f"volume {volume.get('name')}: type {kind}")
    for container in containers(spec):
        name = container.get("name")
        if any(p.get("hostPort") for p in container.get("ports") or []):
            found.append(f"container {name}: hostPort")

        # --- restricted ---
        context = container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"container {name}: allowPrivilegeEscalation != false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"container {name}: capabilities do not drop ALL")
        added = set(capabilities.get("add") or [])
        if added - {"NET_BIND_SERVICE"}:
            kind = "baseline" if added - BASELINE_CAPABILITIES else "restricted"
            found.append(f"container {name}: adds capabilities {sorted(added)} ({kind})")
        if not (pod_context.get("runAsNonRoot") or context.get("runAsNonRoot")):
            found.append(f"container {name}: runAsNonRoot != true")
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if seccomp not in PROFILES:
            found.append(f"container {name}: seccompProfile not RuntimeDefault or Localhost")
    return found
