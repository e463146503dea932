"""The Kubernetes test world: the stand-ins for the API server (:mod:`.apiserver`, one module
per API group), the kubelet (:mod:`.kubelet`), kube-scheduler (:mod:`.scheduler`), the one
quantity reader (:mod:`.quantity`) and the loopback clusters of either path
(:mod:`.cluster`), shared by the tests and the benchmarks. See README.md beside this file."""
