"""flywheel.nets: architectures, names, and weights exchange with strict mismatch checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flywheel import proto
from flywheel.nets import (
    QNetwork,
    WeightsMismatch,
    build_q_network,
    forward_macs,
    load_weights,
    network_name,
    weights_message,
)


def test_names_follow_the_contract() -> None:
    assert network_name((4,), 2, True) == "mlp-4-2-dueling"
    assert network_name((4, 84, 84), 7, True) == "nature-4x84x84-7-dueling"
    assert network_name((4,), 2, False) == "mlp-4-2-plain"
    assert network_name((3, 11, 11), 5, True) == "conv-3x11x11-5-dueling"
    assert build_q_network((4,), 2, hidden=64).name == "mlp-4-2-dueling-h64"
    assert network_name((4, 84, 84), 7, True, head="quantile", num_quantiles=51) == "nature-4x84x84-7-dueling-qr51"
    assert build_q_network((4,), 2, head="quantile", num_quantiles=200).name == "mlp-4-2-dueling-qr200"
    with pytest.raises(ValueError, match="head"):
        build_q_network((4,), 2, head="categorical")
    with pytest.raises(ValueError, match="num_quantiles"):
        build_q_network((4,), 2, head="quantile", num_quantiles=1)
    assert build_q_network((4,), 2, head="c51").name == "mlp-4-2-dueling-c51"
    assert network_name((4, 42, 42), 7, True, head="c51", c51_atoms=21) == "nature-4x42x42-7-dueling-c21"
    with pytest.raises(ValueError, match="c51_atoms"):
        build_q_network((4,), 2, head="c51", c51_atoms=1)


def test_an_actor_takes_the_c51_support_with_the_learners_weights() -> None:
    learner = build_q_network((4,), 2, head="c51", v_min=-5.0, v_max=25.0)
    msg = proto.decode(proto.encode(weights_message(learner, 3, learner.name)), expect=proto.Weights)
    assert msg.tensors["support"].tolist() == torch.linspace(-5.0, 25.0, 51).tolist()
    with pytest.raises(WeightsMismatch, match="c51"):
        load_weights(build_q_network((4,), 2), msg, "mlp-4-2-dueling")
    actor = build_q_network((4,), 2, head="c51")  # the actors' settings have no support: the default until weights
    assert actor.name == learner.name and float(actor.support[-1]) == 10.0
    load_weights(actor, msg, actor.name)
    torch.testing.assert_close(actor.support, learner.support)
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(actor(x), learner(x))


def test_a_c51_support_must_be_an_interval() -> None:
    from pydantic import ValidationError

    from flywheel.services.learner.settings import LearnerSettings

    with pytest.raises(ValueError, match="v_min < v_max"):
        build_q_network((4,), 2, head="c51", v_min=1.0, v_max=1.0)
    with pytest.raises(ValidationError, match="c51_v_min must be below c51_v_max"):
        LearnerSettings(head="c51", c51_v_min=3.0, c51_v_max=-3.0)


def test_the_c51_atoms_are_a_setting_named_in_the_network_and_checked_by_actors() -> None:
    from pydantic import ValidationError

    from flywheel.services.actor.settings import ActorSettings
    from flywheel.services.learner.settings import LearnerSettings

    learner = build_q_network((4, 42, 42), 7, head="c51", c51_atoms=21, v_min=-10.0, v_max=20.0)
    assert learner.name == "nature-4x42x42-7-dueling-c21" and learner.support.shape == (21,)
    assert learner.outputs(torch.zeros(2, 4, 42, 42, dtype=torch.uint8)).shape == (2, 7, 21)
    assert learner.advantage.weight.shape[0] == 7 * 21  # the head's cost scales with the atoms
    msg = proto.decode(proto.encode(weights_message(learner, 1, learner.name)), expect=proto.Weights)
    with pytest.raises(WeightsMismatch, match="c21"):  # an actor left at 51 atoms refuses by name
        load_weights(build_q_network((4, 42, 42), 7, head="c51"), msg, "nature-4x42x42-7-dueling-c51")
    actor = build_q_network((4, 42, 42), 7, head="c51", c51_atoms=21)
    load_weights(actor, msg, actor.name)
    x = torch.randint(0, 256, (3, 4, 42, 42), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(actor(x), learner(x))
    assert LearnerSettings(c51_atoms=21).c51_atoms == ActorSettings(c51_atoms=21).c51_atoms == 21
    for settings in (LearnerSettings, ActorSettings):
        with pytest.raises(ValidationError, match="c51_atoms"):
            settings(c51_atoms=1)


def test_an_actor_with_the_plain_head_refuses_quantile_weights() -> None:
    learner = build_q_network((4,), 2, head="quantile", num_quantiles=11)
    actor = build_q_network((4,), 2)
    msg = proto.decode(proto.encode(weights_message(learner, 3, learner.name)), expect=proto.Weights)
    with pytest.raises(WeightsMismatch, match="qr11"):
        load_weights(actor, msg, actor.name)
    twin = build_q_network((4,), 2, head="quantile", num_quantiles=11)
    load_weights(twin, msg, twin.name)
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), learner(x))


def test_forward_macs_of_the_nature_cnn() -> None:
    net = build_q_network((4, 84, 84), 7)
    convs = 20 * 20 * 32 * (4 * 8 * 8) + 9 * 9 * 64 * (32 * 4 * 4) + 7 * 7 * 64 * (64 * 3 * 3)
    assert forward_macs(net) == convs + 3136 * 512 + 512 * 7 + 512 * 1
    assert forward_macs(build_q_network((4,), 2, hidden=8)) == 4 * 8 + 8 * 8 + 8 * 2 + 8


@pytest.mark.parametrize("obs_shape", [(4,), (4, 84, 84), (3, 11, 11)])
@pytest.mark.parametrize("dueling", [True, False])
def test_forward_shapes(obs_shape: tuple[int, ...], dueling: bool) -> None:
    net = build_q_network(obs_shape, 6, dueling=dueling)
    assert isinstance(net, QNetwork)
    q = net(torch.zeros(3, *obs_shape))
    assert q.shape == (3, 6) and q.dtype == torch.float32


def test_nature_cnn_layout() -> None:
    net = build_q_network((4, 84, 84), 7)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)), (64, (3, 3), (1, 1))]
    assert net.fc[0].in_features == 3136 and net.fc[0].out_features == 512


def test_uint8_pixels_are_scaled_inside() -> None:
    net = build_q_network((2, 40, 40), 3)
    pixels = torch.randint(0, 256, (2, 2, 40, 40), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(net(pixels), net(pixels.float() / 255.0))


def test_weights_round_trip_over_the_codec() -> None:
    src, dst = build_q_network((4,), 2), build_q_network((4,), 2)
    msg = weights_message(src, 7, src.name)
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in msg.tensors.values())
    decoded = proto.decode(proto.encode(msg), expect=proto.Weights)
    assert isinstance(decoded, proto.Weights) and decoded.version == 7
    load_weights(dst, decoded, src.name)
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x))


def test_message_is_a_copy() -> None:
    net = build_q_network((4,), 2)
    msg = weights_message(net, 1, net.name)
    before = {k: v.copy() for k, v in msg.tensors.items()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    assert all(np.array_equal(before[k], msg.tensors[k]) for k in before)


def _mutations(msg: proto.Weights) -> list[tuple[str, proto.Weights, str]]:
    key = next(iter(msg.tensors))
    t = dict(msg.tensors)
    missing = {k: v for k, v in t.items() if k != key}
    shape = {**t, key: np.zeros((1, 1), np.float32)}
    dtype = {**t, key: t[key].astype(np.float16)}
    nan = {**t, key: np.full_like(t[key], np.nan)}
    extra = {**t, "extra.weight": np.zeros(1, np.float32)}
    return [
        ("name", proto.Weights(1, "mlp-8-2-dueling", t), "network"),
        ("missing", proto.Weights(1, msg.network, missing), "missing"),
        ("extra", proto.Weights(1, msg.network, extra), "unexpected"),
        ("shape", proto.Weights(1, msg.network, shape), "shape"),
        ("dtype", proto.Weights(1, msg.network, dtype), "dtype"),
        ("nan", proto.Weights(1, msg.network, nan), "NaN"),
    ]


def test_mismatches_raise_before_touching_the_net() -> None:
    src, dst = build_q_network((4,), 2), build_q_network((4,), 2)
    good = weights_message(src, 1, src.name)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    for label, msg, words in _mutations(good):
        with pytest.raises(WeightsMismatch, match=words):
            load_weights(dst, msg, dst.name)
        after = dst.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before), label
    assert issubclass(WeightsMismatch, ValueError)


def test_an_unknown_head_setting_is_refused_when_the_settings_are_read() -> None:
    from pydantic import ValidationError

    from flywheel.services.actor.settings import ActorSettings
    from flywheel.services.learner.settings import LearnerSettings

    for settings in (LearnerSettings, ActorSettings):
        with pytest.raises(ValidationError, match="'q', 'quantile' or 'c51'"):
            settings(head="c101")


def test_the_network_is_one_record_of_the_learners_and_the_actors_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """dueling, hidden, head, num_quantiles and c51_atoms are written once (NetworkSpec) and read by both settings
    classes under the variable names users set (FLYWHEEL_LEARNER_HIDDEN, FLYWHEEL_ACTOR_HEAD, ...)."""
    from flywheel.netspec import NETWORK_FIELDS, NetworkSpec
    from flywheel.services.actor.settings import ActorSettings
    from flywheel.services.learner.settings import LearnerSettings

    assert NETWORK_FIELDS == ("dueling", "hidden", "head", "num_quantiles", "c51_atoms")
    for cls in (LearnerSettings, ActorSettings):
        assert issubclass(cls, NetworkSpec)
        for name in NETWORK_FIELDS:
            own, record = cls.model_fields[name], NetworkSpec.model_fields[name]
            assert (own.annotation, own.default, own.description) == (record.annotation, record.default,
                                                                       record.description)
    monkeypatch.setenv("FLYWHEEL_LEARNER_HIDDEN", "64")
    monkeypatch.setenv("FLYWHEEL_ACTOR_HEAD", "c51")
    monkeypatch.setenv("FLYWHEEL_ACTOR_C51_ATOMS", "21")
    assert LearnerSettings().network() == NetworkSpec(hidden=64)
    assert ActorSettings().network() == NetworkSpec(head="c51", c51_atoms=21)
    net = build_q_network((4,), 2, **LearnerSettings().network().model_dump())
    assert net.name == "mlp-4-2-dueling-h64"
