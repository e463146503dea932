{{/*
"true" when `helm uninstall` resets the compute mode (uninstall.resetComputeMode.enabled):
the DaemonSet of reset-compute-mode.yaml and the Job's wait for it. It needs the hook, and
the timeouts nest: each reset pod's wait for its agent (agentWaitSeconds) ends before the
Job's wait for the pods (timeoutSeconds), so that a pod whose agent did not stop has said
so in its status when the Job names the nodes not ready; and that wait ends before the
Job's own deadline (hook.timeoutSeconds), which also covers releasing the finalizers.
*/}}
{{- define "gpushare.uninstallReset" -}}
{{- $u := .Values.uninstall -}}
{{- if $u.resetComputeMode.enabled -}}
{{- if not $u.hook.enabled -}}
{{- fail "uninstall.resetComputeMode.enabled needs uninstall.hook.enabled: the reset is part of the pre-delete hook" -}}
{{- end -}}
{{- if ge (int $u.resetComputeMode.agentWaitSeconds) (int $u.resetComputeMode.timeoutSeconds) -}}
{{- fail (printf "uninstall.resetComputeMode.agentWaitSeconds (%d) must be below uninstall.resetComputeMode.timeoutSeconds (%d), the Job's wait for the reset pods, which each wait that long for their node's agent to stop" (int $u.resetComputeMode.agentWaitSeconds) (int $u.resetComputeMode.timeoutSeconds)) -}}
{{- end -}}
{{- if ge (int $u.resetComputeMode.timeoutSeconds) (int $u.hook.timeoutSeconds) -}}
{{- fail (printf "uninstall.resetComputeMode.timeoutSeconds (%d) must be below uninstall.hook.timeoutSeconds (%d), the Job's deadline, which also covers releasing the finalizers" (int $u.resetComputeMode.timeoutSeconds) (int $u.hook.timeoutSeconds)) -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when `helm uninstall` has a pre-delete hook: the extender path's finalizers
to release, or the compute mode to reset. */}}
{{- define "gpushare.uninstallHook" -}}
{{- if and .Values.uninstall.hook.enabled (or (include "gpushare.extender" .) (include "gpushare.uninstallReset" .)) -}}
true
{{- end -}}
{{- end -}}

{{/* One step of the uninstall Job: a container in the agent's image running `gpushare
ARGS...` with the pod's service account. (list $ NAME ARGS) */}}
{{- define "gpushare.uninstallStep" -}}
{{- $root := index . 0 -}}
- name: {{ index . 1 }}
  image: {{ include "gpushare.image" $root }}  # the agent's image holds the CLI
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  # The image's entrypoint is `gpushare`.
  args: {{ toJson (index . 2) }}
  resources:
    {{- toYaml $root.Values.uninstall.hook.resources | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
{{- end -}}
