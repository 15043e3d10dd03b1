"""``rollout_groups``: episode-synchronous collection of GRPO groups on one EnvShard.

Rows ``[g*G, (g+1)*G)`` form group ``g``. Each call (one "round") resets every row; all members
of a group reset from the same seed ``derive_seed(shard.seed, 6, g, round)``, so they start from
the same state (checked: the members' initial observations must be equal). Every member then
plays one episode with the sampled policy until it finishes; a row that finished early keeps
being stepped by the batched env (its auto-reset episode is ignored) but is masked
(``chunk.mask`` False, zero reward, no flags), so it contributes no transitions. Collection stops
as soon as every row has finished, or after ``max_steps`` steps (then the running episodes are
cut: their return so far is their return, see ``raysim.algos.grpo``).

The chunk has ``T`` = steps actually taken. ``chunk.episodes`` holds one record per row (``N``
records, in row order): ``return`` and ``length`` of the row's episode (summed over its unmasked
steps), ``row``, ``group``, ``t`` (the step it finished at, or ``T-1`` when cut), ``finished``
(False when cut by ``max_steps``).

With ``on_nonfinite: mask`` a row whose env returns a non-finite value is dropped from the round:
all of its transitions are masked (it trains on nothing) and its record has ``finished`` False;
its return so far still enters its group's mean and std.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from raysim.rollout.chunk import RolloutChunk
from raysim.rollout.inference import inference
from raysim.seeding import derive_seed

if TYPE_CHECKING:
    from raysim.rollout.shard import EnvShard


class GroupResetError(RuntimeError):
    """The env cannot start the members of a group from the same state."""


def group_reset(shard: EnvShard, group_size: int, round_index: int) -> dict[str, torch.Tensor]:
    """Reset every row, group members from one shared seed; check their observations are equal."""
    env, N, G = shard.env, shard.env.num_envs, int(group_size)
    if G < 2 or N % G:
        raise ValueError(f"group_size must be >= 2 and divide num_envs ({N}), got {G}")
    if not getattr(env, "seeded_reset", True):
        raise GroupResetError(
            f"{shard.env_id} does not guarantee equal initial states for equal reset seeds "
            "(seeded_reset is False), so GRPO groups cannot share a start; use PPO for this env."
        )
    seeds = [derive_seed(shard.seed, 6, row // G, round_index) for row in range(N)]
    obs = env.reset_rows(torch.arange(N), seeds)
    for name, value in obs.items():
        grouped = value.reshape(N // G, G, -1)
        same = (grouped == grouped[:, :1]).all(-1).all(-1)
        if not bool(same.all()):
            g = int((~same).nonzero()[0])
            raise GroupResetError(
                f"{shard.env_id}: the members of group {g} (rows {g * G}..{g * G + G - 1}) reset with the same "
                f"seed but got different '{name}' observations; the env does not honour reset seeds, so "
                "GRPO cannot be used with it."
            )
    return {k: v.clone() for k, v in obs.items()}


def rollout_groups(shard: EnvShard, weights: dict, max_steps: int, group_size: int) -> RolloutChunk:
    """One episode per row from its group's shared start; stops when all rows finished or at ``max_steps``."""
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    shard.set_weights(weights)
    env, N = shard.env, shard.env.num_envs
    current = group_reset(shard, group_size, shard._group_rounds)
    shard._group_rounds += 1
    active = torch.ones(N, dtype=torch.bool)
    episode_return = torch.zeros(N)
    episode_length = torch.zeros(N, dtype=torch.int64)
    finished_at = torch.full((N,), -1, dtype=torch.int64)
    obs_steps: list[dict[str, torch.Tensor]] = []
    actions, logps, rewards, terms, truncs, masks = [], [], [], [], [], []
    final_obs: list[dict[str, torch.Tensor]] = []
    final_t, final_row = [], []
    nonfinite = 0
    with inference(shard.actor):
        for t in range(int(max_steps)):
            if not bool(active.any()):
                break
            obs_steps.append({k: v.clone() for k, v in current.items()})
            action, logp = shard.actor.sample(current["policy"], shard.generator)
            step = env.step(shard.actor.env_action(action))
            mask_t = active.clone()
            if step.valid is not None:
                mask_t &= step.valid
            bad_before = mask_t.clone()
            nonfinite += shard._check_finite(step, t, bad_before)  # raises, or masks (and restarts) bad rows
            dropped = mask_t & ~bad_before
            if bool(dropped.any()):
                for m in masks:
                    m[dropped] = False
                mask_t &= ~dropped
                active &= ~dropped
            reward = torch.where(mask_t, step.reward, 0.0)
            done = torch.zeros(N, dtype=torch.bool)
            done[step.done_rows] = True
            ending = done & mask_t
            if bool(ending.any()):
                keep = mask_t[step.done_rows]
                final_obs.append({k: v[keep].clone() for k, v in step.final_obs.items()})
                final_row.append(step.done_rows[keep].clone())
                final_t.append(torch.full((int(keep.sum()),), t, dtype=torch.int64))
            actions.append(action)
            logps.append(logp)
            rewards.append(reward)
            terms.append(step.terminated & mask_t)
            truncs.append(step.truncated & mask_t)
            masks.append(mask_t)
            episode_return += reward
            episode_length += mask_t.long()
            finished_at[ending] = t
            active &= ~ending
            current = step.obs
            shard.steps_done += 1
    T = len(rewards)
    obs = {k: torch.stack([o[k] for o in obs_steps] + [current[k].clone()]) for k in current}
    finished = finished_at >= 0
    G = int(group_size)
    episodes = {
        "return": episode_return,
        "length": episode_length,
        "row": torch.arange(N),
        "group": torch.arange(N) // G,
        "t": torch.where(finished, finished_at, T - 1),
        "finished": finished,
    }
    shard.obs = current
    empty = {k: v.new_empty((0, *v.shape[2:])) for k, v in obs.items()}
    return RolloutChunk(
        obs=obs,
        actions=torch.stack(actions),
        logp=torch.stack(logps),
        reward=torch.stack(rewards),
        terminated=torch.stack(terms),
        truncated=torch.stack(truncs),
        mask=torch.stack(masks),
        final_obs={k: torch.cat([f[k] for f in final_obs]) for k in obs} if final_obs else empty,
        final_t=torch.cat(final_t) if final_t else torch.empty(0, dtype=torch.int64),
        final_row=torch.cat(final_row) if final_row else torch.empty(0, dtype=torch.int64),
        episodes=episodes,
        policy_version=shard.version,
        shard=shard.shard_index,
        nonfinite=nonfinite,
    )
