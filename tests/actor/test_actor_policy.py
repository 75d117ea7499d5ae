"""The actor's policies: the NumPy MLP against the torch QNetwork, backend choice, and an actor without torch."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from flywheel import proto
from flywheel.nets import QNetwork, WeightsMismatch, build_q_network, weights_message
from flywheel.nets_numpy import NumpyQNetwork
from flywheel.services.actor.blas import limit_blas_threads
from flywheel.services.actor.policy import TorchPolicy, build_policy, resolve_backend

SPECS = [  # obs_shape, n_actions, dueling, hidden, head
    ((4,), 2, True, 128, "q"),
    ((4,), 2, False, 64, "q"),
    ((8,), 5, True, 256, "quantile"),
    ((8,), 5, False, 32, "quantile"),
    ((8,), 5, True, 64, "c51"),
    ((6,), 3, False, 32, "c51"),
    ((2, 3), 3, True, 16, "q"),  # other ranks are flattened
]


def random_torch_net(obs_shape: tuple[int, ...], n_actions: int, dueling: bool, hidden: int, head: str,
                     seed: int) -> QNetwork:
    """A QNetwork with every parameter redrawn from N(0, 0.3): larger than the init, so outputs spread widely."""
    torch.manual_seed(seed)
    net = build_q_network(obs_shape, n_actions, dueling=dueling, hidden=hidden, head=head, num_quantiles=11,
                          c51_atoms=13).eval()
    with torch.no_grad():
        for param in net.parameters():
            param.normal_(0.0, 0.3)
    return net


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(map(str, s)))
def test_numpy_mlp_matches_torch_qnetwork(spec: tuple[tuple[int, ...], int, bool, int, str]) -> None:
    obs_shape, n_actions, dueling, hidden, head = spec
    net = random_torch_net(obs_shape, n_actions, dueling, hidden, head, seed=len(obs_shape) * 100 + hidden)
    mine = NumpyQNetwork(obs_shape, n_actions, dueling=dueling, hidden=hidden, head=head, num_quantiles=11,
                         c51_atoms=13, seed=0)
    assert mine.name == net.name
    torch_shapes = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    assert {k: v.shape for k, v in mine.state_dict().items()} == torch_shapes
    mine.load(weights_message(net, 1, net.name))
    obs = np.random.default_rng(hidden).normal(0.0, 2.0, size=(513, *obs_shape)).astype(np.float32)
    with torch.inference_mode():
        want_out = net.outputs(torch.from_numpy(obs)).numpy()
        want_q = net(torch.from_numpy(obs)).numpy()
    got_out, got_q = mine.outputs(obs), mine.q_values(obs)
    assert got_out.shape == want_out.shape and got_q.shape == (513, n_actions) and got_q.dtype == np.float32
    assert np.abs(got_out - want_out).max() < 1e-4 * max(1.0, np.abs(want_out).max())
    assert np.abs(got_q - want_q).max() < 1e-4 * max(1.0, np.abs(want_q).max())
    assert np.array_equal(got_q.argmax(axis=1), want_q.argmax(axis=1))  # identical greedy actions
    assert len(np.unique(want_q.argmax(axis=1))) > 1  # the check covers more than one action
    for key, value in mine.state_dict().items():  # and the loaded parameters are the learner's, exactly
        assert np.array_equal(value, net.state_dict()[key].numpy())


def test_uint8_vectors_are_scaled_like_torch() -> None:
    net = random_torch_net((6,), 3, True, 32, "q", seed=7)
    mine = NumpyQNetwork((6,), 3, hidden=32)
    mine.load(weights_message(net, 1, net.name))
    obs = np.random.default_rng(1).integers(0, 256, size=(64, 6), dtype=np.uint8)
    with torch.inference_mode():
        want = net(torch.from_numpy(obs)).numpy()
    assert np.abs(mine.q_values(obs) - want).max() < 1e-4
    assert np.array_equal(mine.q_values(obs).argmax(axis=1), want.argmax(axis=1))


def test_initial_weights_follow_torch_default_bounds_and_seed() -> None:
    a, b = NumpyQNetwork((4,), 2, hidden=64, seed=3), NumpyQNetwork((4,), 2, hidden=64, seed=3)
    c = NumpyQNetwork((4,), 2, hidden=64, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(np.array_equal(sa[k], sb[k]) for k in sa) and not np.array_equal(sa["fc.0.weight"], sc["fc.0.weight"])
    assert np.abs(sa["torso.1.weight"]).max() <= 1 / 2 and np.abs(sa["torso.1.weight"]).max() > 0.4  # 1/sqrt(4)
    assert np.abs(sa["fc.0.weight"]).max() <= 1 / 8  # 1/sqrt(64)
    q = a.q_values(np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32))
    assert len(np.unique(q.argmax(axis=1))) == 2  # not a constant policy before the first weights


def test_load_refuses_what_does_not_fit_and_keeps_the_weights() -> None:
    mine = NumpyQNetwork((4,), 2, hidden=32, seed=0)
    before = mine.state_dict()
    good = weights_message(random_torch_net((4,), 2, True, 32, "q", seed=1), 5, mine.name)
    bad = [
        proto.Weights(5, "mlp-4-2-dueling", good.tensors),  # another name (hidden 256)
        proto.Weights(5, mine.name, {k: v for k, v in good.tensors.items() if k != "value.bias"}),
        proto.Weights(5, mine.name, {**good.tensors, "value.bias": np.zeros(2, np.float32)}),
        proto.Weights(5, mine.name, {**good.tensors, "fc.0.bias": good.tensors["fc.0.bias"].astype(np.float64)}),
        proto.Weights(5, mine.name, {**good.tensors, "fc.0.bias": np.full(32, np.inf, np.float32)}),
    ]
    for msg in bad:
        with pytest.raises(WeightsMismatch):
            mine.load(msg)
        assert all(np.array_equal(v, before[k]) for k, v in mine.state_dict().items())
    mine.load(good)
    assert all(np.array_equal(v, good.tensors[k]) for k, v in mine.state_dict().items())
    good.tensors["fc.0.bias"][...] = 9.0  # the network holds its own copy
    assert not np.array_equal(mine.state_dict()["fc.0.bias"], good.tensors["fc.0.bias"])


def test_backend_choice() -> None:
    assert resolve_backend((4,)) == "numpy" and resolve_backend((4, 84, 84)) == "torch"
    assert resolve_backend((3, 11, 11)) == "torch" and resolve_backend((4,), "torch") == "torch"
    with pytest.raises(ValueError, match="needs torch"):
        resolve_backend((4, 84, 84), "numpy")
    with pytest.raises(ValueError, match="vector observations only"):
        NumpyQNetwork((3, 11, 11), 4)
    assert isinstance(build_policy((4,), 2, hidden=32, threads=None), NumpyQNetwork)
    torch_policy = build_policy((4,), 2, hidden=32, backend="torch", threads=None)
    assert isinstance(torch_policy, TorchPolicy) and torch_policy.name == "mlp-4-2-dueling-h32"
    q = torch_policy.q_values(np.zeros((3, 4), np.float32))
    assert q.shape == (3, 2) and q.dtype == np.float32


def test_limit_blas_threads_finds_numpys_openblas(monkeypatch: pytest.MonkeyPatch) -> None:
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
    if "openblas" not in blas.lower():
        pytest.skip(f"NumPy here uses {blas}, not OpenBLAS")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert any("openblas" in name for name in limit_blas_threads(1))
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert limit_blas_threads(1) == []  # the user's choice stands


@pytest.mark.system
def test_cartpole_actor_process_never_imports_torch(tmp_path: object) -> None:
    """The real entry point (`python -m flywheel actor`) on CartPole, to its step limit, without torch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    endpoint = f"ipc://{tmp_path}/nobody"  # nobody listens: sends are dropped, the actor keeps stepping
    code = ("import runpy, sys; sys.argv = ['flywheel', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('flywheel', run_name='__main__')\n"
            "finally:\n    print('TORCH_LOADED' if 'torch' in sys.modules else 'NO_TORCH', file=sys.stderr)")
    proc = subprocess.run(
        [sys.executable, "-c", code, "actor", "--env-id", "CartPole-v1", "--num-envs", "8", "--epsilon", "0.3",
         "--on-full", "drop", "--max-env-steps", "2000", "--transitions-endpoint", endpoint,
         "--weights-endpoint", endpoint + "-w", "--lease-endpoint", endpoint + "-l",
         "--telemetry-endpoint", endpoint + "-t", "--control-endpoint", endpoint + "-c"],
        env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reached 2000 env steps" in proc.stderr and "numpy inference" in proc.stderr
    assert proc.stderr.strip().endswith("NO_TORCH"), proc.stderr[-2000:]


def test_frozen_torch_trace_gives_the_same_q_and_follows_loaded_weights() -> None:
    torch.manual_seed(0)
    frozen = build_policy((4, 36, 36), 5, threads=None, freeze=True, obs_dtype="uint8")
    assert isinstance(frozen, TorchPolicy) and frozen.frozen is not None
    eager = TorchPolicy(frozen.net, freeze=False)  # the same module, run eagerly
    obs = np.random.default_rng(0).integers(0, 256, size=(9, 4, 36, 36), dtype=np.uint8)
    assert np.array_equal(frozen.q_values(obs), eager.q_values(obs))
    learner = random_torch_net((4, 36, 36), 5, True, 256, "q", seed=3)
    before = frozen.q_values(obs)
    frozen.load(weights_message(learner, 1, frozen.name))  # copied in place: the trace is not rebuilt
    with torch.inference_mode():
        want = learner(torch.from_numpy(obs)).numpy()
    assert not np.allclose(before, want)
    assert np.array_equal(frozen.q_values(obs), want)
    assert np.array_equal(frozen.q_values(obs[:1]), eager.q_values(obs[:1]))  # any batch size
    as_float = obs.astype(np.float32)  # another dtype than traced (floats are not scaled): the eager module runs
    assert np.array_equal(frozen.q_values(as_float), eager.q_values(as_float))


def test_flywheel_run_gives_actors_the_learners_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """`flywheel run --set learner.head=quantile` alone must not leave actors refusing every weights message."""
    from flywheel.cli import build_parser
    from flywheel.launch.run import make_plan

    for name in [n for n in os.environ if n.startswith("FLYWHEEL_")]:
        monkeypatch.delenv(name)

    def plan(*sets: str) -> dict[str, dict[str, str]]:
        args = build_parser().parse_args(["run", "--env", "CartPole-v1", "--base-port", "0", "--http-port", "0",
                                          *[f"--set={item}" for item in sets]])
        return make_plan(args).env

    env = plan("learner.head=quantile", "learner.num_quantiles=21", "learner.hidden=64", "learner.dueling=false")
    assert {k: env["actor"][k] for k in ("HEAD", "NUM_QUANTILES", "HIDDEN", "DUELING")} == {
        "HEAD": "quantile", "NUM_QUANTILES": "21", "HIDDEN": "64", "DUELING": "false"}
    default = plan()  # the vector preset's network, one record in its common section, read by the learner
    assert (default["actor"]["HIDDEN"], default["actor"]["HEAD"]) == ("128", "q") and "HIDDEN" not in default["learner"]
    assert plan("learner.hidden=64", "actor.hidden=32")["actor"]["HIDDEN"] == "32"  # the user's own choice stands
    assert plan("learner.head=c51", "learner.c51_atoms=21")["actor"]["C51_ATOMS"] == "21"
    monkeypatch.setenv("FLYWHEEL_ACTOR_HIDDEN", "48")
    assert plan("learner.hidden=64")["actor"]["HIDDEN"] == "48"


@pytest.mark.system
def test_the_default_jobs_actor_builds_without_the_packages_the_actor_image_leaves_out() -> None:
    """The actor image drops torch.compile's packages (docker/actor-excludes.txt: sympy, networkx, ...). torch.jit's
    own trace check imported sympy (through torch.testing and torch.distributed), so every Mario actor in compose
    exited at start; the frozen conv policy is now checked without it. A child process with those imports refused
    builds the default job's actor: Mario's envs and the frozen policy."""
    code = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"sympy", "networkx", "jinja2", "mpmath"}:
            raise ImportError(f"{name} is not in the actor image")
sys.meta_path.insert(0, Refuse())
from flywheel.launch.registry import settings_class
from flywheel.launch.runplan import DEFAULT_ENV
from flywheel.services.actor.startup import acting_policy, build_acting
settings = settings_class("actor")(env_id=DEFAULT_ENV, num_envs=2, preset="pixel", torch_freeze=True)
core, spec = build_acting(settings)
policy = acting_policy(settings, spec)
print("frozen" if getattr(policy, "frozen", None) is not None else "eager", spec.obs_shape)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "FLYWHEEL_PRESET": "none"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[0] == "frozen", result.stdout + result.stderr[-2000:]
