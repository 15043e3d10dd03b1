"""Micro-measurements behind choices in raysim's hot paths (the figures in benchmarks/README.md).

    python benchmarks/micro.py

- ``Tanh``: ``torch.tanh`` against ``2 * sigmoid(2x) - 1`` (raysim.models.networks.Tanh), per element;
- ``sample_categorical`` against ``torch.multinomial(probs, 1)`` for a small batch;
- the critic's values for 1024 rows x 33 observations: one forward against ``critic_values``' blocks;
- a 1024-row chunk through pickle protocol 5: torch's own pickling against the chunk's NumPy path.

One torch thread; the median of repeated timings.
"""

from __future__ import annotations

import pickle
import statistics
import time

import torch

from raysim.models import ActorCritic, ModelConfig, sample_categorical
from raysim.rollout import EnvShard, RolloutChunk
from raysim.rollout.advantages import critic_values
from raysim.rollout.inference import inference


def median_seconds(fn, repeats: int = 30) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    x = torch.randn(1_000_000)
    tanh = median_seconds(lambda: torch.tanh(x))
    sigmoid = median_seconds(lambda: torch.sigmoid(2 * x) * 2 - 1)
    print(
        f"tanh: {tanh / x.numel() * 1e9:.2f} ns/element; 2*sigmoid(2x)-1: {sigmoid / x.numel() * 1e9:.2f} ns/element "
        f"({tanh / sigmoid:.2f}x)"
    )

    probs = torch.softmax(torch.randn(64, 2), -1)
    generator = torch.Generator().manual_seed(0)
    multinomial = median_seconds(lambda: torch.multinomial(probs, 1, generator=generator), 300)
    ours = median_seconds(lambda: sample_categorical(probs, generator), 300)
    print(
        f"64 x 2 categorical sample: multinomial {multinomial * 1e6:.1f} us, sample_categorical {ours * 1e6:.1f} us "
        f"({multinomial / ours:.2f}x)"
    )

    shard = EnvShard("raysim/CartPole", 1024, seed=0)
    model = ActorCritic(*shard.spaces()[:2], ModelConfig())
    chunk = shard.rollout({"version": 0, "actor": model.actor.state_dict()}, 32)
    obs = {k: v.flatten(0, 1) for k, v in chunk.obs.items()}
    with inference(model.critic):
        whole = median_seconds(lambda: model.critic(obs), 10)
        blocked = median_seconds(lambda: critic_values(model.critic, obs), 10)
    print(
        f"critic on {obs['policy'].shape[0]:,} observations: one forward {whole * 1e3:.1f} ms, "
        f"blocks {blocked * 1e3:.1f} ms ({whole / blocked:.2f}x)"
    )

    def torch_pickle() -> None:
        pickle.dumps({k: getattr(chunk, k) for k in vars(chunk)}, protocol=5)

    def chunk_pickle() -> None:
        buffers = []
        pickle.dumps(chunk, protocol=5, buffer_callback=buffers.append)

    as_torch, as_numpy = median_seconds(torch_pickle, 20), median_seconds(chunk_pickle, 20)
    assert isinstance(pickle.loads(pickle.dumps(chunk, protocol=5)), RolloutChunk)
    print(
        f"1024 x 32 chunk, pickle protocol 5: torch tensors {as_torch * 1e3:.2f} ms, chunk (NumPy, out of band) "
        f"{as_numpy * 1e3:.2f} ms ({as_torch / as_numpy:.1f}x)"
    )


if __name__ == "__main__":
    main()
