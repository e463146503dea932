"""Kubernetes, node side: the kubelet device-plugin API (``gpushare.io/share``) served by
the agent, and the kubelet PodResources API it checks allocations against."""
