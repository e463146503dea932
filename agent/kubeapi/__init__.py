"""The Kubernetes API as the agent's parts use it: a narrow port (:mod:`.port`) and its
one adapter (:mod:`.rest`), on a floor below both the cluster side (:mod:`agent.kube`)
and the DRA driver (:mod:`agent.dra`)."""
