"""localkube: a real Kubernetes v1.20 control plane on loopback plus a node agent that simulates
heterogeneous GPU nodes and runs pods as local processes. A test/demo harness for Holmes; not
part of the shipped `holmes` package. Run with `PYTHONPATH=hack python -m localkube --help`."""
