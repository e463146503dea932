"""The kubelet side of the agent as a DRA driver: registration, the ``DRAPlugin`` and
health services, ResourceSlice publishing and CDI specs. Nothing here knows of leases or
MPS; :mod:`agent.claims.driver` adapts it to the node's admissions."""
