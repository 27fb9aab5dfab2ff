"""Which cluster, and where things are on it: read before any node is touched.

inventory      the Cluster every task reads: its Nodes, its kind (machines or kubernetes), where it came from
contract       --cluster to a validated Cluster: the output contract of a stack, a JSON file or a kubeconfig
kube_contract  the kubernetes kind's own contract keys and kubeconfig:PATH[#CONTEXT], parsed without the API
local          this machine: its cores, memory and GPUs, its home (every cluster's directory), the local cluster
node_layout    where things are on the nodes (venv, code, data, runs, ports); what the local cluster does differently
"""
