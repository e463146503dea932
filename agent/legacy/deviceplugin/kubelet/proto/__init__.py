"""The kubelet's gRPC APIs, generated from the upstream protos: the device-plugin API
(``v1beta1``: ``deviceplugin_pb2``) and PodResources (``v1``: ``podresources_pb2``)."""
