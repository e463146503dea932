{{/*
The one-GPU-per-container admission policies (values oneGpuPerContainerPolicy). A CUDA
process reaches one MPS control daemon (one CUDA_MPS_PIPE_DIRECTORY) and the agent runs one
per GPU, so a container given shares on two GPUs would reach one of them without MPS. The
agent refuses such a claim at its binding answer (ONE_SHARE_PER_REQUEST,
agent/claims/shares.py), after placement, and the scheduler then tries the pod again and
again; these ValidatingAdmissionPolicies refuse it when it is written, where the API shows
it:

  gpushare.oneGpu.dra, in dra/slice-policy.yaml (the DRA path's admission policies):
    gpushare-dra-claim-one-gpu           ResourceClaims
    gpushare-dra-claim-template-one-gpu  ResourceClaimTemplates (the claim spec: spec.spec)
        a request of class gpushare.io (exactly, or a firstAvailable subrequest) with
        allocationMode All or count above 1; not one with adminAccess (a monitoring
        request gets its devices without a share)
    gpushare-dra-gpu-one-gpu             pods: a container (init containers too) asking
                                         above 1 of gpushare.io/gpu (the DeviceClass's
                                         extended resource) or of its implicit name

Every request of every served version of resource.k8s.io reaches the claim policies as v1
(matchPolicy Equivalent): v1beta1's requests have no `exactly`. An UPDATE is checked only
when it changes the spec (the API keeps a claim's spec as it was made): a claim made before
the policy was installed can still have its finalizers removed.
tests/deploy/test_one_gpu_policy.py evaluates their CEL on sample claims and pods.
*/}}

{{/* The device class's name (dra/deviceclass.yaml's; its extended resource: CLASS/gpu). */}}
{{- define "gpushare.oneGpu.class" -}}
gpushare.io
{{- end -}}

{{/* Why a container is served on one GPU: agent/claims/shares.py's, word for word. */}}
{{- define "gpushare.oneGpu.why" -}}
a process reaches one MPS server, so a container is served on one GPU
{{- end -}}

{{/* The policies' and bindings' labels. */}}
{{- define "gpushare.oneGpu.labels" -}}
labels:
  app.kubernetes.io/name: gpushare-agent
  app.kubernetes.io/part-of: gpushare
{{- end -}}

{{/* CEL: whether the (sub)request at . (CEL) asks more than one device of the class. */}}
{{- define "gpushare.oneGpu.overOne" -}}
{{ . }}.deviceClassName == "{{ include "gpushare.oneGpu.class" . }}" &&
((has({{ . }}.allocationMode) && {{ . }}.allocationMode == "All") ||
(has({{ . }}.count) && {{ . }}.count > 1))
{{- end -}}

{{/* CEL: what the (sub)request at . asks, after its name. */}}
{{- define "gpushare.oneGpu.asks" -}}
(has({{ . }}.allocationMode) && {{ . }}.allocationMode == "All" ?
" asks every device" : " asks " + string({{ . }}.count) + " devices") +
" of class {{ include "gpushare.oneGpu.class" . }}"
{{- end -}}

