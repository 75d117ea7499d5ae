"""flywheel.bench.parts.records: evaluation records with the env's generic measure keys and the committed ones with
Mario's own keys read alike."""

from __future__ import annotations

from flywheel.bench.parts.records import flag, furthest_x, stall_rule


def test_old_and_new_records_read_alike() -> None:
    old = {"seed": 1, "x_pos_max": 1820, "flag": False, "x_pos_max_stall_rule": 900, "flag_stall_rule": False}
    new = {"seed": 1, "progress": 1820.0, "success": False, "progress_stall_rule": 900.0, "success_stall_rule": False}
    for record in (old, new):
        assert (furthest_x(record), flag(record), stall_rule(record)) == (1820.0, False, (900.0, False))
    before_the_rule = {"seed": 2, "x_pos_max": 3161, "flag": True}  # written before the stall rule was recorded
    assert stall_rule(before_the_rule) == (3161.0, True) == (furthest_x(before_the_rule), flag(before_the_rule))
    assert furthest_x({"progress": None, "success": False}) == 0.0  # an episode without a progress measure
