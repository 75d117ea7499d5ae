"""Weights carry their learner's run id: optional on the wire (older learners send none), checked when present."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from flywheel import proto
from flywheel.proto.schema import SCHEMA_VERSION


def frames(scalars: dict[str, object]) -> list[bytes]:
    """A weights message as the wire carries it, with exactly ``scalars`` and one tensor."""
    header = {"k": "weights", "v": SCHEMA_VERSION, "f": scalars, "a": [["t", "float32", [2]]]}
    return [msgpack.packb(header, use_bin_type=True), np.ones(2, np.float32).tobytes()]


def test_weights_of_a_learner_without_run_ids_decode_as_run_empty() -> None:
    msg = proto.decode(frames({"version": 7, "network": "n"}), proto.Weights)
    assert (msg.version, msg.run_id) == (7, "")


def test_a_run_id_travels_and_a_malformed_one_is_refused() -> None:
    sent = proto.Weights(9, "n", {"t": np.ones(2, np.float32)}, run_id="0123456789abcdef")
    assert proto.decode(proto.encode(sent), proto.Weights).run_id == "0123456789abcdef"
    for bad in ("X" * 8, "a" * 33, "../etc", "ab cd"):
        with pytest.raises(proto.BadShape, match="run_id"):
            proto.decode(frames({"version": 1, "network": "n", "run_id": bad}), proto.Weights)
