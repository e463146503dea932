"""The legacy path's cluster side (fenced, see :mod:`agent.legacy`): the admission
webhook, the kube-scheduler extender and its binder, the lease lifecycle controller and
the node-state publisher. They decide nothing themselves: every placement is the agents'
answer (Admit, Reserve/Commit) and every end is a Release. The API server is reached only
through :class:`agent.kubeapi.port.KubeApi`; one adapter (:mod:`agent.kubeapi.rest`)
speaks it."""
