{{/*
The run-as-user admission policies (values runAsUserPolicy). MPS runs one server per UID at
a time: a client of another UID waits in CUDA initialisation until every client of the
running UID has ended, so the agent must know the UID each GPU share runs as. It reads it
from the pod (agent/core/podusers.py): securityContext.runAsUser of the container, else of
the pod; a container with neither runs as its image's USER, which the API does not show.
These ValidatingAdmissionPolicies refuse such a pod when it is created (a container's
securityContext cannot change later, and ephemeral containers hold no resources):

  gpushare.runAsUser.extender, in scheduler/webhook.yaml (the extender path's admission):
    gpushare-share-run-as-user      containers asking gpushare.io/share; every namespace
  gpushare.runAsUser.dra, in dra/slice-policy.yaml (the DRA path's admission policies):
    gpushare-dra-gpu-run-as-user    containers asking gpushare.io/gpu (the DeviceClass's
                                    extended resource, or its implicit name); every namespace
    gpushare-dra-claim-run-as-user  pods with resourceClaims, in the namespaces
                                    runAsUserPolicy.draNamespaceSelector selects (a policy
                                    cannot read a claim's device class)

They are rendered into those two templates so that the plain manifests (deploy/webhook.yaml,
deploy/dra/slice-policy.yaml) carry them. tests/deploy/test_run_as_user_policy.py evaluates
their CEL on sample pods.
*/}}

{{/* How to fix a refused pod: agent/core/podusers.py's FIX, word for word. */}}
{{- define "gpushare.runAsUser.fix" -}}
set securityContext.runAsUser on the pod (spec.securityContext) or on each container that uses the GPU share: one MPS server serves one user at a time
{{- end -}}

{{/* The policies' and bindings' labels. */}}
{{- define "gpushare.runAsUser.labels" -}}
labels:
  app.kubernetes.io/name: gpushare-agent
  app.kubernetes.io/part-of: gpushare
{{- end -}}

{{/* What every one of them matches: pods, when created. */}}
{{- define "gpushare.runAsUser.constraints" -}}
failurePolicy: Fail
matchConstraints:
  resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE"]
      resources: ["pods"]
{{- end -}}

{{/*
A policy and its binding (every namespace) refusing a pod one of whose containers (init
containers too) asks one of the extended resources .resources (limits or requests) and
states no user, neither its own nor the pod's. (dict "name" NAME "resources" LIST)
*/}}
{{- define "gpushare.runAsUser.resourcePolicy" -}}
{{- $names := printf "[\"%s\"]" (join "\", \"" .resources) -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ .name }}
  {{- include "gpushare.runAsUser.labels" . | nindent 2 }}
spec:
  {{- include "gpushare.runAsUser.constraints" . | nindent 2 }}
  matchConditions:
    - name: asks-for-a-share
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
    # the pod's own runAsUser: every container without one runs as it
    - name: podUser
      expression: has(object.spec.securityContext) && has(object.spec.securityContext.runAsUser)
    # the containers that ask for the share: init containers, then the others
    - name: initShares
      expression: >-
        has(object.spec.initContainers) ? object.spec.initContainers.filter(c,
        has(c.resources) &&
        {{ $names }}.exists(r,
        (has(c.resources.limits) && r in c.resources.limits) ||
        (has(c.resources.requests) && r in c.resources.requests))) : []
    - name: shares
      expression: >-
        object.spec.containers.filter(c, has(c.resources) &&
        {{ $names }}.exists(r,
        (has(c.resources.limits) && r in c.resources.limits) ||
        (has(c.resources.requests) && r in c.resources.requests)))
    # those of them that state no user (neither their own nor the pod's), by name
    - name: unstated
      expression: >-
        variables.podUser ? [] :
        variables.initShares.filter(c, !(has(c.securityContext) &&
        has(c.securityContext.runAsUser))).map(c, "init container " + c.name) +
        variables.shares.filter(c, !(has(c.securityContext) &&
        has(c.securityContext.runAsUser))).map(c, "container " + c.name)
  validations:
    - expression: size(variables.unstated) == 0
      messageExpression: >-
        variables.unstated[0] + " asks for a GPU share ({{ first .resources }}) but states
        no user (runAsUser):
        {{ include "gpushare.runAsUser.fix" . | wrap 80 | nindent 8 | trim }}"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .name }}
  {{- include "gpushare.runAsUser.labels" . | nindent 2 }}
spec:
  policyName: {{ .name }}
  validationActions: ["Deny"]
{{- end -}}

