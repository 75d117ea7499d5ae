"""The update loop's machinery: gradient accumulation, no host syncs per update, compile fall-back, AMP, QR-DQN,
Munchausen-DQN."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from learner_helpers import fit_one_step_rewards, make_batch

from flywheel import proto
from flywheel.services.learner.core import CoreConfig, LearnerCore

SYNC_METHODS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


def _cat(a: proto.SampleBatch, b: proto.SampleBatch) -> proto.SampleBatch:
    return proto.SampleBatch(request_id=0, replay_size=1000, **{
        name: np.concatenate([getattr(a, name), getattr(b, name)])
        for name in ("obs", "action", "reward", "discount", "next_obs", "index", "weight")})


def _capture_grads(core: LearnerCore) -> list[list[torch.Tensor]]:
    seen: list[list[torch.Tensor]] = []
    original = core.optimizer.step

    def step(*args, **kwargs):  # what the fused Adam step is about to apply
        seen.append([p.grad.detach().clone() for p in core.params])
        return original(*args, **kwargs)

    core.optimizer.step = step  # type: ignore[method-assign]
    return seen


def test_gradient_accumulation_equals_one_big_batch() -> None:
    rng = np.random.default_rng(0)
    b1, b2 = make_batch(rng, 16), make_batch(rng, 16)
    torch.manual_seed(1)
    accum = LearnerCore((4,), 2, CoreConfig(grad_accum_steps=2, grad_clip_norm=0))
    torch.manual_seed(1)
    big = LearnerCore((4,), 2, CoreConfig(grad_accum_steps=1, grad_clip_norm=0))
    grads_accum, grads_big = _capture_grads(accum), _capture_grads(big)
    first = accum.update(b1)
    assert not first.stepped and accum.steps == 0 and not grads_accum
    second = accum.update(b2)
    assert second.stepped and accum.steps == 1
    assert big.update(_cat(b1, b2)).stepped
    for g_acc, g_big in zip(grads_accum[0], grads_big[0], strict=True):
        torch.testing.assert_close(g_acc, g_big, rtol=1e-5, atol=1e-7)
    for p_acc, p_big in zip(accum.params, big.params, strict=True):
        torch.testing.assert_close(p_acc, p_big, rtol=1e-5, atol=1e-7)


def test_accumulated_priorities_come_from_the_weights_before_the_step() -> None:
    rng = np.random.default_rng(1)
    b1, b2 = make_batch(rng, 16), make_batch(rng, 16)
    torch.manual_seed(2)
    accum = LearnerCore((4,), 2, CoreConfig(grad_accum_steps=2))
    torch.manual_seed(2)
    big = LearnerCore((4,), 2, CoreConfig())
    p_accum = np.concatenate([accum.update(b1).priorities(), accum.update(b2).priorities()])
    np.testing.assert_allclose(p_accum, big.update(_cat(b1, b2)).priorities(), rtol=1e-5, atol=1e-6)


def test_updates_make_no_host_syncs_and_metrics_are_read_in_one(monkeypatch: pytest.MonkeyPatch) -> None:
    core = LearnerCore((4,), 2, CoreConfig(target_update_interval=3, grad_accum_steps=2))
    rng = np.random.default_rng(2)
    batches = [make_batch(rng, 32) for _ in range(12)]
    calls: list[str] = []
    for name in SYNC_METHODS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    for batch in batches:
        core.update(batch)
    assert calls == [], f"host syncs inside the update loop: {calls}"
    sums = core.drain_metrics()
    assert calls == ["tolist"]
    monkeypatch.undo()
    assert core.steps == 6 and sums.batches == 12 and sums.skipped_total == 0
    assert np.isfinite([sums.loss, sums.td_error, sums.q]).all() and sums.loss > 0
    assert core.drain_metrics().batches == 0  # sums restart after each read


def test_non_finite_step_is_skipped_on_the_device_and_counted() -> None:
    core = LearnerCore((4,), 2, CoreConfig())
    batch = make_batch(np.random.default_rng(3), 16)
    core.update(batch)
    moments = [s["exp_avg"].clone() for s in core.optimizer.state.values()]
    params = [p.detach().clone() for p in core.params]
    bad = proto.SampleBatch(**{**batch.__dict__, "reward": np.full(16, np.inf, np.float32)})
    result = core.update(bad)
    assert result.stepped and not result.applied
    assert all(torch.equal(a, b) for a, b in zip(params, core.params, strict=True))
    assert all(torch.equal(a, s["exp_avg"]) for a, s in zip(moments, core.optimizer.state.values(), strict=True))
    assert all(float(s["step"]) == 1.0 for s in core.optimizer.state.values())  # the skipped step is undone
    assert (core.steps, core.updates, core.skipped, core.drain_metrics().skipped_total) == (2, 1, 1, 1)


def test_compile_fall_back_trains_eagerly_with_the_same_result(caplog: pytest.LogCaptureFixture) -> None:
    def failing_backend(graph_module: torch.fx.GraphModule, example_inputs: list) -> None:
        raise RuntimeError("no C++ compiler on this machine")

    batch = make_batch(np.random.default_rng(4), 32)
    torch.manual_seed(3)
    compiled = LearnerCore((4,), 2, CoreConfig(compile=True),
                           compiler=lambda fn: torch.compile(fn, backend=failing_backend))
    torch.manual_seed(3)
    eager = LearnerCore((4,), 2, CoreConfig())
    assert compiled.compile_state == "pending"
    with caplog.at_level(logging.WARNING, logger="flywheel.learner"):
        r1 = compiled.update(batch)
    assert compiled.compile_state == "failed"
    assert any("torch.compile failed" in r.getMessage() and "no C++ compiler" in r.getMessage()
               for r in caplog.records)
    np.testing.assert_array_equal(r1.priorities(), eager.update(batch).priorities())
    for a, b in zip(compiled.params, eager.params, strict=True):
        torch.testing.assert_close(a, b)
    assert compiled.update(batch).stepped and compiled.steps == 2


def test_compiled_loss_matches_eager() -> None:
    rng = np.random.default_rng(5)
    batches = [make_batch(rng, 32, n_actions=3) for _ in range(3)]
    torch.manual_seed(4)
    compiled = LearnerCore((4,), 3, CoreConfig(compile=True), compiler=lambda fn: torch.compile(fn, backend="eager"))
    torch.manual_seed(4)
    eager = LearnerCore((4,), 3, CoreConfig())
    for batch in batches:
        np.testing.assert_allclose(compiled.update(batch).priorities(), eager.update(batch).priorities(),
                                   rtol=1e-5, atol=1e-6)
    assert compiled.compile_state == "on"


class _StaticOutput(torch.autograd.Function):
    """Return ``buf`` holding ``x``'s values, as a replayed CUDA graph returns its static output buffers."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        buf.copy_(x)
        ctx.mark_dirty(buf)
        return buf

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


