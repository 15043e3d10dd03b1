"""The Atari preset: ``gym:<Atari id>`` with ``env.kwargs.atari``, stepped by ale-py's vector env; games are episodes.

``make("gym:BreakoutNoFrameskip-v4", N, atari={})`` builds N rows of ale-py's ``AtariVectorEnv`` (C++,
preprocessing built in, no per-row Python) with the standard preprocessing of DQN, CleanRL's
``ppo_atari.py`` and SB3's ``AtariWrapper``: up to 30 random no-ops and FIRE when a game starts, an
action repeated for 4 frames with the observation the max over the last two, 84x84 grayscale, the last 4
frames stacked (``uint8 [4, 84, 84]``, the ``policy`` group: the Nature CNN reads it). The id says the
game, its action set, its frame limit and its sticky actions: ``BreakoutNoFrameskip-v4`` none (CleanRL's
env), ``ALE/Breakout-v5`` 0.25 (Machado et al. 2018); the preset's frame skip replaces the id's.

Games, not lives. In training (``evaluation`` False) two options shape what the learner sees:

- ``episodic_life``: a lost life ends the row's trajectory: ``terminated`` (no bootstrap: the DQN rule that
  CleanRL's ``EpisodicLifeEnv`` keeps), the row in ``done_rows`` with its ``final_obs``, but the game goes
  on and no episode is reported (``Step.episode_rows`` leaves the row out);
- ``clip_rewards``: the rewards are their sign.

An episode is a whole game: its report (``return``: the raw game score, all lives, unclipped; ``length``:
agent steps) comes when the game is over or its frame limit cuts it (``truncated``: bootstrap). Evaluation
(``evaluation`` True) plays whole games with raw rewards: no episodic life, no clipping; but where the policy
was trained with ``episodic_life``, a lost life still starts the row's next trajectory (``Step.start_rows``: a
recurrent state restarts there, as it did in training; the game goes on and no done is reported).

``fire_reset`` presses FIRE for the policy when a game starts and on a row's next step after a lost life (as
CleanRL's and SB3's wrapper order does; ale-py's vector env has no such option): that step's action is
the env's, so it is reported invalid (``Step.valid`` False: not trained on, not counted in the game's
length; its raw reward still counts in the score), in training and evaluation alike.

Pictures for videos (``frames``) are what the policy sees: each row's newest 84x84 grayscale frame, enlarged
(ale-py's vector env keeps no color screens); a ``render_mode`` option is accepted and changes nothing.

Seeds: ``reset(seed)`` starts row i from seed ``seed + i``, ``reset_rows`` each row from its own (reduced
below 2**31, ALE's range); equal seeds give equal games. The emulator's state is not saved (``get_state``
None): a resumed run starts new games.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from raysim.envs.contract import BatchedEnv, Obs, Step, check_actions, check_num_envs
from raysim.envs.errors import EnvOptionError, MissingDependencyError, UnknownEnvError
from raysim.schema import setting, violations

#: What the ``atari`` extra installs (the message of a missing ale-py names it).
INSTALL = 'pip install "raysim[atari]"'
#: Options of an Atari id's registration that the preset honours (as ``env.kwargs`` beside ``atari``).
ALE_OPTIONS = ("repeat_action_probability", "full_action_space", "max_num_frames_per_episode")
#: Preset options that say how the env runs, not what it is (left out of the env identity).
RUNTIME_PRESET_OPTIONS = ("threads",)
SEED_RANGE = 2**31 - 1  # ALE seeds are non-negative 32-bit ints


@dataclass
class AtariPreset:
    """``env.kwargs.atari``: the standard Atari preprocessing (``{}`` or ``true``: every default)."""

    noop_max: int = setting(30, help="a game starts with up to noop_max random no-ops (FIRE counts as one)", low=0)
    frame_skip: int = setting(
        4, help="frames each action is repeated; the observation is the max of the last two", low=1
    )
    frame_stack: int = setting(
        4, help="frames per observation, oldest first (the policy group is [k, size, size])", low=1
    )
    screen_size: int = setting(84, help="frames are resized to size x size grayscale", low=8, high=210)
    fire_reset: bool = setting(
        True, help="press FIRE for the policy when a game starts and after a lost life (a step not trained on)"
    )
    episodic_life: bool = setting(
        True, help="training only: a lost life ends the trajectory (terminated), not the game (no episode report)"
    )
    clip_rewards: bool = setting(True, help="training only: rewards become their sign; episode returns stay raw")
    threads: int = setting(
        1, help="ale-py's C++ threads stepping the rows (runtime: not part of the env identity)", low=1
    )


def atari_preset(value: Any) -> AtariPreset:
    """``env.kwargs.atari`` checked: ``true`` or a mapping of ``AtariPreset`` options (``EnvOptionError`` naming
    the key, with the closest valid one, for a wrong key, type or value)."""
    if value is True or value is None:
        value = {}
    if not isinstance(value, dict):
        raise EnvOptionError(f"must be a mapping of preset options ({{}} for the defaults), got {value!r}", "atari")
    valid = {f.name: f for f in fields(AtariPreset)}
    for key, option in value.items():
        if key not in valid:
            close = difflib.get_close_matches(str(key), list(valid), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"its options: {sorted(valid)}"
            raise EnvOptionError(f"the Atari preset has no option {key!r}; {hint}", f"atari.{key}")
        kind = type(valid[key].default)
        if type(option) is not kind:
            raise EnvOptionError(f"must be {kind.__name__}, got {option!r}", f"atari.{key}")
    preset = AtariPreset(**value)
    problems = violations(preset)
    if problems:
        key, _, why = problems[0].partition(" ")
        raise EnvOptionError(why, f"atari.{key}")
    if preset.frame_stack > preset.screen_size:  # [k, size, size] would read as channels last (raysim.envs.spaces)
        raise EnvOptionError(
            f"{preset.frame_stack} frames of {preset.screen_size}x{preset.screen_size} would read as another channel "
            "order (more frames than height or width): stack at most screen_size frames",
            "atari.frame_stack",
        )
    return preset


def canonical_preset(value: Any) -> dict[str, Any]:
    """The preset as the env identity sees it: every option filled in, the runtime ones left out."""
    preset = vars(atari_preset(value))
    return {k: v for k, v in preset.items() if k not in RUNTIME_PRESET_OPTIONS}


def ale_settings(gym_id: str, options: dict[str, Any]) -> dict[str, Any]:
    """What the Atari id registers (game, sticky actions, action set, frame limit), ``options`` replacing it."""
    if gym_id not in gym.registry:
        raise UnknownEnvError(f"unknown Atari id {gym_id!r}; e.g. BreakoutNoFrameskip-v4 or ALE/Breakout-v5")
    spec = gym.spec(gym_id)
    if not str(spec.entry_point).startswith("ale_py"):
        raise ValueError(f"gym:{gym_id} is not an Atari id (ale_py); the atari preset is for Atari games")
    for key in options:
        if key not in ALE_OPTIONS:
            raise EnvOptionError(f"gym:{gym_id} with the atari preset takes only {list(ALE_OPTIONS)} beside it", key)
    if spec.kwargs.get("frameskip", 1) not in (1, 4):
        raise ValueError(
            f"gym:{gym_id} skips a random number of frames; use {spec.kwargs['game'].title()}NoFrameskip-v4 "
            f"(no sticky actions) or ALE/{spec.kwargs['game'].title()}-v5 (sticky actions 0.25) with the atari preset"
        )
    return {"game": spec.kwargs["game"], **{k: spec.kwargs[k] for k in ALE_OPTIONS if k in spec.kwargs}, **options}


def import_ale(env_id: str) -> Any:
    """ale-py, its ids registered with Gymnasium; a ``MissingDependencyError`` naming the extra when it is missing."""
    try:
        import ale_py
    except ImportError as error:
        raise MissingDependencyError(
            f"{env_id}: the atari preset needs ale-py, which is not installed: {INSTALL}"
        ) from error
    gym.register_envs(ale_py)
    return ale_py


def vector_env(settings: dict[str, Any], preset: AtariPreset, num_envs: int) -> gym.vector.VectorEnv:
    """ale-py's ``AtariVectorEnv``: same-step resets of whole games, raw rewards, no life-loss signal (kept here)."""
    from ale_py.vector_env import AtariVectorEnv

    settings = dict(settings)
    return AtariVectorEnv(
        settings.pop("game"),
        num_envs,
        num_threads=preset.threads,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        img_height=preset.screen_size,
        img_width=preset.screen_size,
        grayscale=True,
        stack_num=preset.frame_stack,
        frameskip=preset.frame_skip,
        maxpool=True,
        noop_max=preset.noop_max,
        use_fire_reset=preset.fire_reset,
        episodic_life=False,
        life_loss_info=False,
        reward_clipping=False,
        **settings,
    )