{{/* The extender path's policy: included by scheduler/webhook.yaml. */}}
{{- define "gpushare.runAsUser.extender" -}}
{{- if .Values.runAsUserPolicy.enabled }}
---
# Every container that asks gpushare.io/share (limits or requests; init containers too)
# must state the user it runs as, by its own securityContext.runAsUser or the pod's: the
# agent's one-user rule of MPS needs the share's UID (0, root, is a stated one). Every
# namespace: the resource is gpushare's own. The chart's runAsUserPolicy turns it off.
{{ include "gpushare.runAsUser.resourcePolicy" (dict "name" "gpushare-share-run-as-user" "resources" (list "gpushare.io/share")) }}
{{- end }}
{{- end -}}

{{/* The DRA path's policies: included by dra/slice-policy.yaml. */}}
{{- define "gpushare.runAsUser.dra" -}}
{{- if .Values.runAsUserPolicy.enabled }}
{{- $policy := .Values.runAsUserPolicy }}
{{- $selector := $policy.draNamespaceSelector | default (dict) }}
{{- if and (not $policy.draAllNamespaces) (not (or $selector.matchLabels $selector.matchExpressions)) }}
{{- fail "runAsUserPolicy.draNamespaceSelector is empty, which would select every namespace: give it matchLabels or matchExpressions, or set runAsUserPolicy.draAllNamespaces to true" }}
{{- end }}
---
# Every container that asks gpushare.io/gpu (the DeviceClass's extended resource) or its
# implicit name deviceclass.resource.kubernetes.io/gpushare.io (limits or requests; init
# containers too) must state the user it runs as, by its own securityContext.runAsUser or
# the pod's (0, root, is a stated one). Every namespace: both names are gpushare's own.
# The chart's runAsUserPolicy turns it off.
{{ include "gpushare.runAsUser.resourcePolicy" (dict "name" "gpushare-dra-gpu-run-as-user" "resources" (list "gpushare.io/gpu" "deviceclass.resource.kubernetes.io/gpushare.io")) }}
---
# A pod with resource claims: each container that names one of them in resources.claims
# (a container that names none gets none of their devices) must state the user it runs as, by its own securityContext.runAsUser or the pod's. An admission policy cannot
# read a claim's device class, so this one holds only in the namespaces the chart's
# runAsUserPolicy.draNamespaceSelector selects (by default those labelled
# gpushare.io/run-as-user=required), or in every one with runAsUserPolicy.draAllNamespaces;
# there the pods of every DRA driver must state a user.
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: gpushare-dra-claim-run-as-user
  {{- include "gpushare.runAsUser.labels" . | nindent 2 }}
spec:
  {{- include "gpushare.runAsUser.constraints" . | nindent 2 }}
  matchConditions:
    - name: has-resource-claims
      expression: has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0
  variables:
    # the pod's own runAsUser: every container without one runs as it
    - name: podUser
      expression: has(object.spec.securityContext) && has(object.spec.securityContext.runAsUser)
    # the pod's names of its claims
    - name: claims
      expression: object.spec.resourceClaims.map(rc, rc.name)
    - name: initContainers
      expression: "has(object.spec.initContainers) ? object.spec.initContainers : []"
    # the containers that name one of the claims: init containers, then the others
    - name: initUsers
      expression: >-
        variables.initContainers.filter(c, has(c.resources) && has(c.resources.claims) &&
        c.resources.claims.exists(u, u.name in variables.claims))
    - name: users
      expression: >-
        object.spec.containers.filter(c, has(c.resources) && has(c.resources.claims) &&
        c.resources.claims.exists(u, u.name in variables.claims))
    # those that use the claims and state no user (neither their own nor the pod's), by
    # name; a container that names no claim gets none of their devices, so no MPS client
    - name: unstated
      expression: >-
        variables.podUser ? [] :
        variables.initUsers.filter(c,
        !(has(c.securityContext) && has(c.securityContext.runAsUser))).map(c,
        "init container " + c.name) +
        variables.users.filter(c,
        !(has(c.securityContext) && has(c.securityContext.runAsUser))).map(c,
        "container " + c.name)
  validations:
    - expression: size(variables.unstated) == 0
      messageExpression: >-
        variables.unstated[0] + " uses a resource claim but states no user (runAsUser):
        {{ include "gpushare.runAsUser.fix" . | wrap 80 | nindent 8 | trim }}"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: gpushare-dra-claim-run-as-user
  {{- include "gpushare.runAsUser.labels" . | nindent 2 }}
spec:
  policyName: gpushare-dra-claim-run-as-user
  validationActions: ["Deny"]
  {{- if not $policy.draAllNamespaces }}
  matchResources:
    namespaceSelector:
      {{- toYaml $selector | nindent 6 }}
  {{- end }}
{{- end }}
{{- end -}}