def _static_outputs(fn):
    """A compiler whose loss, |TD| and Q outputs live in buffers the next call overwrites (what CUDA graphs do)."""
    buffers: list[torch.Tensor] = []

    def run(*args):
        loss, td_abs, q_taken, demo = fn(*args)
        outs = (loss, td_abs, q_taken)
        if not buffers:
            buffers.extend(torch.empty_like(t) for t in outs)
        return (*(_StaticOutput.apply(t, b) for t, b in zip(outs, buffers, strict=True)), demo)
    return run


def test_cuda_graph_outputs_are_kept_past_the_next_update() -> None:
    """With CUDA graphs (compile_mode reduce-overhead on a GPU) a graph's outputs are overwritten by its next replay;
    the core keeps copies, so every update's loss, priorities and the loss metric are its own (an H200 raised
    "accessing tensor output of CUDAGraphs that has been overwritten" before the loss was copied too)."""
    rng = np.random.default_rng(8)
    batches = [make_batch(rng, 32, n_actions=3) for _ in range(4)]
    torch.manual_seed(9)
    graphs = LearnerCore((4,), 3, CoreConfig(compile=True), compiler=_static_outputs)
    graphs._cuda_graphs = True  # what a CUDA device with compile_mode reduce-overhead sets; the path runs on a CPU
    torch.manual_seed(9)
    eager = LearnerCore((4,), 3, CoreConfig())
    kept = [graphs.update(b) for b in batches]
    expected = [eager.update(b) for b in batches]
    assert len({float(r.loss) for r in expected}) == 4  # four different losses: a shared buffer would show one
    for got, want in zip(kept, expected, strict=True):
        assert float(got.loss) == pytest.approx(float(want.loss), rel=1e-5)
        np.testing.assert_allclose(got.priorities(), want.priorities(), rtol=1e-5, atol=1e-6)
    assert graphs.drain_metrics().loss == pytest.approx(eager.drain_metrics().loss, rel=1e-5)


