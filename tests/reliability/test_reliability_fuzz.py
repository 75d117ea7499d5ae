"""The bounded fuzz suite on live services: every bound socket and every HTTP route, no crash, no 5xx,
every refusal counted, bounded memory, and real traffic flowing afterwards (``flywheel.testing.fuzz``)."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel import proto
from flywheel.testing.fuzz import TARGETS, expected_refusal, raw_message, run_fuzz, socket_inputs

pytestmark = pytest.mark.timeout(600)
EXAMPLES, HTTP_EXAMPLES = 150, 150
RSS_GROWTH_MIB = 200


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_strategies_draw_both_valid_and_refused_messages_for_every_socket(data: st.DataObject) -> None:
    for name, target in TARGETS.items():
        frames = data.draw(socket_inputs(target), label=name)
        assert isinstance(frames, list) and frames and all(isinstance(f, bytes) for f in frames)
        if target.expect:
            expected_refusal(target, frames)  # never raises: refused or decoded


def test_raw_messages_are_sometimes_valid() -> None:
    """The generator reaches past the codec: some drawn transition batches decode, so inserts are fuzzed too."""
    valid = refused = 0
    target = TARGETS["transitions"]

    @settings(max_examples=300, deadline=None, database=None)
    @given(frames=raw_message(proto.TransitionBatch))
    def tally(frames: list[bytes]) -> None:
        nonlocal valid, refused
        if expected_refusal(target, frames):
            refused += 1
        else:
            valid += 1
            header = msgpack.unpackb(frames[0])
            assert header["k"] == "transitions"

    tally()
    assert valid >= 10 and refused >= 10, (valid, refused)


@pytest.mark.system
def test_fuzz_every_socket_and_route_of_live_services(tmp_path: Path) -> None:
    figures = run_fuzz(tmp_path, examples=EXAMPLES, http_examples=HTTP_EXAMPLES, seed=11)
    assert figures.crashed == []
    assert dict(figures.inputs) == dict.fromkeys(TARGETS, EXAMPLES)
    assert figures.http_5xx == [], figures.http_5xx
    assert sum(figures.http_requests.values()) == HTTP_EXAMPLES
    assert len(figures.http_requests) >= 8, figures.http_requests  # the routes were all reached
    for name in ("transitions", "sample", "telemetry", "lease"):
        assert figures.expected_refused[name] > 0, name
        assert figures.counted_refused.get(name, 0) >= figures.expected_refused[name], (
            name, figures.counted_refused, dict(figures.expected_refused))
    assert max(figures.rss_peak_growth_mib.values()) < RSS_GROWTH_MIB, figures.rss_peak_growth_mib
    assert figures.after["probe_rows_received"] >= 512 and figures.after["learner_updates_after"] > 10


def test_targets_cover_every_socket_the_services_bind() -> None:
    """A socket added to a service without a fuzz target fails here (the Cluster's port names are the list)."""
    from flywheel.testing.cluster import PORTS

    assert set(TARGETS) == set(PORTS) - {"http"}
    assert {t.kind for t in TARGETS.values()} <= {zmq.PUSH, zmq.DEALER, zmq.XSUB}
