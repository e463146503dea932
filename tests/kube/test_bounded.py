"""What reading a caller's text costs the cluster side (:mod:`agent.legacy.cluster.bounded`): the
costliest texts within each reader's limits, timed.

* ``gpushare.io/sizing``: any value of at most its 1024 characters is read, or refused,
  within a few ms of CPU (asserted under 20 ms, generous for a loaded machine): deep runs
  of flow brackets, alternating, with keys, in quotes, after stray closes, and long flat
  runs of tokens.
* the extender's body: the largest bodies its limits let through (bytes, values, nesting,
  the longest strings and numbers) cost under 100 ms of CPU and 50 MiB (the peak that
  ``tracemalloc`` sees) to read, the issue's budget per request.

CPU is ``time.process_time``, the best of three reads (another process's work on a busy
machine does not count, a cold cache once does not either), with the objects the test
process held before frozen out of the garbage collector's passes (``kube serve`` does not
hold a test run's modules); memory is measured in a read of its own, since tracing slows
allocation many times over.
"""

from __future__ import annotations

import gc
import json
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from agent.legacy.cluster.annotations import MAX_SIZING
from agent.legacy.cluster.bounded import MAX_DIGITS, Unreadable, load_json, load_yaml
from agent.legacy.cluster.extender import MAX_ARGS_BYTES, MAX_ARGS_DEPTH, MAX_ARGS_VALUES
from agent.legacy.cluster.sizing_annotation import SizingError, parse_sizing

MAX_SIZING_CPU_S = 0.020
MAX_READ_CPU_S = 0.100
MAX_READ_PEAK_BYTES = 50 * 2**20


