"""Actor settings: FLYWHEEL_ACTOR_* variables or the same-named flags."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flywheel.netspec import NetworkSpec
from flywheel.presets import DEFAULT_ENV
from flywheel.settings import CommonSettings

if TYPE_CHECKING:
    from flywheel.envs.start_states import StartStateConfig


class ActorSettings(CommonSettings, NetworkSpec):
    """Environments, exploration, n-step returns and the sockets of one actor process; the acting network is
    NetworkSpec's fields (dueling, hidden, head, num_quantiles, c51_atoms), the learner's."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_ACTOR_", extra="forbid", validate_default=True,
                                      env_ignore_empty=True)

    join: str = Field("", max_length=2048, description="URL of a run's gateway (http://HOST:PORT) started with "
                      "flywheel run --listen: its env id, preset (or a preset file's values) and endpoints, below "
                      "these flags and FLYWHEEL_ACTOR_* variables; needs this host's CURVE keys (--curve-keys-dir), "
                      "never the document's (flywheel/launch/remote.py)")
    env_id: str = Field(DEFAULT_ENV, description="environment id, options after '?' (e.g. "
                        "ALE/Pong-v5?clip_rewards=false; docs/ENVIRONMENTS.md)")
    num_envs: int = Field(8, ge=1, le=4096, description="env slots stepped as one vector (MettaGrid: agents)")
    vector_mode: Literal["inprocess", "subprocess"] = Field(
        "inprocess", description="step envs in this process, or in worker processes over shared memory "
        "(double-buffered: inference overlaps stepping)")
    workers: int = Field(0, ge=0, le=256, description="worker processes in subprocess mode (0: the usable cores)")
    n_step: int = Field(3, ge=1, le=100, description="steps in each n-step return")
    cut_at_exploration: bool = Field(False, description="end a slot's n-step returns before each exploratory "
                                     "(random) action and bootstrap there, so no return runs through one (Watkins's "
                                     "Q(lambda) cut; off: returns run through them uncorrected, as in Ape-X)")
    episode_noops_max: int = Field(0, ge=0, le=1000, description="each training episode starts with 0 to this "
                                   "many actions 0 (the no-op of every built-in action set), drawn per episode, as "
                                   "the evaluation's episodes do (learner.best_eval_noop_max, flywheel evaluate); "
                                   "0: none (Atari envs have their own noop_max option)")
    gamma: float = Field(0.99, gt=0, le=1, description="discount factor")
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
                                     "state the agent reached near its frontier (0: off; envs that can save and "
                                     "restore their state, docs/ENVIRONMENTS.md); evaluation always starts at the "
                                     "level start")
    start_state_margin: float = Field(100.0, ge=0, le=1e9, allow_inf_nan=False, description="start states are "
                                      "kept where an episode passes the frontier minus this much progress (in the "
                                      "env's own progress measure)")
    start_state_window: int = Field(20, ge=1, le=100_000, description="the frontier is the furthest progress of "
                                    "each env's last this many episodes")
    start_state_pool: int = Field(8, ge=1, le=1024, description="start states each env keeps at most (the least "
                                  "advanced replaced first; an env may keep fewer)")
    start_state_choice: Literal["frontier", "deaths"] = Field(
        "frontier", description="where states are kept: start_state_margin before the frontier, or (deaths) "
        "before a point drawn per episode from where this actor's level-start episodes of slots exploring at no "
        "more than start_state_death_epsilon ended short of the goal (envs with a progress measure only)")
    start_state_death_epsilon: float = Field(0.1, ge=0, le=1, description="deaths: the episodes counted are those "
                                             "of slots exploring at no more than this")
    checkpoint_dir: str | None = Field(None, max_length=4096, description="folder of this actor's start-state "
                                       "pools (each env slot's kept states, written as <instance>-env<slot>.npz; "
                                       "unset: none; flywheel run: CHECKPOINT_DIR/actors)")
    checkpoint_interval_s: float = Field(600.0, gt=0, le=86_400, description="seconds between writes of the "
                                         "start-state pools (also written at stop; flywheel run: the learner's)")
    resume: bool = Field(False, description="read the start-state pools in checkpoint_dir at start (a file missing "
                         "or faulty: that env slot starts with an empty pool)")
    max_env_steps: int = Field(0, ge=0, description="stop after this many env steps (0: run until stopped)")
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="seed of the envs (slot i: seed + i), the "
                             "exploration draws and the acting network's initial weights (unset: random; flywheel "
                             "run derives one per actor from --seed)")

    def start_states(self) -> StartStateConfig | None:
        """The start-state curriculum these settings ask for (None: off)."""
        from flywheel.envs.start_states import StartStateConfig

        if self.start_state_share <= 0:
            return None
        return StartStateConfig(self.start_state_share, self.start_state_margin, self.start_state_window,
                                self.start_state_pool, self.start_state_choice, self.start_state_death_epsilon)
