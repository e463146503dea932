"""Kubernetes, cluster side: the admission webhook, the kube-scheduler extender and the
lease lifecycle controller. They decide nothing themselves: every placement is the agents'
answer (Admit, Reserve/Commit) and every end is a Release. The API server is reached only
through :class:`agent.kubeapi.port.KubeApi`; one adapter (:mod:`agent.kubeapi.rest`) speaks it."""
