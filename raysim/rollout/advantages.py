"""Values, terminal-value bootstrap and GAE for one rollout chunk (learner side).

The next-state value of step ``t``, row ``n`` (docs/concepts.md, "Bootstrap rules"):

- ``V(obs[t+1])`` if the row did not finish at ``t``;
- ``V(final_obs)`` if it was truncated and not terminated (the episode was cut, not ended);
- ``0`` if it was terminated (also when truncated in the same step).

GAE cuts the lambda-trace at every episode end and at masked transitions; the reward is never
modified. With a recurrent core (``model.recurrent``) the critic reads the core's output at every
observation (``sequence_values``): as the acting shard computed it, when the learner's weights are the
ones that acted, else replayed from the rows' stored states; a truncated row's terminal value is
computed with the state its episode reached, not the next episode's reset one.
"""

from __future__ import annotations

import torch

from raysim.models import ActorCritic, Critic, MLPInference
from raysim.rollout.chunk import RolloutChunk
from raysim.rollout.inference import inference


def terminal_values(
    critic: Critic, chunk: RolloutChunk, final_state: torch.Tensor | None = None, model: ActorCritic | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(t, row, V(final_obs))`` for the eligible rows only: truncated and not terminated.

    One forward pass over the eligible rows' compact final_obs; none when no row is eligible. A recurrent
    ``model``'s core reads each final observation from ``final_state`` [K, S], the state after the row's last
    observation of that episode (``sequence_values``).
    """
    t, row = chunk.final_t, chunk.final_row
    eligible = (chunk.truncated[t, row] & ~chunk.terminated[t, row]).nonzero().squeeze(1)
    if eligible.numel() == 0:
        return t[:0], row[:0], torch.zeros(0, device=t.device)  # on the chunk's device, like the values
    final_obs = {k: v.index_select(0, eligible) for k, v in chunk.final_obs.items()}
    t, row = t[eligible], row[eligible]
    with inference(critic if model is None else model):
        if model is None:
            values = critic(final_obs)
        else:
            memory, _ = model.actor.core(model.actor.features(final_obs), final_state.index_select(0, eligible))
            values = critic(final_obs, memory=memory)
    return t, row, values


#: Rows per block of ``critic_values``: a block's activations stay in cache (see benchmarks/README.md).
VALUE_BLOCK = 4096


def critic_values(critic: Critic, obs: dict[str, torch.Tensor], memory: torch.Tensor | None = None) -> torch.Tensor:
    """``critic(obs, memory=memory)`` [B] for a flat batch, bitwise; in blocks through ``MLPInference`` when it can.

    Every block has at least ``VALUE_BLOCK`` rows (the remainder joins the last block): blocks
    that large use the same matmul kernel, and so the same per-row arithmetic, as one forward on
    all rows (tests/test_fast_path.py checks it; a block of a few rows may take another kernel).
    Critics that are not a plain ``Critic`` MLP of vector groups (e.g. with BatchNorm or a CNN) run their own
    forward. ``memory``: a recurrent core's output [B, size], read first (``Critic.forward``). Call it under
    ``inference``.
    """
    plain = isinstance(critic, Critic) and not critic.image_groups and MLPInference.supports(critic.net)
    if not plain or (memory is None) != (critic.memory_size == 0):
        return critic(obs) if memory is None else critic(obs, memory=memory)
    if memory is None:  # the critic's input normalization in the fused net (model.obs_norm)
        x, net = critic.vector_input(obs), MLPInference(critic.net, critic.obs_norm)
    else:
        x, net = torch.cat([memory, critic.features(obs)], 1), MLPInference(critic.net)
    values = x.new_empty(x.shape[0], 1)
    starts = list(range(0, x.shape[0], VALUE_BLOCK))
    if len(starts) > 1 and x.shape[0] - starts[-1] < VALUE_BLOCK:
        starts.pop()  # no small last block: the matmul kernel for a few rows may round differently
    for start, end in zip(starts, [*starts[1:], x.shape[0]], strict=True):
        net(x[start:end], out=values[start:end])
    return values.squeeze(-1)


def chunk_values(critic: Critic, chunk: RolloutChunk) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values [T, N], next_values [T, N])`` of a chunk, by the next-state value rule.

    The critic sees all T+1 observations (``critic_values``: blocks, same values as one batch),
    then the eligible final_obs in one more batch.
    """
    T, N = chunk.num_steps, chunk.num_envs
    obs = {k: v.flatten(0, 1) for k, v in chunk.obs.items()}
    with inference(critic):
        all_values = critic_values(critic, obs).reshape(T + 1, N)
    next_values = all_values[1:].clone()
    next_values[chunk.terminated | chunk.truncated] = 0.0
    t, row, values = terminal_values(critic, chunk)
    next_values[t, row] = values
    return all_values[:T], next_values


def sequence_values(model: ActorCritic, chunk: RolloutChunk, acted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``chunk_values`` of a recurrent model: the critic reads each observation beside the core's output there, and
    a truncated row's final observation is read from the state its episode reached (``terminal_values``).

    ``acted``: the model's actor is the one that acted the chunk (its policy version), so the outputs and final
    states the shard stored (``chunk.memory``, ``chunk.final_state``) are the model's; otherwise (or when the chunk
    has none) the core replays the rows' T+1 observations from ``chunk.state0``, zeroing a row's state where
    ``chunk.starts`` says its episode starts. The two agree within float32 rounding, not bitwise: the shard steps
    in place (``raysim.models.recurrent.CellInference``), the replay with the written-out cell.
    """
    T, N = chunk.num_steps, chunk.num_envs
    obs = {k: v.flatten(0, 1) for k, v in chunk.obs.items()}
    with inference(model):
        if acted and chunk.memory is not None:
            memory, final_state = chunk.memory.flatten(0, 1), chunk.final_state
        else:
            x = model.actor.features(obs).view(T + 1, N, -1)
            replayed, states = model.actor.core.replay(x, chunk.state0, chunk.starts)
            memory, final_state = replayed.flatten(0, 1), states[chunk.final_t, chunk.final_row]
        all_values = critic_values(model.critic, obs, memory).reshape(T + 1, N)
    next_values = all_values[1:].clone()
    next_values[chunk.terminated | chunk.truncated] = 0.0
    t, row, values = terminal_values(model.critic, chunk, final_state, model)
    next_values[t, row] = values
    return all_values[:T], next_values


def gae(
    reward: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    done: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Generalized advantage estimates [T, N]; the trace is cut where ``done`` or not ``mask``."""
    advantages = torch.zeros_like(reward)
    last = torch.zeros_like(reward[0])
    carry = gamma * lam * (~done).to(reward.dtype)
    for t in range(reward.shape[0] - 1, -1, -1):
        delta = reward[t] + gamma * next_values[t] - values[t]
        last = torch.where(mask[t], delta + carry[t] * last, 0.0)
        advantages[t] = last
    return advantages
