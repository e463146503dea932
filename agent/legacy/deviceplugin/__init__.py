"""The legacy path's node side: the start of the kubelet device plugin and of the NRI
plugin (:mod:`agent.kubelet`, :mod:`agent.nri`), and the pod allocations behind them."""
