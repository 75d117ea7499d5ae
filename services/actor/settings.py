"""Actor settings: FLYWHEEL_ACTOR_* variables or the same-named flags."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from flywheel.netspec import C51_ATOMS, Head, Torso
from flywheel.settings import CommonSettings

if TYPE_CHECKING:
    from flywheel.envs.start_states import StartStateConfig

    from .nstep import NStepSchedule


class ActorSettings(CommonSettings):
    """Environments, exploration, n-step returns and the sockets of one actor process."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_ACTOR_", extra="forbid", validate_default=True,
                                      env_ignore_empty=True)

    join: str = Field("", max_length=2048, description="URL of a run's gateway (http://HOST:PORT) started with "
                      "flywheel run --listen: its env id, preset values and endpoints, below these flags and "
                      "FLYWHEEL_ACTOR_* variables; needs this host's CURVE keys (--curve-keys-dir), never the "
                      "document's (flywheel/remote.py)")
    env_id: str = Field("SuperMarioBros-1-1-v0", description="environment id, options after '?' "
                        "(e.g. SuperMarioBros-1-1-v0?actions=right_only, ALE/Pong-v5?clip_rewards=false)")
    num_envs: int = Field(8, ge=1, le=4096, description="env slots stepped as one vector (MettaGrid: agents)")
    vector_mode: Literal["inprocess", "subprocess"] = Field(
        "inprocess", description="step envs in this process, or in worker processes over shared memory "
        "(double-buffered: inference overlaps stepping)")
    workers: int = Field(0, ge=0, le=256, description="worker processes in subprocess mode (0: the usable cores)")
    n_step: int = Field(3, ge=1, le=100, description="steps in each n-step return (the first, when annealed)")
    n_step_final: int = Field(0, ge=0, le=100, description="anneal n linearly from n_step to this over "
                              "n_step_anneal_steps of this actor's env steps, then keep it (0: n_step throughout)")
    n_step_anneal_steps: int = Field(0, ge=0, le=10**12, description="this actor's env steps over which n goes "
                                     "from n_step to n_step_final (a resumed run starts the schedule again)")
    gamma: float = Field(0.99, gt=0, le=1, description="discount factor")
    dueling: bool = Field(True, description="dueling network head (must match the learner)")
    hidden: int = Field(256, ge=8, le=8192, description="hidden units of the MLP (vector observations)")
    head: Head = Field("q", description="q, quantile (QR-DQN) or c51 head (must match the learner; a c51 net "
                       "takes the learner's support with the weights)")
    num_quantiles: int = Field(51, ge=2, le=1024, description="quantiles per action of the quantile head")
    c51_atoms: int = Field(C51_ATOMS, ge=2, le=1024, description="atoms per action of the c51 head (must match the "
                           "learner)")
    torso: Torso = Field("auto", description="auto: chosen by the observation's shape; strided: four 3x3 stride-2 "
                         "convolutions for images (must match the learner)")
    inference: Literal["auto", "numpy", "torch"] = Field(
        "auto", description="forward pass in NumPy (MLP only: the actor then never imports torch) or torch "
        "(auto: NumPy for vector observations, torch for convolutional networks)")
    torch_freeze: bool = Field(True, description="torch inference runs a frozen TorchScript trace of the network "
                               "(same results; cheaper CNN forward passes on CPU; about 1 s more start-up)")
    epsilon: float | None = Field(None, ge=0, le=1, description="fixed exploration rate (unset: Ape-X lease)")
    epsilon_base: float = Field(0.4, gt=0, lt=1, description="Ape-X base: eps_i = base^(1 + alpha*i/(N-1))")
    epsilon_alpha: float = Field(7.0, ge=0, description="Ape-X alpha")
    eval_envs: int = Field(0, ge=0, le=1, description="one extra greedy env whose returns are reported, not sent")
    clip_interval_s: float = Field(0.0, ge=0, le=86_400, description="film one greedy episode this often and "
                                   "send it to the gateway's live page (0: never; flywheel run: actor-0 only)")
    clip_max_steps: int = Field(1000, ge=10, le=100_000, description="agent steps a filmed episode is cut at")
    send_batch: int = Field(0, ge=0, le=65536,
                            description="transitions per message (0: whole vector steps up to 256 rows or 256 KiB)")
    on_full: Literal["block", "drop"] = Field("block", description="at the replay high-water mark: block or drop")
    send_hwm: int = Field(16, ge=1, description="send high-water mark, in messages")
    send_stall_s: float = Field(30.0, ge=0, le=3600, description="reconnect to replay after a blocked send of this "
                                "long while the learner publishes new weights meanwhile (0: never)")
    send_buffer_kb: int = Field(0, ge=0, le=1 << 20, description="kernel send buffer of the transitions socket, "
                                "KiB (0: the OS default; TCP then holds a few MiB in flight beyond send_hwm)")
    transitions_endpoint: str = Field("tcp://127.0.0.1:5555", description="replay PULL endpoint")
    weights_endpoint: str = Field("tcp://127.0.0.1:5557", description="learner weights PUB endpoint")
    lease_endpoint: str = Field("tcp://127.0.0.1:5560", description="gateway lease ROUTER endpoint")
    weights_interval_s: float = Field(0.0, ge=0, le=3600, description="load new weights at most this often "
                                      "(0: as soon as they arrive; newer ones replace waiting ones)")
    first_weights_wait_s: float = Field(0.0, ge=0, le=3600, description="before the first step, wait up to this "
                                        "long for the learner's first weights, so a seeded run's first transitions "
                                        "come from the learner's seeded network (0: act at once with the actor's "
                                        "own; flywheel run: 60)")
    max_version_jump: int = Field(10**8, ge=1, le=1 << 62, description="weights more versions than this ahead of "
                                  "the newest of the same learner run are refused (a rogue publisher's); the learner "
                                  "adds 1 a publish, so this is days of publishing every update, and a learner's new "
                                  "run is taken whatever its version")
    start_state_share: float = Field(0.0, ge=0, le=1, description="share of training episodes started from a "
                                     "state the agent reached near its frontier (0: off; envs that can save state: "
                                     "single-stage Mario, Atari); evaluation always starts at the level start")
    start_state_margin: float = Field(100.0, ge=0, le=1e9, allow_inf_nan=False, description="start states are "
                                      "kept where an episode passes the frontier minus this much progress (Mario: "
                                      "x pixels; Atari: agent steps into the game)")
    start_state_window: int = Field(20, ge=1, le=100_000, description="the frontier is the furthest progress of "
                                    "each env's last this many episodes")
    start_state_pool: int = Field(8, ge=1, le=1024, description="start states each env keeps at most (the least "
                                  "advanced replaced first; Mario's emulator keeps 1)")
    start_state_choice: Literal["frontier", "uniform", "ends"] = Field(
        "frontier", description="where an episode's state is kept: frontier (where it passes the frontier minus "
        "start_state_margin), uniform (where it passes a point drawn uniformly between the level start and the "
        "frontier) or ends (start_state_margin before where one of the last start_state_window episodes ended, "
        "drawn uniformly)")
    max_env_steps: int = Field(0, ge=0, description="stop after this many env steps (0: run until stopped)")

    @model_validator(mode="after")
    def _n_step_schedule_is_whole(self) -> ActorSettings:
        if (self.n_step_final > 0) != (self.n_step_anneal_steps > 0):
            raise ValueError("an annealed n-step needs both n_step_final > 0 and n_step_anneal_steps > 0 "
                             f"(got n_step_final={self.n_step_final}, n_step_anneal_steps={self.n_step_anneal_steps})")
        return self

    def n_step_schedule(self) -> NStepSchedule:
        """n of the n-step returns over this actor's env steps: fixed, or annealed."""
        from .nstep import NStepSchedule

        if self.n_step_final == 0:
            return NStepSchedule(self.n_step)
        return NStepSchedule(self.n_step, self.n_step_final, self.n_step_anneal_steps)

    def start_states(self) -> StartStateConfig | None:
        """The start-state curriculum these settings ask for (None: off)."""
        from flywheel.envs.start_states import StartStateConfig

        if self.start_state_share <= 0:
            return None
        return StartStateConfig(self.start_state_share, self.start_state_margin, self.start_state_window,
                                self.start_state_pool, self.start_state_choice)
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="seed of the envs (slot i: seed + i), the "
                             "exploration draws and the acting network's initial weights (unset: random; flywheel "
                             "run derives one per actor from --seed)")