@pytest.mark.timeout(600)  # the first inductor compile on a busy 2-core machine
@pytest.mark.system
def test_inductor_on_cpu_with_channels_last_matches_eager() -> None:
    """The pixel preset's CPU path for real: torch.compile with inductor (C++ codegen) on a channels-last Nature CNN."""
    rng = np.random.default_rng(6)
    batches = [make_batch(rng, 8, obs_shape=(4, 42, 42), n_actions=7, pixels=True) for _ in range(3)]
    torch.manual_seed(7)
    compiled = LearnerCore((4, 42, 42), 7, CoreConfig(compile=True, channels_last=True))
    torch.manual_seed(7)
    eager = LearnerCore((4, 42, 42), 7, CoreConfig())
    assert compiled.online.torso[0].weight.is_contiguous(memory_format=torch.channels_last)
    for batch in batches:
        np.testing.assert_allclose(compiled.update(batch).priorities(), eager.update(batch).priorities(),
                                   rtol=1e-4, atol=1e-5)
    assert compiled.compile_state == "on"  # inductor compiled it: no fall-back to eager
    for a, b in zip(compiled.params, eager.params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_paths_train(precision: str) -> None:
    torch.manual_seed(5)
    core = LearnerCore((4,), 2, CoreConfig(lr=1e-3, precision=precision, target_update_interval=10_000))
    assert (core.scaler is not None) == (precision == "fp16")
    batch = make_batch(np.random.default_rng(6), 64)
    first = core.update(batch).stats()["loss"]
    for _ in range(40):
        last = core.update(batch).stats()["loss"]
    assert last < 0.7 * first
    assert all(p.dtype == torch.float32 for p in core.params)  # autocast: master weights stay fp32


def test_quantile_head_learns_one_step_rewards() -> None:
    core = LearnerCore((4,), 2, CoreConfig(lr=3e-3, head="quantile", num_quantiles=16))
    assert core.name == "mlp-4-2-dueling-qr16"
    q, table = fit_one_step_rewards(core, seed=7)
    np.testing.assert_allclose(q, table, atol=0.08)


def test_c51_head_learns_one_step_rewards() -> None:
    core = LearnerCore((4,), 2, CoreConfig(lr=3e-3, head="c51", c51_v_min=-2.0, c51_v_max=2.0))
    assert core.name == "mlp-4-2-dueling-c51"
    q, table = fit_one_step_rewards(core, seed=7)
    np.testing.assert_allclose(q, table, atol=0.08)


def test_munchausen_learns_its_fixed_point_on_one_step_rewards() -> None:
    """One-step rewards (discount 0): Munchausen's target is r + alpha * clip(tau * log pi(a|s), -1, 0) with pi the
    softmax of Q / tau itself once the target net has caught up, so Q must reach that fixed point (computed here by
    iterating it): the greedy action keeps about its reward, the other falls below its own (a wider action gap)."""
    alpha, tau = 0.9, 0.1
    core = LearnerCore((4,), 2, CoreConfig(lr=3e-3, munchausen=True, munchausen_tau=tau, target_update_interval=50))
    q, table = fit_one_step_rewards(core, seed=7, updates=600)
    fixed = table.astype(np.float64).copy()
    for _ in range(500):
        log_pi = fixed / tau - np.log(np.exp(fixed / tau).sum(axis=1, keepdims=True))
        fixed = table + alpha * np.clip(tau * log_pi, -1.0, 0.0)
    np.testing.assert_allclose(q, fixed, atol=0.05)
    np.testing.assert_array_equal(q.argmax(axis=1), table.argmax(axis=1))
    rows, other = np.arange(4), table.argmin(axis=1)
    assert (q[rows, other] < table[rows, other] - 0.05).all()
    from flywheel.services.learner.metrics import network_passes

    assert network_passes(core) == 5  # the target net on s replaces the online net on s'
