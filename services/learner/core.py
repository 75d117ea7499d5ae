"""Pure DQN learner core: double, dueling, n-step, IS-weighted Huber or QR-DQN loss, with no host syncs per update.

Everything an update decides stays on the device: a non-finite gradient skips the fused Adam step through its
``found_inf`` input (no ``.item()``), loss/TD/Q sums accumulate on the device (sums.py) for the loop to read every
N updates, and priorities leave through ``staging.HostCopy``. No sockets here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from flywheel.nets import QNetwork, as_tensor, build_q_network
from flywheel.settings import setting_default

from .losses import (
    LossTerms,
    categorical_td_loss,
    large_margin_loss,
    munchausen_td_loss,
    q_td_loss,
    quantile_td_loss,
)
from .settings import LearnerSettings
from .staging import Batch, BatchStager, DeviceBatch
from .state import core_state, load_core_state
from .sums import DeviceSums, MetricSums

log = logging.getLogger("flywheel.learner")
Compiler = Callable[[Callable[..., Any]], Callable[..., Any]]
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# loss, |TD| per sample, Q of the taken actions, and (demonstration rows, margin-loss sum) when a batch has demos
LossOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


class BadBatch(ValueError):
    """A sampled batch does not fit this learner's network; ``fault`` labels it for FaultCounter."""

    fault = "batch"


_default = partial(setting_default, LearnerSettings)  # a settings field's default: each value is written once


@dataclass
class CoreConfig:
    """Hyper-parameters of the update rule and how it runs on the device; the defaults are LearnerSettings' (the
    device-dependent ones, precision to channels_last, are resolved by services/learner/startup.py)."""

    lr: float = _default("lr")
    adam_eps: float = _default("adam_eps")
    weight_decay: float = _default("weight_decay")
    grad_clip_norm: float = _default("grad_clip_norm")
    target_update_interval: int = _default("target_update_interval")
    tau: float = _default("tau")
    acting_ema: float = _default("acting_ema")
    double: bool = _default("double")
    dueling: bool = _default("dueling")
    munchausen: bool = _default("munchausen")
    munchausen_alpha: float = _default("munchausen_alpha")
    munchausen_tau: float = _default("munchausen_tau")
    munchausen_clip: float = _default("munchausen_clip")
    hidden: int = _default("hidden")
    head: str = _default("head")
    num_quantiles: int = _default("num_quantiles")
    c51_atoms: int = _default("c51_atoms")
    c51_v_min: float = _default("c51_v_min")
    c51_v_max: float = _default("c51_v_max")
    huber_kappa: float = _default("huber_kappa")
    grad_accum_steps: int = _default("grad_accum_steps")
    precision: str = "fp32"  # fp32 | bf16 | fp16 (resolve "auto" with resolve_precision first)
    compile: bool = False
    compile_mode: str = "default"
    channels_last: bool = False  # conv nets in NHWC memory order (always on a GPU; with inductor on a CPU too)
    host_staging: str = _default("host_staging")  # GPU: pinned ring or direct copies from the batch's memory
    demo_margin: float = _default("demo_margin")  # DQfD large-margin loss on rows marked is_demo: margin l(a_E, a)
    demo_loss_weight: float = _default("demo_loss_weight")  # its weight lambda (0 = off)


@dataclass
class UpdateResult:
    """One sampled batch's outcome; tensors stay on the device until ``priorities()``/``stats()`` are read."""

    td_abs: torch.Tensor
    loss: torch.Tensor
    q_taken: torch.Tensor
    stepped: bool  # this batch completed an optimizer step (every grad_accum_steps batches)
    batch_size: int
    found_inf: torch.Tensor | None = None  # 1.0 when that step was skipped for a non-finite gradient

    @property
    def applied(self) -> bool:
        """Whether an optimizer step was taken and kept (reads the device: for tests and tools, not the loop)."""
        return self.stepped and self.found_inf is not None and not bool(self.found_inf)

    def priorities(self) -> np.ndarray:
        """|TD error| per sample as float32 (the replay applies its own exponent and epsilon); NaN/inf -> 0."""
        return finite_priorities(self.td_abs.detach().float().cpu().numpy())

    def stats(self) -> dict[str, float]:
        return {"loss": float(self.loss), "q_mean": float(self.q_taken.float().mean()),
                "td_error_mean": float(self.td_abs.float().mean())}


def finite_priorities(td_abs: np.ndarray) -> np.ndarray:
    """Priorities the replay can use: NaN and infinities (from a skipped, non-finite update) become 0."""
    td_abs = td_abs.astype(np.float32, copy=False)
    finite = np.isfinite(td_abs)
    return td_abs if finite.all() else np.where(finite, td_abs, np.float32(0.0))


