"""``run_episodes``: play seeded evaluation episodes on the rows of one env, with per-row quotas.

Row ``r`` (global index ``row_offset + r``) plays its episodes one after another; episode ``k``
of that row starts from the reset seed ``derive_seed(seed, row_offset + r, k)``, so the records
do not depend on how rows are split over shards, nor on timing. A row's first ``quota[r]``
episodes count, in the order they started; later ones are discarded.
"""

from __future__ import annotations

from typing import Sequence

import torch

from raysim.algos.models import Actor
from raysim.envs.contract import BatchedEnv
from raysim.rollout.inference import inference
from raysim.seeding import derive_seed


def run_episodes(
    env: BatchedEnv,
    actor: Actor,
    quotas: Sequence[int],
    row_offset: int,
    seed: int,
    max_steps: int,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    stop_after: int | None = None,
) -> list[tuple[dict, dict]]:
    """``(record, report)`` per counted episode, in the order they finished.

    ``record`` holds scalars: row, episode index, seed, finishing step, terminated, truncated and
    the env's report fields; ``report`` is the env-owned episode report as the env gave it.
    ``max_steps`` bounds the batched steps: episodes unfinished by then are not recorded.
    ``stop_after`` ends the run once that many episodes were counted ("first n to finish").
    """
    if len(quotas) != env.num_envs:
        raise ValueError(f"{len(quotas)} quotas for {env.num_envs} rows")
    started = torch.zeros(env.num_envs, dtype=torch.int64)  # index of each row's running episode
    quota = torch.as_tensor(list(quotas), dtype=torch.int64)
    obs = env.reset_rows(torch.arange(env.num_envs), [derive_seed(seed, row_offset + r, 0) for r in range(env.num_envs)])
    results: list[tuple[dict, dict]] = []
    with inference(actor):
        for step_index in range(max_steps):
            if bool((started >= quota).all()) or (stop_after is not None and len(results) >= stop_after):
                break
            if deterministic:
                action = actor.deterministic(obs["policy"])
            else:
                action, _ = actor.sample(obs["policy"], generator)
            step = env.step(actor.env_action(action))
            obs = step.obs
            if step.done_rows.numel() == 0:
                continue
            columns = {k: v.tolist() for k, v in step.episodes.items()}
            done = step.done_rows.tolist()
            for i, r in enumerate(done):
                k = int(started[r])
                if k >= quota[r]:
                    continue
                report = {name: values[i] for name, values in columns.items()}
                record = {
                    "row": row_offset + r,
                    "episode": k,
                    "seed": derive_seed(seed, row_offset + r, k),
                    "step": step_index,
                    "terminated": bool(step.terminated[r]),
                    "truncated": bool(step.truncated[r]),
                    **report,
                }
                results.append((record, report))
            started[done] += 1
            obs = env.reset_rows(step.done_rows, [derive_seed(seed, row_offset + r, int(started[r])) for r in done])
    return results
