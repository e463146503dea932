"""The node's folder and its kubelet stand-in, as the device-plugin tests have them."""

from tests.integration.api.test_pod_allocation import kubelet, root

__all__ = ["kubelet", "root"]
