{{/* The namespace of every namespaced object. */}}
{{- define "gpushare.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name -}}
{{- end -}}

{{/* The agent's image: REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@DIGEST. */}}
{{- define "gpushare.image" -}}
{{- $repo := .Values.image.repository -}}
{{- if .Values.image.registry -}}{{- $repo = printf "%s/%s" (trimSuffix "/" .Values.image.registry) $repo -}}{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gpushare.checkPath" -}}
{{- if not (has .Values.path (list "extender" "dra" "both")) -}}
{{- fail (printf "path: %q is none of extender, dra, both" .Values.path) -}}
{{- end -}}
{{- if not (has .Values.certificates.mode (list "certManager" "secrets")) -}}
{{- fail (printf "certificates.mode: %q is none of certManager, secrets" .Values.certificates.mode) -}}
{{- end -}}
{{- if not (has .Values.certificates.issuer.kind (list "Issuer" "ClusterIssuer")) -}}
{{- fail (printf "certificates.issuer.kind: %q is none of Issuer, ClusterIssuer" .Values.certificates.issuer.kind) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the extender path (scheduler, device plugin, webhook) is installed. */}}
{{- define "gpushare.extender" -}}
{{- include "gpushare.checkPath" . -}}
{{- if has .Values.path (list "extender" "both") -}}true{{- end -}}
{{- end -}}

{{/* "true" when the DRA path (driver gpushare.io) is installed. */}}
{{- define "gpushare.dra" -}}
{{- include "gpushare.checkPath" . -}}
{{- if has .Values.path (list "dra" "both") -}}true{{- end -}}
{{- end -}}

{{- define "gpushare.certManager" -}}
{{- if eq .Values.certificates.mode "certManager" -}}true{{- end -}}
{{- end -}}

{{- define "gpushare.tokenSecret" -}}
{{- default "gpushare-agent-token" .Values.token.existingSecret -}}
{{- end -}}

{{- define "gpushare.issuerRef" -}}
issuerRef:
  kind: {{ .Values.certificates.issuer.kind }}
  name: {{ .Values.certificates.issuer.name }}
{{- end -}}

{{/* Where the agents and their MPS daemons run (both DaemonSets). */}}
{{- define "gpushare.nodePlacement" -}}
{{- if .Values.runtimeClassName }}
runtimeClassName: {{ .Values.runtimeClassName }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