def linear_at(updates: int, start: float, end: float, over_updates: int) -> float:
    """A schedule's value after ``updates``: linear from start to end over ``over_updates``, then end (beta, lr)."""
    if over_updates <= 0:
        return end
    return start + (end - start) * min(1.0, updates / over_updates)


def network_for(obs_shape: tuple[int, ...], n_actions: int, config: CoreConfig) -> QNetwork:
    """A newly initialised network of the architecture ``config`` describes (torch's generator; on the CPU)."""
    return build_q_network(obs_shape, n_actions, dueling=config.dueling, hidden=config.hidden, head=config.head,
                           num_quantiles=config.num_quantiles, v_min=config.c51_v_min, v_max=config.c51_v_max,
                           c51_atoms=config.c51_atoms)


def _channels_last(net: QNetwork) -> QNetwork:
    """``net`` with its convolution weights in channels-last (NHWC) memory order."""
    net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # in place; torch's stubs omit it
    return net


def _default_compiler(mode: str) -> Compiler:
    return lambda fn: torch.compile(fn, mode=mode, dynamic=False)


class LearnerCore:
    """Online + target networks and Adam; ``update`` takes one sampled batch and returns |td| for priorities."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, config: CoreConfig,
                 device: torch.device | str = "cpu", *, compiler: Compiler | None = None) -> None:
        if config.precision not in ("fp32", *AMP_DTYPES):
            raise ValueError(f"precision must be fp32, bf16 or fp16, got {config.precision!r}")
        self.config = config
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        nets = [network_for(obs_shape, n_actions, config) for _ in range(3 if config.acting_ema > 0 else 2)]
        if (self.cuda or config.channels_last) and nets[0].kind != "mlp":
            nets = [_channels_last(net) for net in nets]  # faster cuDNN / inductor convolutions
        self.online: QNetwork = nets[0].to(self.device)
        self.target: QNetwork = nets[1].to(self.device)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        # what acts and is evaluated: the online network, or (acting_ema) its Polyak average, against policy churn
        self.acting: QNetwork = self.online
        if config.acting_ema > 0:
            self.acting = nets[2].to(self.device)
            self.acting.load_state_dict(self.online.state_dict())
            self.acting.requires_grad_(False)
            self.acting.eval()
        self.name = self.online.name
        self.obs_shape, self.n_actions = self.online.obs_shape, self.online.n_actions
        self.params: list[torch.Tensor] = list(self.online.parameters())
        self._acting_params: list[torch.Tensor] = list(self.acting.parameters())
        self.optimizer = self._adam()
        self.amp_dtype = AMP_DTYPES.get(config.precision)
        self.scaler = torch.amp.GradScaler(self.device.type) if config.precision == "fp16" else None
        self.stager = BatchStager(self.device, direct=config.host_staging == "direct")
        self.steps = 0  # optimizer steps taken, skipped ones included; persisted in checkpoints
        self._micro = 0  # batches accumulated towards the next step
        self.sums = DeviceSums(self.device)  # loss/TD/Q per batch, kept on the device until drain_metrics
        self._step_losses: list[torch.Tensor] = []  # losses since the last optimizer step
        self.online.train()
        self.target.train()
        self._loss_fn: Callable[..., LossOutputs] = self._losses
        self.compile_state = "off"  # off | pending (first call not yet done) | on | failed
        self._cuda_graphs = config.compile and self.cuda and config.compile_mode == "reduce-overhead"
        if config.compile:
            self._loss_fn = (compiler or _default_compiler(config.compile_mode))(self._losses)
            self.compile_state = "pending"

    def _adam(self) -> torch.optim.Optimizer:
        lr, eps, decay = self.config.lr, self.config.adam_eps, self.config.weight_decay
        adam = partial(torch.optim.AdamW, weight_decay=decay) if decay > 0 else torch.optim.Adam  # decoupled decay
        try:  # fused: one kernel, and it skips a step on found_inf without a host sync
            return adam(self.params, lr=lr, eps=eps, fused=True)
        except (RuntimeError, TypeError) as exc:  # pragma: no cover - every device torch ships supports it now
            log.warning("learner: fused Adam unavailable (%s); using foreach Adam", exc)
            return adam(self.params, lr=lr, eps=eps, foreach=True)

    # ---- settings ------------------------------------------------------------------------------------------------
    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"learning rate must be a positive number, got {lr}")
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    @property
    def skipped(self) -> int:
        """Steps skipped for a non-finite loss or gradient (reads the device).

        Fused Adam takes back its step count when it skips, so its count is the number of applied steps.
        """
        return self.steps - self._applied_steps()

    def _applied_steps(self) -> int:
        state = self.optimizer.state.get(self.params[0], {})
        return int(state["step"].item()) if "step" in state else 0

    @property
    def updates(self) -> int:
        """Optimizer steps that changed the weights (reads the device; the loop uses ``steps``)."""
        return self.steps - self.skipped

    # ---- the update ----------------------------------------------------------------------------------------------
    def check_batch(self, batch: Batch) -> None:
        """Raise BadBatch when the batch cannot be trained on (shape, dtype, action range, weights)."""
        if tuple(batch.obs.shape[1:]) != self.obs_shape:
            raise BadBatch(f"batch obs shape {tuple(batch.obs.shape[1:])} does not match the network's "
                           f"{self.obs_shape}")
        action = batch.action
        if action.size and (int(action.min()) < 0 or int(action.max()) >= self.n_actions):
            raise BadBatch(f"batch actions outside 0..{self.n_actions - 1}")
        if not np.isfinite(batch.weight).all() or (batch.weight < 0).any():
            raise BadBatch("batch importance weights must be finite and non-negative")
        if not (np.isfinite(batch.reward).all() and np.isfinite(batch.discount).all()):
            raise BadBatch("batch rewards and discounts must be finite")

    def bootstrap_outputs(self, obs: torch.Tensor, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target side's network outputs, without gradients: the target net on s', and beside it the online net
        on s' (double DQN), the target net on s (Munchausen) or None."""
        with torch.no_grad():
            next_target = self.target.outputs(next_obs)
            if self.config.munchausen:
                return next_target, self.target.outputs(obs)
            return next_target, self.online.outputs(next_obs) if self.config.double else None

    def td_terms(self, out: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                 next_target: torch.Tensor, beside: torch.Tensor | None) -> LossTerms:
        """The TD loss terms the settings choose, from ``bootstrap_outputs``' pair."""
        c = self.config
        if c.munchausen:
            assert beside is not None
            return munchausen_td_loss(out, action, reward, discount, next_target, beside, alpha=c.munchausen_alpha,
                                      entropy_tau=c.munchausen_tau, clip_low=c.munchausen_clip, kappa=c.huber_kappa)
        if c.head == "c51":
            assert self.target.support is not None
            return categorical_td_loss(out, action, reward, discount, next_target, beside, self.target.support)
        if c.head == "quantile":
            return quantile_td_loss(out, action, reward, discount, next_target, beside, c.huber_kappa)
        return q_td_loss(out, action, reward, discount, next_target, beside, c.huber_kappa)

    def _nets(self, obs: torch.Tensor, next_obs: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        out = self.online.outputs(obs)
        return out, *self.bootstrap_outputs(obs, next_obs)

    def _losses(self, obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                next_obs: torch.Tensor, weight: torch.Tensor, is_demo: torch.Tensor | None = None
                ) -> LossOutputs:
        """IS-weighted mean loss, |TD| per sample, Q of the taken actions (the networks under autocast) and, with
        ``is_demo``, (demonstration rows, their large-margin loss sum); those rows add lambda x margin loss."""
        if self.amp_dtype is not None:
            with torch.autocast(self.device.type, dtype=self.amp_dtype):
                out, next_target, beside = self._nets(obs, next_obs)
        else:  # no autocast context at all: entering a disabled one costs as much as a small op
            out, next_target, beside = self._nets(obs, next_obs)
        terms = self.td_terms(out, action, reward, discount, next_target, beside)
        per_sample, demo_stats = terms.per_sample, None
        if is_demo is not None:
            demo = is_demo.float()
            if self.config.demo_loss_weight > 0:
                margin = large_margin_loss(self.online.q_values(out), action, self.config.demo_margin) * demo
                per_sample = per_sample + self.config.demo_loss_weight * margin
                demo_stats = torch.stack((demo.sum(), margin.detach().sum()))
            else:
                demo_stats = torch.stack((demo.sum(), torch.zeros((), device=demo.device)))
        loss = (weight * per_sample).mean()
        return loss, terms.td_abs, terms.q_taken, demo_stats

    def _forward_backward(self, b: DeviceBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        loss, td_abs, q_taken, demo_stats = self._loss_fn(b.obs, b.action, b.reward, b.discount, b.next_obs, b.weight,
                                                          b.is_demo)
        if demo_stats is not None:
            self.sums.add_demos(demo_stats)
        kept = loss.detach(), td_abs.detach(), q_taken.detach()
        if self._cuda_graphs:  # graph outputs are overwritten by the next replay; these three outlive it
            kept = kept[0].clone(), kept[1].clone(), kept[2].clone()
        scaled = loss / self.config.grad_accum_steps if self.config.grad_accum_steps > 1 else loss
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        return kept

    def _compile_failed(self, exc: BaseException) -> None:
        cause = getattr(exc, "inner_exception", None) or exc.__cause__ or exc  # dynamo wraps the backend's error
        first = (str(cause).strip().splitlines() or [""])[0]
        log.warning("learner: torch.compile failed (%s: %s); training continues eagerly", type(cause).__name__,
                    first[:300])
        self._loss_fn = self._losses
        self.compile_state = "failed"
        self._cuda_graphs = False
        self.optimizer.zero_grad(set_to_none=True)  # drop whatever a half-finished backward left
        self._micro = 0
        self._step_losses.clear()

    def update(self, batch: Batch | DeviceBatch) -> UpdateResult:
        """Forward/backward on one batch; every ``grad_accum_steps`` batches, clip and take one Adam step."""
        b = batch if isinstance(batch, DeviceBatch) else self.stager.stage(batch)
        b.use_on_current_stream()
        if self.compile_state in ("pending", "on"):
            try:
                loss, td_abs, q_taken = self._forward_backward(b)
                self.compile_state = "on"
            except Exception as exc:  # any compiler failure; a real (non-compile) error recurs eagerly below
                self._compile_failed(exc)
                loss, td_abs, q_taken = self._forward_backward(b)
        else:
            loss, td_abs, q_taken = self._forward_backward(b)
        self.sums.add(loss, td_abs, q_taken)
        self._step_losses.append(loss)
        self._micro += 1
        found_inf = None
        if self._micro >= self.config.grad_accum_steps:
            found_inf = self._step()
        return UpdateResult(td_abs=td_abs, loss=loss, q_taken=q_taken, stepped=found_inf is not None,
                            batch_size=b.size, found_inf=found_inf)

    def _step(self) -> torch.Tensor:
        # a non-finite loss can come with finite (Huber-clipped) gradients: it counts as non-finite too
        loss = self._step_losses[0] if len(self._step_losses) == 1 else torch.stack(self._step_losses).sum()
        self._step_losses.clear()
        if self.scaler is not None:
            poison = torch.where(torch.isfinite(loss), 0.0, torch.nan)  # make the scaler see a bad loss
            torch._foreach_add_([p.grad for p in self.params if p.grad is not None], poison)
            self.scaler.unscale_(self.optimizer)
        clip = self.config.grad_clip_norm if self.config.grad_clip_norm > 0 else math.inf
        # foreach kernels pay off on a GPU; on a CPU the per-tensor loop is faster (89 vs 102 us, 6 tensors)
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip, foreach=True if self.cuda else None)
        found_inf = torch.isfinite(norm + loss).logical_not_().float()
        if self.scaler is not None:  # the scaler hands the fused step its own found_inf (also sync-free)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif self.optimizer.defaults.get("fused"):
            self.optimizer.found_inf = found_inf  # type: ignore[attr-defined]  # fused Adam skips when 1
            self.optimizer.step()
        elif not bool(found_inf):  # pragma: no cover - the foreach fall-back has to ask the device
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        self._micro = 0
        self._refresh_target()
        if self.acting is not self.online:
            with torch.no_grad():
                torch._foreach_lerp_(self._acting_params, self.params, self.config.acting_ema)
        return found_inf

    def _refresh_target(self) -> None:
        if self.config.tau > 0:
            with torch.no_grad():
                torch._foreach_lerp_(list[torch.Tensor](self.target.parameters()), list[torch.Tensor](self.params),
                                     self.config.tau)
        elif self.steps % self.config.target_update_interval == 0:
            self.sync_target()

    def sync_target(self) -> None:
        """Hard copy online -> target."""
        with torch.no_grad():
            torch._foreach_copy_(list[torch.Tensor](self.target.parameters()), list[torch.Tensor](self.params))

    # ---- state ---------------------------------------------------------------------------------------------------
    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Networks and Adam moments as CPU tensors, and the counters as JSON metadata (services/learner/state.py)."""
        return core_state(self)

    def load_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Load a ``state_dict``; a StateError, before anything changed, when it does not fit this core."""
        load_core_state(self, tensors, meta)

    # ---- reading results -----------------------------------------------------------------------------------------
    def drain_metrics(self) -> MetricSums:
        """Loss/TD/Q sums since the last call and the skipped-step total, in one device read."""
        state = self.optimizer.state.get(self.params[0], {})
        return self.sums.drain(state.get("step"), self.steps)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Online Q-values for a batch (float32, on the host); for evaluation and tests."""
        with torch.inference_mode():
            q: np.ndarray = self.online(as_tensor(obs, self.device)).float().cpu().numpy()
        return q
