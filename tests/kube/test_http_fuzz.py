"""Bad input to the cluster side's HTTP endpoints is a 4xx, never a 500: the webhook
(``/mutate``, ``/validate``, ``/healthz`` over HTTPS) and the extender (``/filter``,
``/prioritize``, ``/bind``, ``/healthz``), served as ``gpushare kube serve`` serves them (one
event loop, in its own thread here) and reached over real HTTP on loopback. The extender
decides over one node whose agent's answer is in its cache, and binds through the real
Kubernetes client against the stand-in API server.

Hypothesis sends JSON of any shape (arrays, strings, deep nesting, huge numbers, Unicode),
AdmissionReviews and extender arguments with fields of any shape, and annotation text of any
shape, YAML aliases included (tests/kube/http_fuzz_strategies.py), and checks every answer
(the tables of bodies once answered 500 are in tests/kube/test_http_fuzz_tables.py):

* its status is below 500, its body at most 64 KiB, and it came within the client's
  per-request timeout (no hang);
* the handler cost at most 100 ms of CPU and 50 MiB: measured in the server's thread around
  the handler, the body already read. Each body is sent twice: once timed with
  ``time.thread_time`` (the server thread's own CPU, so a loaded machine's other work does
  not count), once with ``tracemalloc`` tracing, for the peak of what the handler allocated
  (tracing slows allocation many times over, so the two are not measured together);
* the extender's ``/healthz``, probed from another thread all along, was answered each time
  within 100 ms of the server's time: the CPU the server thread spent between the probe's
  send and its answer (``time.pthread_getcpuclockid``), which is how long a handler
  could have kept the probe waiting (probes that overlapped a traced request, slowed by
  the tracing, are not counted). Wall time on a busy 2-core machine measures the machine,
  so it is only checked against the no-hang bound;
* nothing in the log is a traceback or an ERROR, and every log line is printable (no
  newline or control character forged by a caller's value).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kube.http_fuzz_servers import (
    NODE,
    Client,
    Servers,
    check_log,
    post,
    review,
    share_pod,
)
from tests.kube.http_fuzz_strategies import (
    ANNOTATIONS,
    POSTS,
    annotation_text,
    extender_args,
    json_values,
    raw_bodies,
    reviews,
    sizing_text,
)

EXAMPLES = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextmanager
def clients(served: Servers) -> Iterator[dict[str, Client]]:
    made = {path: served.client(path) for path in POSTS}
    try:
        yield made
    finally:
        for client in made.values():
            client.close()


@pytest.mark.timeout(300)
def test_fuzz_json_of_any_shape(servers: Servers) -> None:
    servers.log.records.clear()
    with servers.probing(), clients(servers) as by_path:

        @EXAMPLES
        @given(path=st.sampled_from(POSTS), body=json_values(40))
        def send(path: str, body: Any) -> None:
            post(servers, by_path[path], path, json.dumps(body).encode())

        send()
    check_log(servers)


@pytest.mark.timeout(300)
def test_fuzz_raw_bodies(servers: Servers) -> None:
    servers.log.records.clear()
    with servers.probing(), clients(servers) as by_path:

        @EXAMPLES
        @given(path=st.sampled_from(POSTS), body=raw_bodies())
        def send(path: str, body: bytes) -> None:
            status, _ = post(servers, by_path[path], path, body)
            assert status == 400 or body.strip().startswith(b"{"), (status, body[:100])

        send()
    check_log(servers)


@pytest.mark.timeout(300)
def test_fuzz_admission_reviews(servers: Servers) -> None:
    servers.log.records.clear()
    with servers.probing(), clients(servers) as by_path:

        @EXAMPLES
        @given(path=st.sampled_from(["/mutate", "/validate"]), body=reviews())
        def send(path: str, body: Any) -> None:
            status, answer = post(servers, by_path[path], path, json.dumps(body).encode())
            if status == 200:  # an answer: allowed, or refused with a 400 or 403 and why
                response = json.loads(answer)["response"]
                assert response["allowed"] or response["status"]["code"] in (400, 403)

        send()
    check_log(servers)


@pytest.mark.timeout(300)
def test_fuzz_extender_arguments(servers: Servers) -> None:
    servers.log.records.clear()
    with servers.probing(), clients(servers) as by_path:

        @EXAMPLES
        @given(path=st.sampled_from(["/filter", "/prioritize", "/bind"]), body=extender_args())
        def send(path: str, body: Any) -> None:
            post(servers, by_path[path], path, json.dumps(body).encode())

        send()
    check_log(servers)


@pytest.mark.timeout(300)
def test_fuzz_annotations(servers: Servers) -> None:
    """Annotation text of any shape, in a pod that is otherwise well formed, to the webhook
    and to the extender's filter (which reads the same annotations)."""
    servers.log.records.clear()
    with servers.probing(), clients(servers) as by_path:
        sizing = st.tuples(st.just("gpushare.io/sizing"), sizing_text())
        other = st.tuples(st.sampled_from(ANNOTATIONS[:6]), annotation_text())

        @EXAMPLES
        @given(annotation=sizing | other, path=st.sampled_from(["/filter", "/validate", "/mutate"]))
        def send(annotation: tuple[str, str], path: str) -> None:
            name, text = annotation
            pod = share_pod(**{name: text})
            if name == "gpushare.io/sizing":
                del pod["metadata"]["annotations"]["gpushare.io/memory"]
            body = review(pod) if path != "/filter" else {"pod": pod, "nodenames": [NODE]}
            status, answer = post(servers, by_path[path], path, json.dumps(body).encode())
            assert status == 200, answer[:300]

        send()
    check_log(servers)
