"""The edges: gRPC service, HTTP health and metrics. Only this layer maps errors to gRPC."""