def fire_action(vec: gym.vector.VectorEnv, preset: AtariPreset) -> int:
    """The index of FIRE in the game's action set when the preset presses it for the policy, else -1."""
    from ale_py import Action

    actions = list(vec.ale.get_action_set())
    return actions.index(Action.FIRE) if preset.fire_reset and Action.FIRE in actions else -1


class AtariEnv(BatchedEnv):
    """``gym:<Atari id>`` with the preset (see the module): N rows of whole games, lives as training dones."""

    def __init__(self, gym_id: str, num_envs: int, seed: int | None = None, evaluation: bool = False, **options: Any):
        self.env_id = f"gym:{gym_id}"
        self.num_envs = check_num_envs(num_envs)
        self.preset = atari_preset(options.pop("atari", None))
        options.pop("render_mode", None)  # a filmed evaluation asks for pictures: ``frames`` draws them here
        import_ale(self.env_id)
        settings = ale_settings(gym_id, options)
        self.vec = vector_env(settings, self.preset, self.num_envs)
        self.episodic_life = self.preset.episodic_life and not evaluation
        self.clip_rewards = self.preset.clip_rewards and not evaluation
        self.action_space = self.vec.single_action_space
        self.observation_spaces = {"policy": self.vec.single_observation_space}
        self.max_episode_steps = math.ceil(settings.get("max_num_frames_per_episode", 108_000) / self.preset.frame_skip)
        self.defines_success = False
        self.game_return = np.zeros(self.num_envs, dtype=np.float32)  # raw score of each row's running game
        self.game_length = np.zeros(self.num_envs, dtype=np.int64)
        self.lives = np.zeros(self.num_envs, dtype=np.int64)
        self.fire_action = fire_action(self.vec, self.preset)
        self.fire_next = np.zeros(self.num_envs, dtype=bool)
        self._obs: Obs = {}
        self.reset(seed)

    def reset(self, seed: int | None = None) -> Obs:
        first = None if seed is None else int(seed) % (SEED_RANGE - self.num_envs)
        obs, info = self.vec.reset(seed=first)
        self.game_return[:], self.game_length[:], self.lives[:] = 0.0, 0, info["lives"]
        self.fire_next[:] = False
        self._obs = {"policy": torch.from_numpy(np.array(obs))}
        return self._obs

    def reset_rows(self, rows: torch.Tensor, seeds: Sequence[int]) -> Obs:
        by_row = dict(zip(torch.as_tensor(rows).reshape(-1).tolist(), seeds, strict=True))
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[list(by_row)] = True
        row_seeds = np.array([int(by_row[r]) % SEED_RANGE for r in np.flatnonzero(mask)], dtype=np.int64)
        obs, info = self.vec.reset(seed=row_seeds, options={"reset_mask": mask})
        self.game_return[mask], self.game_length[mask], self.lives[mask] = 0.0, 0, info["lives"][mask]
        self.fire_next[mask] = False
        self._obs = {"policy": torch.from_numpy(np.array(obs))}
        return self._obs

    def step(self, actions: torch.Tensor) -> Step:
        check_actions(self, actions)
        fire = self.fire_next  # rows that lost a life last step: FIRE launches their next one (not trained on)
        chosen = np.where(fire, self.fire_action, actions.cpu().numpy().astype(np.int64))
        obs, raw, game_over, truncated, info = self.vec.step(chosen)
        raw = np.asarray(raw, dtype=np.float32)
        game_over, truncated = np.asarray(game_over, bool), np.asarray(truncated, bool)
        ended = game_over | truncated  # the vector env started these rows' next games in this step
        lives = np.asarray(info["lives"], dtype=np.int64)
        lost = ~ended & (lives < self.lives)
        self.lives = lives
        self.fire_next = lost & (self.fire_action >= 0)
        self.game_return += raw
        self.game_length += ~fire
        terminated = game_over | (lost & self.episodic_life)
        done_rows = np.flatnonzero(terminated | truncated)
        # the policy's trajectories restart at every life it was trained on, in evaluation too
        start_rows = np.flatnonzero(ended | (lost & self.preset.episodic_life))
        self._obs = {"policy": torch.from_numpy(np.array(obs))}
        final_obs, episodes, episode_rows = self._finished(done_rows, ended, info)
        reward = np.sign(raw) if self.clip_rewards else raw
        return Step(
            obs=self._obs,
            reward=torch.from_numpy(reward * ~fire),
            terminated=torch.from_numpy(terminated),
            truncated=torch.from_numpy(truncated),
            done_rows=torch.from_numpy(done_rows),
            final_obs=final_obs,
            episodes=episodes,
            valid=torch.from_numpy(~fire) if fire.any() else None,
            episode_rows=None if episode_rows.size == done_rows.size else torch.from_numpy(episode_rows),
            start_rows=None if start_rows.size == done_rows.size else torch.from_numpy(start_rows),
        )

    def _finished(self, done_rows: np.ndarray, ended: np.ndarray, info: dict) -> tuple[Obs, dict, np.ndarray]:
        """The done rows' final observations, the ended games' reports (their rows' bookkeeping restarted), and
        those games' rows: a game's last frames come from the vector env; a lost life goes on from the current."""
        final_obs: Obs = {}
        episodes: dict[str, torch.Tensor] = {}
        if done_rows.size:
            obs = self._obs["policy"].numpy()
            final = np.where(ended[done_rows, None, None, None], info.get("final_obs", obs)[done_rows], obs[done_rows])
            final_obs = {"policy": torch.from_numpy(final)}
        episode_rows = np.flatnonzero(ended)
        if episode_rows.size:
            episodes = {
                "return": torch.from_numpy(self.game_return[episode_rows].copy()),
                "length": torch.from_numpy(self.game_length[episode_rows].copy()),
            }
            self.game_return[episode_rows], self.game_length[episode_rows] = 0.0, 0
        return final_obs, episodes, episode_rows

    def frames(self, size: int) -> torch.Tensor:
        """Pictures of the rows for videos, ``[N, size, size, 3]`` uint8: what the policy sees, each row's newest
        frame (grayscale, enlarged by repeating pixels), as ale-py's vector env gives no color screens."""
        newest = self._obs["policy"][:, -1:].float()
        picture = torch.nn.functional.interpolate(newest, size=(size, size), mode="nearest").to(torch.uint8)
        return picture.expand(-1, 3, -1, -1).permute(0, 2, 3, 1).contiguous()

    def close(self) -> None:
        self.vec.close()
