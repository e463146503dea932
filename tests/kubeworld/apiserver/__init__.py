"""A stand-in kube-apiserver for tests, one module per API group (:mod:`.core`,
:mod:`.discovery`, :mod:`.coordination`, :mod:`.apps`, :mod:`.resource`) on the shared
machinery (:mod:`.storage`, :mod:`.watch`, :mod:`.paging`, :mod:`.patch`, :mod:`.selection`,
:mod:`.verbs`, :mod:`.faults`, :mod:`.server`'s HTTP routing): real paths, JSON shapes,
status codes and ``Status`` error bodies for the few resources the cluster side uses (pods,
nodes, core/v1 events, discovery/v1 EndpointSlices, coordination/v1 Leases: create, get and
PUT; apps/v1 DaemonSets: get, list and delete; every verb of resource.k8s.io/v1
DeviceClasses, ResourceSlices, ResourceClaims with ``/status`` and ResourceClaimTemplates),
held in memory under one global, increasing ``resourceVersion`` (a string of an integer, set
on an object by every write to it).

    async with FakeApiServer(token="t") as api:
        pod = api.create_pod("train-0", "team-a", finalizers=["gpushare.io/lease"])
        ... RestKubeApi.from_url(api.url, token="t") ...

What it does as the real server does:

- Lists (``PodList`` ...) carry ``metadata.resourceVersion``; their items have no
  ``kind``/``apiVersion`` (single objects and watch events do), in the order of their
  storage keys (``namespace/name``). Without a ``resourceVersion`` (or ``0``, or with
  ``NotOlderThan``) they serve the current state; ``resourceVersionMatch=Exact`` (and, as
  the legacy rule has it, a ``resourceVersion`` with a ``limit``) the state at that version,
  rebuilt from the history: one compacted away is a plain ``410 Expired`` response.
- Pages (``limit``, ``continue``): a list with ``limit`` sends at most that many items and,
  when more follow, ``metadata.continue``, an opaque token (as the real server's: unpadded
  URL-safe base64 of ``{"v": "meta.k8s.io/v1", "rv": <revision>, "start": <next key>}``),
  and ``metadata.remainingItemCount`` unless a selector was given. Every page of one list
  reads the first page's revision, so all carry its ``resourceVersion`` and together are
  one consistent snapshot, whatever changed meanwhile. A token whose revision was
  compacted away (:meth:`FakeApiServer.compact`, or the history's bound) is ``410 Expired``
  whose ``Status`` carries, in ``metadata.continue``, a token that goes on from the same
  key in the latest state (an inconsistent list); a token the server did not make, or one
  sent with a ``resourceVersion``, is a 400.
- Watches (``watch=1``/``true`` on a list path) stream newline-delimited events of every
  change after ``resourceVersion`` (none or ``0``: an ``ADDED`` per existing object first),
  then live ones, until ``timeoutSeconds`` or the client goes. A selector is applied to the
  old and the new state, so a pod that stops matching is sent as ``DELETED`` and one that
  starts matching as ``ADDED``. The history is bounded (``history=``); a version older than
  it (or than :meth:`FakeApiServer.compact`) gets, on an HTTP 200 stream, one
  ``{"type": "ERROR", "object": <Status 410 Expired>}`` event, and the stream ends.
  BOOKMARKs are sent only when asked for (``allowWatchBookmarks``) and only by
  :meth:`FakeApiServer.bookmark`.
- Field selectors: the fields the real server indexes for each kind (pods: metadata.name,
  metadata.namespace, spec.nodeName, spec.schedulerName, status.phase, ...), ``=``, ``==``,
  ``!=``, comma-separated conjunctions; an unknown field is a 400. Label selectors:
  ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``.
- PATCH: merge patch (RFC 7386), JSON patch (RFC 6902: add, remove, replace, move, copy,
  test; a failing op is ``422 Invalid``), strategic merge patch. A patched object whose
  ``metadata.resourceVersion`` differs from the stored one is ``409 Conflict``. A patch that
  changes nothing writes nothing (no new version, no event). The main resource ignores
  changes to ``status``; the ``/status`` subresource takes only ``status``. Pod specs are
  immutable but for container images, activeDeadlineSeconds, tolerations and
  schedulingGates (422); a pod being deleted takes no new finalizers (422).
- DELETE: a pod with finalizers gets ``deletionTimestamp`` (now + grace) and
  ``deletionGracePeriodSeconds`` (MODIFIED) and stays until a write empties
  ``metadata.finalizers``; that write is not stored but deletes the pod (one DELETED event;
  the event and the patch's response carry the pod as last stored, as etcd's previous value
  does). ``gracePeriodSeconds=0`` (force) changes only the grace period recorded. Without
  finalizers a pod is deleted at once. Preconditions (uid, resourceVersion) are 409s.
- Binding (``pods/{name}/binding``): sets ``spec.nodeName`` and the ``PodScheduled``
  condition; 409 if the pod is bound already or being deleted, or on a uid mismatch.
- ``metadata.generateName``: the prefix (cut to 58 characters) and 5 characters of the
  server's alphabet (consonants and digits), a name not taken.
- resource.k8s.io/v1: list (ResourceClaims and templates also across namespaces), watch,
  get, create, PUT, PATCH, DELETE (``preconditions`` uid/resourceVersion: 409; finalizers
  as for pods, with no grace period) and DELETE of a collection (by selectors: what the
  kubelet does to its node's ResourceSlices). ResourceSlice field selectors:
  ``metadata.name``, ``spec.nodeName``, ``spec.driver`` (``spec.pool.name`` is a 400, as
  on a real server); the others: ``metadata.name``, ``metadata.namespace``. A created
  ResourceClaim's ``status`` is dropped (set it through ``/status``); ``metadata.generation``
  starts at 1 and counts changes of ``spec``. Every write is decoded and validated as the
  real server does it (see "resource.k8s.io/v1: decoding and validation" below): against
  the strict JSON schemas that ``kubernetes-validate`` ships for ``kube_version`` (default
  1.36), a wrong type or a quantity or time that does not parse is a 400, an unknown field a
  400 ``strict decoding error`` (``fieldValidation=Strict``, the stand-in's default; ``Warn``
  drops it with a ``Warning`` header, ``Ignore`` drops it), a missing required field or a
  broken rule a 422 ``Invalid`` whose ``details.causes`` name every field. The rules beyond
  the schema: one of nodeName/nodeSelector/allNodes/perDeviceNodeSelection; pool count > 0;
  driver, pool name and node name immutable; at most 128 devices (64 when one has taints or
  consumes counters), unique names, 32 attributes and capacities; a requestPolicy only with
  ``allowMultipleAllocations``, ``validValues`` (at most 10, ascending, unique, within the
  value, holding ``default``) or ``validRange`` (0 <= min <= default <= max <= value,
  default and max on a step from min, min + step <= value); taints (16, a key, an effect of
  NoSchedule/NoExecute/None); binding conditions (4 and 4, qualified names, no overlap, both
  or neither); a claim's or template's spec immutable; ``status.allocation`` immutable once
  set; ``reservedFor`` only with an allocation; every ``status.devices`` entry an allocated
  (driver, pool, device, shareID), with at most 8 conditions of a qualified type,
  True/False/Unknown, a reason and a lastTransitionTime.

Where it is simpler than the real server (and says so):

- Strategic merge patch is a merge patch whose lists are replaced, except the lists merged
  by key: ``status.conditions`` and ``status.addresses`` by ``type``,
  ``status.containerStatuses`` by ``name`` (``$patch: delete`` in an element removes it;
  other ``$`` directives are ignored). ``metadata.finalizers`` is replaced, not unioned.
- No kubelet: graceful termination is only recorded (``deletionTimestamp``), never waited
  for; no admission, no defaulting beyond the usual pod fields, no managedFields, no
  protobuf.
- Pages: a page with a selector holds ``limit`` matching items (the real server may send
  fewer, even none, with a continue token, since it counts the keys it read); ``limit`` is
  honoured with ``resourceVersion=0`` too (the real server's watch cache may ignore it).
- resource.k8s.io: no defaulting (a real server fills in e.g. ``allocationMode``), no
  feature gates (a real server drops the fields of disabled ones), CEL selectors are not
  compiled, quantities are echoed as sent (not canonicalized), messages of decoding errors
  name the field by its path rather than its Go struct, and the schema's ``required`` holds
  even where the real server takes a zero value (a ResourceClaim needs a ``spec``).

Test helpers: :meth:`create_pod` (from :func:`pod_manifest`), :meth:`delete_pod`,
:meth:`set_pod_phase`, :meth:`patch_pod`, :meth:`create_node`, :meth:`put_object` (any kind,
``status`` included), :attr:`objects` (``api.objects("resourceclaims")``: copies),
:meth:`set_endpoints`,
:meth:`events_for`, :meth:`compact`, :meth:`bookmark`, :meth:`hold_next`, the per-verb
:attr:`requests` counter and the :attr:`log` of requests.

Faults (:meth:`fail_next`), each the way a real API server or the network fails a
request: an error status; a broken connection; no answer until the client's timeout; and
each of these after the request was served, its change made (``landed``: a 5xx or a
timeout whose write happened anyway, as etcd or a proxy in between can leave it). A
:attr:`chaos` hook, asked about every request, draws such faults at random.
"""

from __future__ import annotations

from tests.kubeworld.apiserver.core import pod_manifest
from tests.kubeworld.apiserver.errors import REASONS, ApiError
from tests.kubeworld.apiserver.faults import Fault, Hold
from tests.kubeworld.apiserver.kinds import KINDS
from tests.kubeworld.apiserver.objects import Obj
from tests.kubeworld.apiserver.paging import EXPIRED_CONTINUE
from tests.kubeworld.apiserver.patch import JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, json_patch
from tests.kubeworld.apiserver.resource import RESOURCE_SLICES
from tests.kubeworld.apiserver.resource_schema import kube_versions
from tests.kubeworld.apiserver.selection import Selector
from tests.kubeworld.apiserver.server import FakeApiServer
from tests.kubeworld.apiserver.watch import Watcher

__all__ = [
    "EXPIRED_CONTINUE",
    "JSON_PATCH",
    "KINDS",
    "MERGE_PATCH",
    "REASONS",
    "RESOURCE_SLICES",
    "STRATEGIC_PATCH",
    "ApiError",
    "FakeApiServer",
    "Fault",
    "Hold",
    "Obj",
    "Selector",
    "Watcher",
    "json_patch",
    "kube_versions",
    "pod_manifest",
]
