"""The Kubernetes API as the agent's parts use it: a narrow port (:mod:`.port`) and its
one adapter (:mod:`.rest`), leader election (:mod:`.leader`) and the DaemonSet rollout
wait (:mod:`.rollout`), on a floor below both the extender path's cluster side
(:mod:`agent.legacy.cluster`) and the DRA path (:mod:`agent.dra`, :mod:`agent.dracontrol`)."""