@contextmanager
def frozen() -> Iterator[None]:
    """The objects the test process holds (every module a test run imported, what earlier
    tests left) frozen out of the garbage collector's passes: a full collection over them,
    set off by the read's allocations, is not the read's cost."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def best_cpu_s(read: Callable[[], object], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        with frozen():
            started = time.process_time()
            read()
            best = min(best, time.process_time() - started)
    return best


def peak_bytes(read: Callable[[], object]) -> int:
    with frozen():
        tracemalloc.start()
        try:
            read()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


# -- gpushare.io/sizing ------------------------------------------------------------------


def filled(unit: str, *, head: str = "", tail: str = "") -> str:
    """``head``, then ``unit`` repeated, then ``tail``: MAX_SIZING characters in all."""
    room = MAX_SIZING - len(head) - len(tail)
    return head + (unit * room)[:room] + tail


N = MAX_SIZING
SIZING_WORST: list[tuple[str, str]] = [
    ("[ run", filled("[")),
    ("{ run", filled("{")),
    ("[{ alternating", filled("[{")),
    ("{[ alternating", filled("{[")),
    ("keys {a: ", filled("{a: ")),
    ("JSON keys", filled('{"a":')),
    ("entries [a, ", filled("[a, ")),
    ("question keys [? ", filled("[? ")),
    ("[- ", filled("[-")),
    ("interleaved [[]", filled("[[]")),
    ("closed 512 deep", "[" * (N // 2) + "]" * (N // 2)),
    ("stray closes, then opens", "]" * (N // 2) + "[" * (N // 2)),
    ("one open, stray closes, opens", "[" + "]" * (N // 2 - 1) + "[" * (N // 2)),
    ("on lines", filled("[\n")),
    ("in a value", filled("[", head="{mode: training, parameters: ")),
    ("inside double quotes", filled("[", head='"', tail='"')),
    ("inside single quotes", filled("{", head="'", tail="'")),
    ("in a comment", filled("[", head="{mode: training} #")),
    ("flat list", filled("a,", head="[", tail="]")),
    ("flat map", filled("a: b, ", head="{", tail="}")),
    ("empty lists", filled("[],", head="[", tail="]")),
    ("lists of a map", filled("a: [], ", head="{", tail="}")),
    ("block sequences", filled("- ")),
    ("complex keys", filled("? ")),
    ("flow complex keys", filled("? ", head="{", tail="}")),
    ("documents of lists", filled("[]")),
    ("many lines", filled("- a\n")),
]


@pytest.mark.parametrize("text", [s[1] for s in SIZING_WORST], ids=[s[0] for s in SIZING_WORST])
def test_no_sizing_text_costs_more_than_a_few_ms(text: str) -> None:
    assert len(text) <= MAX_SIZING

    def read() -> None:
        with pytest.raises(SizingError):
            parse_sizing(text)

    cpu_s = best_cpu_s(read)
    assert cpu_s < MAX_SIZING_CPU_S, f"{cpu_s * 1000:.1f} ms"


FLOW_DEPTH: list[tuple[str, str, str | None]] = [
    ("a flat object", "{mode: training, parameters: 7e9}", None),
    ("a list in it: two deep", "{mode: training, parameters: [1, 2]}", None),
    ("three deep", "{mode: training, parameters: [[1]]}", "nested deeper than 2"),
    ("brackets in quotes count", "{mode: training, dtype: '[[x]]'}", "nested deeper than 2"),
    ("brackets in a comment count", "{mode: training} # [[[", "nested deeper than 2"),
    ("a stray close lowers nothing", "]]][[[", "nested deeper than 2"),
    ("closed and opened again", "[[]] [[]] [[", None),
]


@pytest.mark.parametrize(
    ("text", "refused"), [f[1:] for f in FLOW_DEPTH], ids=[f[0] for f in FLOW_DEPTH]
)
def test_flow_brackets_are_measured_on_the_raw_text(text: str, refused: str | None) -> None:
    """Counted before PyYAML scans: conservatively (quoted and commented brackets too, a
    close with nothing open lowers nothing); a text within the depth goes on to YAML."""
    said: str | None = None
    try:
        load_yaml(text, max_depth=2, max_nodes=64)
    except Unreadable as exc:
        said = str(exc)
    if refused is None:
        assert said is None or "nested" not in said, said
    else:
        assert said is not None and refused in said, said


# -- the extender's body -----------------------------------------------------------------


def array(items: list[bytes]) -> bytes:
    return b"[" + b",".join(items) + b"]"


def strings_filling(character: str) -> bytes:
    """As many strings as the values allow, as long as the bytes allow."""
    count = MAX_ARGS_VALUES - 1
    each = (MAX_ARGS_BYTES - 2) // count - 3  # two quotes and a comma each
    text = json.dumps(character * (each // len(character.encode())), ensure_ascii=False)
    return array([text.encode()] * count)


def node_names() -> bytes:
    """ExtenderArgs with as many of the longest node names as the limits allow."""
    pod = {"metadata": {"name": "train-0", "namespace": "team-a"}, "spec": {}}
    count = min(MAX_ARGS_VALUES - 10, (MAX_ARGS_BYTES - 1000) // 256)
    names = ["n" * 253] * count
    return json.dumps({"pod": pod, "nodenames": names}, separators=(",", ":")).encode()


V, B = MAX_ARGS_VALUES, MAX_ARGS_BYTES
DEEPEST = b"[" * (MAX_ARGS_DEPTH - 1) + b"]" * (MAX_ARGS_DEPTH - 1)
LONGEST_NUMBER = b"9" * MAX_DIGITS
# (name, the body, accepted)
EXTENDER_BODIES: list[tuple[str, Callable[[], bytes], bool]] = [
    ("empty arrays", lambda: array([b"[]"] * ((V - 1) // 2)), True),
    ("empty objects", lambda: array([b"{}"] * ((V - 1) // 2)), True),
    ("empty strings", lambda: array([b'""'] * (V - 1)), True),
    ("zeros", lambda: array([b"0"] * (V - 1)), True),
    ("ASCII strings filling the bytes", lambda: strings_filling("a"), True),
    ("two-byte strings filling the bytes", lambda: strings_filling("\u0101"), True),
    ("astral strings filling the bytes", lambda: strings_filling("\U0001f600"), True),
    ("one string of all the bytes", lambda: b'"' + b"a" * (B - 2) + b'"', True),
    ("one string, one astral character", lambda: '"\U0001f600'.encode() + b"a" * (B - 6)
     + b'"', True),
    ("escapes", lambda: b'"' + b"\\u20ac" * ((B - 2) // 6) + b'"', True),
    ("astral escapes", lambda: b'"' + b"\\ud83d\\ude00" * ((B - 2) // 12) + b'"', True),
    ("members", lambda: b"{" + b",".join(b'"k%d":0' % i for i in range(V - 1)) + b"}", True),
    ("nested as deep as allowed throughout", lambda: array(
        [DEEPEST] * ((V - 1) // MAX_ARGS_DEPTH)), True),
    ("the longest integers", lambda: array([LONGEST_NUMBER] * min(
        V - 1, (B - 2) // (MAX_DIGITS + 1))), True),
    ("the longest floats", lambda: array([LONGEST_NUMBER + b"." + LONGEST_NUMBER + b"e-300"]
                                         * ((B - 2) // (2 * MAX_DIGITS + 7))), True),
    ("node names", node_names, True),
    ("spaces", lambda: b" " * (B - 2) + b"{}", True),
    # Python's own limit, 4300 digits, turned to ints in time that grows as its square
    ("4300-digit integers", lambda: array([b"9" * 4300] * ((B - 2) // 4301)), False),
    ("one float of all the bytes", lambda: b"1." + b"1" * (B - 2), False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "accepted"), [e[1:] for e in EXTENDER_BODIES], ids=[e[0] for e in EXTENDER_BODIES]
)
def test_the_costliest_extender_bodies_are_cheap_to_read(
    make: Callable[[], bytes], accepted: bool
) -> None:
    body = make()
    assert len(body) <= MAX_ARGS_BYTES

    def read() -> None:
        try:
            load_json(body, max_depth=MAX_ARGS_DEPTH, max_values=MAX_ARGS_VALUES)
        except Unreadable:
            assert not accepted
        else:
            assert accepted

    cpu_s = best_cpu_s(read)
    assert cpu_s < MAX_READ_CPU_S, f"{cpu_s * 1000:.1f} ms"
    peak = peak_bytes(read)
    assert peak < MAX_READ_PEAK_BYTES, f"{peak / 2**20:.1f} MiB"


def test_the_extenders_limits_are_what_kube_scheduler_sends() -> None:
    """5,000 nodes (Kubernetes' largest cluster) of the longest names and a pod of 1.5 MiB
    (etcd's largest object) fit; one value or one digit more than the limits is refused."""
    assert 5000 * (253 + 3) + int(1.5 * 2**20) < MAX_ARGS_BYTES
    over = array([b"[]"] * ((V - 1) // 2 + 1))
    with pytest.raises(Unreadable, match=f"more than {V} values"):
        load_json(over, max_depth=MAX_ARGS_DEPTH, max_values=V)
    with pytest.raises(Unreadable, match=f"more than {MAX_DIGITS} digits"):
        load_json(array([LONGEST_NUMBER + b"9"]), max_depth=MAX_ARGS_DEPTH, max_values=V)
    assert load_json(b'{"n": -' + LONGEST_NUMBER + b"}", max_depth=2, max_values=4) == {
        "n": -int(LONGEST_NUMBER)
    }
    assert load_json(b'["' + b"9" * 5000 + b'"]', max_depth=2, max_values=4) == ["9" * 5000]


def test_the_webhooks_limits_are_within_those_measured() -> None:
    """The costliest bodies above are built to the extender's limits: the webhook's may be
    no larger, so that they hold for its reviews too."""
    from agent.legacy.cluster.webhook import MAX_REVIEW_BYTES, MAX_REVIEW_DEPTH, MAX_REVIEW_VALUES

    assert MAX_REVIEW_BYTES <= MAX_ARGS_BYTES
    assert MAX_REVIEW_VALUES <= MAX_ARGS_VALUES
    assert MAX_REVIEW_DEPTH <= MAX_ARGS_DEPTH
