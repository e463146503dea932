{{/*
The first word of every object's name and of the app.kubernetes.io/name labels:
nameOverride, else the chart's name (gpushare). Objects are named <name>-agent,
<name>-scheduler, ... Not renamed: what the code or Kubernetes knows by its own name (the
DRA driver and DeviceClass gpushare.io, the scheduler name gpushare, the webhooks'
*.gpushare.io, the admission policies of templates/policy) and the Secrets named in
certificates.secrets.
*/}}
{{- define "gpushare.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The namespace of every namespaced object: namespaceOverride, else namespace.name,
else the release's. */}}
{{- define "gpushare.namespace" -}}
{{- coalesce .Values.namespaceOverride .Values.namespace.name .Release.Namespace -}}
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
{{- if not (has .Values.certificates.mode (list "certManager" "generated" "secrets")) -}}
{{- fail (printf "certificates.mode: %q is none of certManager, generated, secrets" .Values.certificates.mode) -}}
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

{{- define "gpushare.generated" -}}
{{- if eq .Values.certificates.mode "generated" -}}true{{- end -}}
{{- end -}}

{{/* The agents' ConfigMap (both DaemonSets mount it): <name>-agent-config. */}}
{{- define "gpushare.agentConfigMap" -}}
{{- printf "%s-agent-config" (include "gpushare.name" .) -}}
{{- end -}}

{{- define "gpushare.tokenSecret" -}}
{{- default (printf "%s-agent-token" (include "gpushare.name" .)) .Values.token.existingSecret -}}
{{- end -}}

{{- define "gpushare.issuerRef" -}}
issuerRef:
  kind: {{ .Values.certificates.issuer.kind }}
  name: {{ .Values.certificates.issuer.name }}
{{- end -}}

{{/*
The kube-scheduler image's tag (scheduler.version): as given, else the cluster's version
(.Capabilities.KubeVersion) cut to vX.Y.Z ("v1.34.2-gke.1" -> "v1.34.2"). Helm only knows
the cluster's version where it talks to one (helm install, helm upgrade, --dry-run=server):
rendered offline (helm template, a client-side dry run) it has a default of its
own, always vX.Y.0, unless --kube-version names one. So a vX.Y.0 from no cluster (the
Namespace kube-system not found) is refused: name the version then.
*/}}
{{- define "gpushare.schedulerVersion" -}}
{{- if .Values.scheduler.version -}}
{{- .Values.scheduler.version -}}
{{- else -}}
{{- $kube := .Capabilities.KubeVersion.Version -}}
{{- $cut := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" $kube -}}
{{- if not $cut -}}
{{- fail (printf "scheduler.version: the cluster's version %q is not vX.Y.Z; set scheduler.version to your control plane's (kubectl version), e.g. v1.34.2" $kube) -}}
{{- end -}}
{{- if and (regexMatch "^v?[0-9]+\\.[0-9]+\\.0$" $kube) (not (lookup "v1" "Namespace" "" "kube-system")) -}}
{{- fail (printf "scheduler.version is required when rendering without a cluster (helm template, a client-side --dry-run): Helm's default Kubernetes version %s is not your control plane's. Set scheduler.version to your control plane's version (kubectl version), e.g. --set scheduler.version=v1.34.2, or give --kube-version with its patch release" $kube) -}}
{{- end -}}
{{- printf "v%s" (trimPrefix "v" $cut) -}}
{{- end -}}
{{- end -}}

{{/*
The priorityClassName of a component's pods: the chart's own PriorityClass when
priorityClass.create, else the component's value ("" none). (list $ VALUE)
*/}}
{{- define "gpushare.priorityClassName" -}}
{{- $root := index . 0 -}}
{{- if $root.Values.priorityClass.create -}}
{{- include "gpushare.priorityClass" $root -}}
{{- else -}}
{{- index . 1 -}}
{{- end -}}
{{- end -}}

{{- define "gpushare.priorityClass" -}}
{{- default (printf "%s-critical" (include "gpushare.name" .)) .Values.priorityClass.name -}}
{{- end -}}

{{/*
The nodes of the agents and their MPS daemons (both DaemonSets): nodeSelector, else the
opt-in label gpushare.io/node=true. A null value drops a key; values are strings.

Refused on `helm upgrade` where it would delete MPS host pods: a DaemonSet's controller
deletes its pods on the nodes its nodeSelector no longer selects, OnDelete or not, and
the MPS host pod holds every MPS server of its node's jobs. Unless nodeSelectorMigrated:
  - the live MPS host DaemonSet (read where Helm talks to the cluster) selecting other
    nodes than this one would;
  - without it (offline, or gone): the default label, which earlier charts did not use
    (they selected nvidia.com/gpu.present=true).
*/}}
{{- define "gpushare.nodeSelector" -}}
{{- $selector := dict -}}
{{- range $key, $value := .Values.nodeSelector -}}
{{- if not (kindIs "invalid" $value) -}}
{{- $_ := set $selector $key (toString $value) -}}
{{- end -}}
{{- end -}}
{{- $default := not $selector -}}
{{- if $default -}}
{{- $_ := set $selector "gpushare.io/node" "true" -}}
{{- end -}}
{{- if and .Release.IsUpgrade (not .Values.nodeSelectorMigrated) -}}
{{- $live := lookup "apps/v1" "DaemonSet" (include "gpushare.namespace" .) (printf "%s-mps-host" (include "gpushare.name" .)) -}}
{{- $was := "" -}}
{{- $changed := false -}}
{{- if $live -}}
{{- $old := dict -}}
{{- range $key, $value := ($live.spec.template.spec.nodeSelector | default dict) -}}
{{- $_ := set $old $key (toString $value) -}}
{{- end -}}
{{- $changed = not (deepEqual $old $selector) -}}
{{- $was = printf "the running MPS host DaemonSet selects %s" (toJson $old) -}}
{{- else if $default -}}
{{- $changed = true -}}
{{- $was = "earlier releases of this chart selected nvidia.com/gpu.present=true by default" -}}
{{- end -}}
{{- if $changed -}}
{{- fail (printf "nodeSelector: this upgrade would select the nodes %s, but %s. Kubernetes deletes the MPS host pod, and with it every running job's MPS server, on each node no longer selected. Label the GPU nodes first (kubectl label node NODE gpushare.io/node=true, for each), then upgrade with --set nodeSelectorMigrated=true; or keep the old nodes with an explicit nodeSelector, e.g. --set-string nodeSelector.nvidia\\.com/gpu\\.present=true" (toJson $selector) $was) -}}
{{- end -}}
{{- end -}}
{{- toYaml $selector -}}
{{- end -}}

{{/* Where the agents and their MPS daemons run (both DaemonSets). */}}
{{- define "gpushare.nodePlacement" -}}
{{- include "gpushare.nodePlacementLines" . | trim -}}
{{- end -}}

{{- define "gpushare.nodePlacementLines" -}}
{{- if .Values.runtimeClassName }}
runtimeClassName: {{ .Values.runtimeClassName }}
{{- end }}
nodeSelector:
  {{- include "gpushare.nodeSelector" . | nindent 2 }}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
certificates.mode generated: the chart's own CA and certificates (templates/certificates/
generated.yaml writes them as Secrets, scheduler/webhook.yaml the CA as caBundle). Made
once per render and kept in .Values (every template of a render shares it), so every
object names the same CA. Kept across upgrades: each Secret is read back (lookup) and kept
while it names what it is for (annotation gpushare.io/certificate-for), its annotation
gpushare.io/not-after is further than renewBeforeDays away and, for a leaf, its ca.crt is
the kept CA's. What is missing, changed or near expiry is made anew: a leaf signed by the
same CA, so peers that still hold the old files keep verifying it; a new CA (missing or
near expiry) makes every leaf anew with it. Helm's functions give every leaf both usages
(server auth, client auth) and ECDSA P-256 keys. Rendered without a cluster (helm
template, a client-side dry run) nothing can be read back: every render makes new ones.

Returns nothing; read the result with (get .Values "__gpushareGeneratedCertificates"):
{ca: {Cert, Key}, LEAF: {Cert, Key, notAfter, for}} for LEAF in agent, schedulerClient,
webhook (extender path) and draControllerClient (dra path).
*/}}
{{- define "gpushare.generateCertificates" -}}
{{- if not (hasKey .Values "__gpushareGeneratedCertificates") -}}
{{- $name := include "gpushare.name" . -}}
{{- $ns := include "gpushare.namespace" . -}}
{{- $gen := .Values.certificates.generated -}}
{{- $renewS := mul (int $gen.renewBeforeDays) 86400 -}}
{{- if ge (int $gen.renewBeforeDays) (int $gen.days) -}}
{{- fail (printf "certificates.generated.renewBeforeDays (%v) must be below certificates.generated.days (%v): every upgrade would renew them" $gen.renewBeforeDays $gen.days) -}}
{{- end -}}
{{- if ge (int $gen.days) (int $gen.caDays) -}}
{{- fail (printf "certificates.generated.days (%v) must be below certificates.generated.caDays (%v)" $gen.days $gen.caDays) -}}
{{- end -}}
{{- $result := dict -}}
{{- $caFor := "CN=gpushare-ca" -}}
{{- $caLive := lookup "v1" "Secret" $ns (printf "%s-ca" $name) -}}
{{- $ca := dict -}}
{{- if include "gpushare.keptCertificate" (list $caLive $caFor $renewS "") -}}
{{- $kept := buildCustomCert (index $caLive.data "tls.crt") (index $caLive.data "tls.key") -}}
{{- $ca = dict "Cert" $kept.Cert "Key" $kept.Key "notAfter" (index $caLive.metadata.annotations "gpushare.io/not-after") "for" $caFor -}}
{{- else -}}
{{- $made := genCAWithKey "gpushare-ca" (int $gen.caDays) (genPrivateKey "ecdsa") -}}
{{- $ca = dict "Cert" $made.Cert "Key" $made.Key "notAfter" (include "gpushare.notAfter" $gen.caDays) "for" $caFor -}}
{{- end -}}
{{- $_ := set $result "ca" $ca -}}
{{- $service := printf "%s-agent.%s.svc" $name $ns -}}
{{- $leaves := dict "agent" (list (printf "%s-agent" $name) (list $service (printf "*.%s" $service))) -}}
{{- if include "gpushare.extender" . -}}
{{- $_ := set $leaves "schedulerClient" (list "gpushare-scheduler" list) -}}
{{- $_ := set $leaves "webhook" (list (printf "%s-webhook" $name) (list (printf "%s-webhook.%s.svc" $name $ns))) -}}
{{- end -}}
{{- if include "gpushare.dra" . -}}
{{- $_ := set $leaves "draControllerClient" (list "gpushare-dra-controller" list) -}}
{{- end -}}
{{- range $leaf, $subject := $leaves -}}
{{- $cn := index $subject 0 -}}
{{- $dns := index $subject 1 -}}
{{- $for := printf "CN=%s" $cn -}}
{{- if $dns -}}{{- $for = printf "%s; DNS=%s" $for (join "," $dns) -}}{{- end -}}
{{- $live := lookup "v1" "Secret" $ns (get $.Values.certificates.secrets $leaf) -}}
{{- if include "gpushare.keptCertificate" (list $live $for $renewS $ca.Cert) -}}
{{- $_ := set $result $leaf (dict "Cert" (index $live.data "tls.crt" | b64dec) "Key" (index $live.data "tls.key" | b64dec) "notAfter" (index $live.metadata.annotations "gpushare.io/not-after") "for" $for) -}}
{{- else -}}
{{- $made := genSignedCertWithKey $cn nil $dns (int $gen.days) (buildCustomCert ($ca.Cert | b64enc) ($ca.Key | b64enc)) (genPrivateKey "ecdsa") -}}
{{- $_ := set $result $leaf (dict "Cert" $made.Cert "Key" $made.Key "notAfter" (include "gpushare.notAfter" $gen.days) "for" $for) -}}
{{- end -}}
{{- end -}}
{{- $_ := set .Values "__gpushareGeneratedCertificates" $result -}}
{{- end -}}
{{- end -}}

{{/* now + DAYS as RFC 3339 (UTC): a certificate's notAfter as Helm's functions set it. */}}
{{- define "gpushare.notAfter" -}}
{{- dateInZone "2006-01-02T15:04:05Z07:00" (now | dateModify (printf "+%dh" (mul (int .) 24))) "UTC" -}}
{{- end -}}

{{/*
"true" when a Secret read back (list SECRET FOR RENEW_BEFORE_S CA_PEM) may be kept: it has
tls.crt and tls.key, is for FOR, is not within RENEW_BEFORE_S of its notAfter and, with
CA_PEM, its ca.crt is that CA.
*/}}
{{- define "gpushare.keptCertificate" -}}
{{- $secret := index . 0 -}}
{{- $for := index . 1 -}}
{{- $renewS := index . 2 -}}
{{- $caPem := index . 3 -}}
{{- if $secret -}}
{{- $data := $secret.data | default dict -}}
{{- $notes := $secret.metadata.annotations | default dict -}}
{{- $notAfter := get $notes "gpushare.io/not-after" -}}
{{- $leftS := sub (toDate "2006-01-02T15:04:05Z07:00" $notAfter | unixEpoch | int64) (now | unixEpoch | int64) -}}
{{- if and (get $data "tls.crt") (get $data "tls.key") (eq (get $notes "gpushare.io/certificate-for") $for) $notAfter (gt $leftS (int64 $renewS)) -}}
{{- if or (not $caPem) (eq (get $data "ca.crt" | b64dec) $caPem) -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
