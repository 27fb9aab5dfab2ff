"""The kubeconfig of a GKE cluster: its endpoint and CA, and gke-gcloud-auth-plugin as the user.

The file holds no credential: kubectl, the kubernetes client and pulumi-kubernetes run the plugin,
which hands them a short-lived token of whoever is logged in to gcloud
(https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-access-for-kubectl).
"""

from __future__ import annotations

import yaml

AUTH_PLUGIN = "gke-gcloud-auth-plugin"
INSTALL_HINT = "Install gke-gcloud-auth-plugin: gcloud components install gke-gcloud-auth-plugin"


def render_kubeconfig(context: str, endpoint: str, ca_certificate_base64: str) -> str:
    """A kubeconfig with one cluster, user and context, all named `context`, and it current."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": context,
                "cluster": {"server": f"https://{endpoint}", "certificate-authority-data": ca_certificate_base64},
            }
        ],
        "users": [
            {
                "name": context,
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": AUTH_PLUGIN,
                        "installHint": INSTALL_HINT,
                        "provideClusterInfo": True,
                        "interactiveMode": "IfAvailable",
                    }
                },
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
    }
    return yaml.safe_dump(document, sort_keys=False)
