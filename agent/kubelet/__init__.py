"""What every kubelet plugin of the agent shares (the DRA driver's and, behind the legacy
fence, the device plugin's): its socket's lifecycle and the compiler of the kubelet's
protos. Knows nothing of leases."""
