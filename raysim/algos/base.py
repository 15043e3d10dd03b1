"""The algorithm interface: everything the learner and the coordinator need to know of an algorithm.

The learner calls it and never names an algorithm::

    algorithm = algorithm_class(config.name)(config, model, ranks)
    metrics = algorithm.update(chunks, step, generator)     # advantages, then epochs of the loss

and the coordinator asks it how the shards collect (``collection``; None: it trains without training shards,
on a dataset of demonstrations handed to it with ``attach``, for ``planned_iterations``) and checks the config
(``check``). PPO and GRPO implement it in their own files; a third algorithm is one more file,
found by name in the registry (``raysim.algos``) or as ``module.path:Class``.

Every algorithm's config declares the settings raysim reads outside it (``OptimizerConfig``: the learning
rate and its schedule, the gradient clip, the epochs and minibatches, the lag bound); ``run_epochs`` also reads
``target_kl`` where present. Before each update the learner sets the algorithm's ``version`` (its weights'
policy version: a chunk of a lower ``policy_version`` was collected by an older policy) and ``env_steps`` (the
env steps the run consumed before it: the clock of the fine-tuning guards).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from raysim.algos.collectives import Collectives
from raysim.algos.epochs import Batch, check_batch, run_epochs
from raysim.algos.guard import GuardedStep
from raysim.models import ActorCritic
from raysim.rollout import Collection, RolloutChunk


class Algorithm:
    """One training algorithm: how shards collect for it, its batch (advantages), its loss on a minibatch."""

    name: ClassVar[str]
    Config: ClassVar[type]  # the dataclass of its ``algo`` config section: an ``OptimizerConfig``
    uses_critic: ClassVar[bool] = True  # False: the learner builds no critic by default and runs no value inference
    off_policy: ClassVar[bool] = False  # True: it learns from a replay buffer (``use_replay``), stale chunks too
    trains_recurrent: ClassVar[bool] = False  # True: it trains a recurrent model (model.recurrent) on sequences
    loss_terms: ClassVar[tuple[str, ...]]  # the metrics whose non-finiteness the optimizer step's guard names

    def __init__(self, config: Any, model: ActorCritic, ranks: Collectives):
        if self.uses_critic and model.critic is None:
            raise ValueError(f"algo {self.name!r} needs a critic, but model.critic is false")
        if model.actor.core is not None and not self.trains_recurrent:
            raise ValueError(f"algo {self.name!r} does not train recurrent policies: set model.recurrent: none")
        self.config, self.model, self.ranks = config, model, ranks
        self.version = 0  # the policy version of the model's weights: the learner sets it before each update
        self.env_steps = 0  # the env steps consumed before this update: the learner sets it before each update

    @classmethod
    def model_defaults(cls) -> dict[str, Any]:
        """``model.*`` settings this algorithm changes the default of (a critic-free one: ``critic: false``)."""
        return {} if cls.uses_critic else {"critic": False}

    @classmethod
    def collection(cls, config: Any) -> Collection | None:
        """What each shard collects per iteration (None: no training shards; the algorithm trains on what
        ``attach`` gave it)."""
        raise NotImplementedError

    @classmethod
    def collection_at(cls, config: Any, env_steps: int) -> Collection | None:
        """What the shards collect once the run consumed ``env_steps`` env steps: ``collection``, unless the plan
        follows a schedule (distillation's teacher share)."""
        return cls.collection(config)

    @classmethod
    def planned_iterations(cls, config: Any) -> int | None:
        """The run's iterations when its budget is not in env steps (an algorithm without shards); None: it is
        ``train.total_steps``."""
        return None

    @classmethod
    def dataset(cls, config: Any) -> tuple[str, str] | None:
        """The dataset of demonstrations this algorithm trains on, as ``(its key, the dataset)``: the driver reads it
        and ``attach`` gets this rank's share; None: none."""
        return None

    def attach(self, demonstrations: Any) -> None:
        """Train on ``demonstrations`` (``raysim.demos.Demonstrations``, this rank's share): algorithms that learn
        from a dataset override it."""
        raise ValueError(f"algo {self.name!r} does not train on a dataset of demonstrations")

    def use_replay(self, replay: Any) -> None:
        """The learner's replay buffer (``raysim.algos.replay.ReplayBuffer``), for an ``off_policy`` algorithm."""
        raise ValueError(f"algo {self.name!r} does not learn from a replay buffer")

    def appended(self) -> Any:
        """What the last update appended to the replay buffer (the coordinator saves it beside the checkpoints);
        None for an algorithm without one."""
        return None

    def restore(self, segments: list[Any]) -> None:
        """Refill the replay buffer from the saved ``(first index, transitions)`` segments, in order."""

    def freezes_normalizer(self) -> bool:
        """Whether this update leaves the observation statistics as they are (a fine-tuning warm-up)."""
        return False

    @classmethod
    def check(cls, config: Any, num_envs: int) -> None:
        """Refuse settings that cannot work together (``ValueError`` naming the ``algo.*`` key)."""

    @classmethod
    def check_model(cls, config: Any, model: Any, observation_spaces: dict[str, Any], action_space: Any) -> None:
        """Refuse a model (``ModelConfig``) or env spaces this algorithm cannot train (``ValueError`` naming the
        ``model.*`` key), before anything starts."""

    def batch(self, chunks: list[RolloutChunk]) -> Batch:
        """Every valid transition of the chunks with what the loss needs (``obs``, ``actions``, ``logprobs``,
        ``advantages``, ...), flattened into one batch."""
        raise NotImplementedError

    def loss(self, minibatch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of one minibatch and its metrics (tensors, still on the device)."""
        raise NotImplementedError

    def update(
        self, chunks: list[RolloutChunk], step: GuardedStep, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """One update on the chunks: ``run_epochs`` of the loss over the batch; the metrics.

        The batch is this rank's alone (its chunks): building it can fail on one rank only (too few samples to
        split, every one masked), so the ranks agree on it before the epochs' first collective and all raise the
        error (``Collectives.agree``), none left waiting in a collective until it times out.
        """
        batch, error = None, None
        try:
            batch = self.batch(chunks)
            check_batch(batch, self.config)
        except Exception as caught:  # noqa: BLE001 - agreed on, then raised by every rank
            error = caught
        self.ranks.agree("building the update's batch", error)
        return run_epochs(self.loss, self.loss_terms, step, batch, self.config, generator)

    def state_dict(self) -> dict[str, Any]:
        """What the algorithm adds to a checkpoint (beside the model and optimizer)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` added (the learner's whole state is passed)."""
