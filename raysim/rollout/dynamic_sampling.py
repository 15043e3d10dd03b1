"""Dynamic sampling (DAPO, Yu et al. 2025): GRPO rounds until a shard holds enough informative groups.

A group whose rows' returns are all equal (on a success reward: all succeeded, or all failed) gets zero
advantages and gives no policy gradient. With ``GroupEpisodes.keep_groups`` set, ``EnvShard.rollout``
plays rounds (each a ``GroupEnding`` from fresh group seeds: the round index advances) and keeps the
informative groups, the first ``keep_groups`` of them in round and group order; the others are dropped,
the informative ones of the last round beyond the count too. After ``max_rounds`` rounds it stops short
and fills the places left with the last round's uninformative groups (zero advantages, as plain GRPO
trains them; ``groups_filled`` counts them), so the chunk always holds exactly ``keep_groups`` groups::

    for round in range(max_rounds):
        chunk = play_round()                      # GroupEnding: one episode per row, shared group starts
        keep the informative groups, up to keep_groups held
        if keep_groups are held: stop
    fill the places left with the last round's uninformative groups
    return the kept groups' rows, stacked

The chunk holds the kept groups' rows, in round order, each round's steps padded to the longest with
masked steps. What was played and left out still counts: its valid transitions in ``env_steps``
(``dropped_steps``: the budget and the learning-rate schedule follow every step played) and its
episodes in ``episodes`` (with ``row``, ``group`` and ``t`` -1), since the episode statistics report
what the policy does, not what was trained on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from raysim.rollout.chunk import RolloutChunk
from raysim.rollout.endings import GroupEpisodes


def informative_groups(returns: torch.Tensor, group_size: int) -> torch.Tensor:
    """[groups] bool: the groups (rows ``[gG, (g+1)G)`` of ``returns`` [N]) whose returns are not all equal."""
    grouped = returns.reshape(-1, group_size)
    return ~(grouped == grouped[:, :1]).all(1)


def sample_groups(play_round: Callable[[], RolloutChunk], plan: GroupEpisodes) -> RolloutChunk:
    """Play rounds (``play_round``: one ``GroupEnding`` round's chunk) until ``plan.keep_groups`` informative groups
    are held, at most ``plan.max_rounds``; the chunk of exactly ``keep_groups`` groups (see the module)."""
    size, wanted = plan.group_size, int(plan.keep_groups)
    rounds: list[RolloutChunk] = []
    kept: list[torch.Tensor] = []  # the groups kept of each round, ascending
    held = 0
    while held < wanted and len(rounds) < plan.max_rounds:
        chunk = play_round()
        chosen = informative_groups(chunk.episodes["return"], size).nonzero().squeeze(1)[: wanted - held]
        rounds.append(chunk)
        kept.append(chosen)
        held += chosen.numel()
    filled = wanted - held
    if filled:  # the rounds ran out: the last round's uninformative groups take the places left
        spare = (~informative_groups(rounds[-1].episodes["return"], size)).nonzero().squeeze(1)[:filled]
        kept[-1] = torch.cat([kept[-1], spare]).sort().values
    return gather_groups(rounds, kept, size, filled)


def gather_groups(rounds: list[RolloutChunk], kept: list[torch.Tensor], group_size: int, filled: int) -> RolloutChunk:
    """One chunk of the rows of each round's ``kept`` groups (round order; steps padded to the longest, masked);
    the episodes of every round, those of the groups left out with ``row``, ``group`` and ``t`` -1."""
    rows = [(groups.unsqueeze(1) * group_size + torch.arange(group_size)).reshape(-1) for groups in kept]
    used = [(chunk, r) for chunk, r in zip(rounds, rows, strict=True) if r.numel()]  # the rounds with rows kept
    steps = max(chunk.num_steps for chunk, _ in used)
    where: list[torch.Tensor] = []  # each round's rows -> their row in the gathered chunk (-1: left out)
    offset = 0
    for chunk, r in zip(rounds, rows, strict=True):
        index = torch.full((chunk.num_envs,), -1, dtype=torch.int64)
        index[r] = torch.arange(r.numel()) + offset
        where.append(index)
        offset += r.numel()

    def stacked(part: Callable[[RolloutChunk], torch.Tensor], length: int) -> torch.Tensor:
        return torch.cat([padded(part(chunk)[:, r], length) for chunk, r in used], 1)

    finals = [index[chunk.final_row] >= 0 for chunk, index in zip(rounds, where, strict=True)]
    final_t = torch.cat([chunk.final_t[f] for chunk, f in zip(rounds, finals, strict=True)])
    final_row = torch.cat([index[c.final_row[f]] for c, index, f in zip(rounds, where, finals, strict=True)])
    order = torch.argsort(final_t * offset + final_row)  # by step, then row, as a chunk lists them
    final_obs = {
        g: torch.cat([c.final_obs[g][f] for c, f in zip(rounds, finals, strict=True) if g in c.final_obs])[order]
        for g in set().union(*(c.final_obs for c in rounds))
    }
    first = rounds[0]
    chunk = RolloutChunk(
        obs={g: stacked(lambda c, g=g: c.obs[g], steps + 1) for g in first.obs},
        actions=stacked(lambda c: c.actions, steps),
        logp=stacked(lambda c: c.logp, steps),
        reward=stacked(lambda c: c.reward, steps),
        terminated=stacked(lambda c: c.terminated, steps),
        truncated=stacked(lambda c: c.truncated, steps),
        mask=stacked(lambda c: c.mask, steps),
        final_obs=final_obs,
        final_t=final_t[order],
        final_row=final_row[order],
        episodes=played_episodes(rounds, where, group_size),
        policy_version=first.policy_version,
        shard=first.shard,
        nonfinite=sum(c.nonfinite for c in rounds),
        fresh=any(c.fresh for c in rounds),
        state0=None if first.state0 is None else torch.cat([c.state0[r] for c, r in used]),
        starts=None if first.starts is None else stacked(lambda c: c.starts, steps + 1),
        groups_played=sum(c.num_envs for c in rounds) // group_size,
        groups_dropped=sum(c.num_envs for c in rounds) // group_size - len(torch.cat(kept)),
        groups_filled=filled,
    )
    chunk.dropped_steps = sum(c.transitions for c in rounds) - chunk.transitions
    return chunk


def played_episodes(rounds: list[RolloutChunk], where: list[torch.Tensor], group_size: int) -> dict[str, torch.Tensor]:
    """Every round's episode records (``GroupEnding``'s, one per row), ``row`` as in the gathered chunk, and
    ``row``, ``group`` and ``t`` -1 for the rows left out of it (the columns every round has)."""
    keys = set.intersection(*(set(c.episodes) for c in rounds))
    parts = []
    for chunk, index in zip(rounds, where, strict=True):
        part = {k: chunk.episodes[k] for k in keys}
        row = index[part["row"]]
        part["row"] = row
        part["group"] = torch.where(row >= 0, row.div(group_size, rounding_mode="floor"), -1)
        part["t"] = torch.where(row >= 0, part["t"], -1)
        parts.append(part)
    return {k: torch.cat([p[k] for p in parts]) for k in sorted(keys)}


def padded(value: torch.Tensor, length: int) -> torch.Tensor:
    """``value`` [T, ...] with zero steps appended up to ``length`` (the gathered chunk masks them)."""
    if value.shape[0] == length:
        return value
    return torch.cat([value, value.new_zeros((length - value.shape[0], *value.shape[1:]))])
