"""Which cluster, and where things are on it: read before any node is touched.

inventory      --cluster to a validated Cluster (the output contract), of kind machines or kubernetes
kube_contract  the kubernetes kind's own contract keys and kubeconfig:PATH[#CONTEXT], parsed without the API
node_layout    where things are on the nodes (venv, code, data, runs, ports); what the local cluster does differently
"""