{{/*
A policy and its binding (every namespace) refusing a claim spec (dict "name" NAME
"resource" PLURAL "spec" CEL "oldSpec" CEL: where the object's claim spec is) one of whose
requests asks more than one device of the class.
*/}}
{{- define "gpushare.oneGpu.claimPolicy" -}}
{{- $class := include "gpushare.oneGpu.class" . -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ .name }}
  {{- include "gpushare.oneGpu.labels" . | nindent 2 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    # v1beta1 and v1beta2 requests arrive converted to v1
    matchPolicy: Equivalent
    resourceRules:
      - apiGroups: ["resource.k8s.io"]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: [{{ .resource | quote }}]
  matchConditions:
    # on UPDATE only a changed spec: finalizers and labels may change on any claim
    - name: spec-written
      expression: request.operation == "CREATE" || {{ .spec }} != {{ .oldSpec }}
    - name: asks-the-class
      expression: >-
        has({{ .spec }}.devices) && has({{ .spec }}.devices.requests) &&
        {{ .spec }}.devices.requests.exists(r, has(r.exactly) ?
        r.exactly.deviceClassName == "{{ $class }}" :
        has(r.firstAvailable) && r.firstAvailable.exists(s,
        s.deviceClassName == "{{ $class }}"))
  variables:
    # the requests that ask more than one device of the class: exactly (not with
    # adminAccess: devices without a share), or in one of their firstAvailable subrequests
    - name: over
      expression: >-
        {{ .spec }}.devices.requests.filter(r, has(r.exactly) ?
        {{ include "gpushare.oneGpu.overOne" "r.exactly" | nindent 8 | trim }} &&
        !(has(r.exactly.adminAccess) && r.exactly.adminAccess) :
        has(r.firstAvailable) && r.firstAvailable.exists(s,
        {{ include "gpushare.oneGpu.overOne" "s" | nindent 8 | trim }}))
  validations:
    - expression: size(variables.over) == 0
      # the first of them named (a subrequest as REQUEST/SUBREQUEST), with what it asks
      messageExpression: >-
        [variables.over[0]].map(r, has(r.exactly) ?
        "request " + r.name +
        {{ include "gpushare.oneGpu.asks" "r.exactly" | nindent 8 | trim }} :
        r.firstAvailable.filter(s,
        {{ include "gpushare.oneGpu.overOne" "s" | nindent 8 | trim }}).map(s,
        "subrequest " + r.name + "/" + s.name +
        {{ include "gpushare.oneGpu.asks" "s" | nindent 8 | trim }})[0])[0] +
        ", but {{ include "gpushare.oneGpu.why" . }}:
        ask one device per request and give each container its own request"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .name }}
  {{- include "gpushare.oneGpu.labels" . | nindent 2 }}
spec:
  policyName: {{ .name }}
  validationActions: ["Deny"]
{{- end -}}

{{/*
CEL: whether the container c asks above 1 of the resource r, in limits
(dict "part" "limits") or requests. A quantity is a string at the API, which writes it
canonical ("2"), an integer in a hand-made object (2): string() reads both; "0" and "1" are
what one container may ask.
*/}}
{{- define "gpushare.oneGpu.aboveOne" -}}
has(c.resources.{{ .part }}) && r in c.resources.{{ .part }} &&
!(string(c.resources.{{ .part }}[r]) in ["0", "1"])
{{- end -}}

{{/*
The pod policy and its binding (every namespace): a container (init containers too) asking
above 1 of one of the class's extended resources. (dict "name" NAME "resources" LIST)
*/}}
{{- define "gpushare.oneGpu.podPolicy" -}}
{{- $names := printf "[\"%s\"]" (join "\", \"" .resources) -}}
{{- $limits := include "gpushare.oneGpu.aboveOne" (dict "part" "limits") -}}
{{- $requests := include "gpushare.oneGpu.aboveOne" (dict "part" "requests") -}}
{{- $aboveOne := printf "(%s) ||\n(%s)" $limits $requests -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ .name }}
  {{- include "gpushare.oneGpu.labels" . | nindent 2 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["pods"]
  matchConditions:
    - name: asks-for-a-gpu
      expression: >-
        object.spec.containers.exists(c, has(c.resources) &&
        {{ $names }}.exists(r,
        (has(c.resources.limits) && r in c.resources.limits) ||
        (has(c.resources.requests) && r in c.resources.requests))) ||
        (has(object.spec.initContainers) && object.spec.initContainers.exists(c,
        has(c.resources) &&
        {{ $names }}.exists(r,
        (has(c.resources.limits) && r in c.resources.limits) ||
        (has(c.resources.requests) && r in c.resources.requests))))
  variables:
    - name: names
      expression: '{{ $names }}'
    # the containers that ask above 1: init containers, then the others
    - name: initOver
      expression: >-
        has(object.spec.initContainers) ? object.spec.initContainers.filter(c,
        has(c.resources) && variables.names.exists(r,
        {{ $aboveOne | nindent 8 | trim }})) : []
    - name: over
      expression: >-
        object.spec.containers.filter(c, has(c.resources) && variables.names.exists(r,
        {{ $aboveOne | nindent 8 | trim }}))
  validations:
    - expression: size(variables.initOver) + size(variables.over) == 0
      # the first of them named, with what it asks
      messageExpression: >-
        (size(variables.initOver) > 0 ? "init container " + variables.initOver[0].name :
        "container " + variables.over[0].name) + " asks " +
        [size(variables.initOver) > 0 ? variables.initOver[0] : variables.over[0]].map(c,
        variables.names.filter(r,
        {{ $aboveOne | nindent 8 | trim }}).map(r,
        string({{ $limits | nindent 8 | trim }} ?
        c.resources.limits[r] : c.resources.requests[r]) + " " + r)[0])[0] +
        ", but {{ include "gpushare.oneGpu.why" . }}:
        ask 1 per container"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .name }}
  {{- include "gpushare.oneGpu.labels" . | nindent 2 }}
spec:
  policyName: {{ .name }}
  validationActions: ["Deny"]
{{- end -}}

{{/* The DRA path's policies: included by dra/slice-policy.yaml. */}}
{{- define "gpushare.oneGpu.dra" -}}
{{- if .Values.oneGpuPerContainerPolicy.enabled }}
{{- $class := include "gpushare.oneGpu.class" . }}
---
# A request of class {{ $class }} in a ResourceClaim (exactly, or a firstAvailable subrequest)
# may ask one device: allocationMode All and count above 1 are refused, except with
# adminAccess (devices without a share). Every namespace: the class is gpushare's own. The
# chart's oneGpuPerContainerPolicy turns it off.
{{ include "gpushare.oneGpu.claimPolicy" (dict "name" "gpushare-dra-claim-one-gpu" "resource" "resourceclaims" "spec" "object.spec" "oldSpec" "oldObject.spec") }}
---
# The same of a ResourceClaimTemplate's claim spec (spec.spec): caught before a pod's claim
# is made from it.
{{ include "gpushare.oneGpu.claimPolicy" (dict "name" "gpushare-dra-claim-template-one-gpu" "resource" "resourceclaimtemplates" "spec" "object.spec.spec" "oldSpec" "oldObject.spec.spec") }}
---
# A container (init containers too) may ask at most 1 of {{ $class }}/gpu (the DeviceClass's
# extended resource) or of its implicit name deviceclass.resource.kubernetes.io/{{ $class }},
# in limits or requests. Every namespace: both names are gpushare's own.
{{ include "gpushare.oneGpu.podPolicy" (dict "name" "gpushare-dra-gpu-one-gpu" "resources" (list (printf "%s/gpu" $class) (printf "deviceclass.resource.kubernetes.io/%s" $class))) }}
{{- end }}
{{- end -}}
