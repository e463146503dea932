"""The legacy path, fenced so that it can be deleted in one piece once clusters schedule
shares with DRA (docs/kubernetes.md, "The legacy fence"): the cluster side
(:mod:`.cluster`: the mutating webhook, the second scheduler's extender and binder, the
lease controller) and the node side (:mod:`.deviceplugin`: the kubelet device plugin, the
NRI plugin and the pod allocations), with the vocabulary both speak (:mod:`.podleases`).
Nothing outside it imports it but the app's wiring and the CLI's legacy commands (an
import-linter contract holds it so)."""
