"""The legacy path's node side: the kubelet's device-plugin and PodResources APIs
(:mod:`.kubelet`), the NRI plugin (:mod:`.nri`), the pod allocations behind both
(:mod:`.podalloc`, their durable records in :mod:`.records`) and their start
(:mod:`.start`)."""
