"""localkube: a real Kubernetes control plane on loopback (the release hack/build-k8s.sh builds)
plus the nodes of a topology: a node agent that simulates heterogeneous GPU nodes and runs pods as
local processes, or a real kubelet on containerd. A test/demo harness for Holmes; not
part of the shipped `holmes` package. Run with `PYTHONPATH=hack python -m localkube --help`."""
