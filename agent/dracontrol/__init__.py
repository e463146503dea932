"""The DRA path's cluster side: one elected controller follows the ResourceClaims of the
cluster once, asks the agent of the node where a share of driver ``gpushare.io`` waits for
its binding condition, and writes the agent's answer into the claim's ``status.devices``
(docs/kubernetes.md, "Binding answers"). It sits beside :mod:`agent.legacy.cluster`
(the extender path) on the :mod:`agent.kubeapi` floor; neither imports the other."""
