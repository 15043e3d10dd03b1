"""Actor-critic: a Categorical or Gaussian actor on ``model.actor_inputs``, a critic on ``model.critic_inputs``.

Each network reads its named observation groups (``raysim.models.inputs.GroupInputs``: a CNN per
image group, the vector groups concatenated) into an MLP, ``net``. With ``obs_norm`` each network
normalizes its vector groups by running statistics (``raysim.models.normalizer.RunningNorm``,
submodule ``obs_norm``), updated by the learner only.

With ``model.shared_encoders`` the critic uses the actor's encoder module of each image group both read
(one set of weights, trained by the policy and the value loss: CleanRL's Atari agent, whose one Nature
CNN feeds both heads), and ``ActorCritic.evaluate`` runs it once per minibatch for both. The state_dict
names a shared encoder once, under ``actor.encoders.<group>`` (the shards receive it with the actor):
its ``critic.encoders.<group>`` entries are left out when saving and taken from the actor's when loading.

With ``model.recurrent`` the actor has a recurrent core (``raysim.models.recurrent``) between its features and
its MLP; the critic's MLP reads the core's output beside its own features (one core for both: the shards,
which hold only the actor, compute the one state a chunk carries). The learner replays sequences through it
(``Actor.replay``; ``ActorCritic.evaluate`` with ``sequences``).

The shards hold only the ``Actor``; the learner holds the whole ``ActorCritic``. Both are built
from the env's spaces and one ``ModelConfig``, so a shard's actor loads the learner's actor weights.

Continuous actions: the actor samples a Gaussian action ``u``, its log-std one learned parameter per action
dimension (``model.log_std: parameter``, PPO's) or an output of the net per state (``state``, SAC's: the net's
outputs are the mean, then the log-std bounded into [``LOG_STD_MIN``, ``LOG_STD_MAX``] by tanh, as CleanRL's
``sac_continuous_action``); ``Actor.mean_log_std`` reads both from the net's output. The
chunk stores ``u`` and its log-probability, and the env receives ``env_action(u)``: ``u`` clipped
to the action space (``action_transform: clip``) or ``tanh(u)`` scaled into it (``squash``).
The PPO ratio is the same in ``u`` and in the transformed action, so no Jacobian term is needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import gymnasium as gym
import torch
from torch import nn

from raysim.models.encoders import CNNS
from raysim.models.inputs import GroupInputs, critic_groups
from raysim.models.recurrent import RECURRENT, RecurrentCore, RowMemory
from raysim.models.rowwise import rowwise
from raysim.models.sampling import ActionSampling, to_action_space
from raysim.schema import setting


class Tanh(nn.Module):
    """tanh computed as ``2 * sigmoid(2x) - 1``: the same function to float32 rounding (absolute
    error ~1e-7), and much cheaper than ``torch.tanh`` on CPU builds where tanh is not vectorized
    (see benchmarks/README.md). The scalings by 2 are exact in floating point, so the fused
    inference path (``raysim.models.fused``) computes bitwise the same values as this forward.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(2 * x) * 2 - 1


ACTIVATIONS = {"tanh": Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU, "silu": nn.SiLU}

#: The bounds of a log-std computed per state (``model.log_std: state``): CleanRL's SAC's.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def _group_names(value: object) -> str | None:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        return f"must be a non-empty list of observation group names, got {value!r}"
    return None


@dataclass
class ModelConfig:
    """The networks: their inputs and encoders, hidden layer sizes, activation, how continuous actions meet
    the action space."""

    actor_inputs: list[str] = setting(
        factory=lambda: ["policy"], help="observation groups the actor reads", check=_group_names
    )
    critic_inputs: list[str] = setting(
        factory=lambda: ["critic"],
        help="observation groups the critic reads (default: the actor's when the env has no critic group)",
        check=_group_names,
    )
    cnn: str = setting(
        "auto",
        help="encoder of image groups (auto: nature from 36 px, else small; keypoints: spatial-softmax positions)",
        choices=CNNS,
    )
    cnn_features: int = setting(
        512, help="features each image group's CNN gives the MLP (keypoints: two per keypoint)", low=1
    )

    shared_encoders: bool = setting(
        False,
        help="the critic uses the actor's CNN of each image group both read (one trunk, as CleanRL's Atari agent)",
    )
    recurrent: str = setting(
        "none",
        help="an LSTM or GRU between the actor's features and its MLP; the critic reads it too",
        choices=RECURRENT,
    )
    recurrent_size: int = setting(64, help="units of the recurrent core (model.recurrent)", low=1)
    hidden_sizes: list[int] = setting(
        factory=lambda: [64, 64], help="widths of the hidden layers ([]: the heads read the inputs)", item_low=1
    )
    activation: str = setting("tanh", help="between the layers", choices=tuple(ACTIVATIONS))
    action_transform: str = setting("clip", help="continuous actions into the action space", choices=("clip", "squash"))
    log_std: str = setting(
        "parameter",
        help="Gaussian actions' log-std: one learned value per action dimension (PPO's), or an output of the actor's "
        "network per state, bounded to [-5, 2] (state: SAC's)",
        choices=("parameter", "state"),
    )
    init_log_std: float = setting(
        0.0, help="initial log standard deviation of Gaussian actions (log_std: state: in every state, within (-5, 2))"
    )
    critic: bool = setting(True, help="build a value network (critic-free algorithms default to false)")
    obs_norm: bool = setting(False, help="normalize the vector inputs of actor and critic by running mean and variance")
    obs_norm_clip: float = setting(
        10.0, help="normalized observations are clipped to [-clip, clip]", low=0, open_low=True
    )
    init_from: str | None = setting(
        None,
        help="a new run starts from this run's (or checkpoint's) actor, and its critic where it fits; the log-std "
        "from init_log_std (a resume continues from its own checkpoint instead)",
    )


def mlp(in_dim: int, hidden_sizes: list[int], out_dim: int, activation: str, out_gain: float = 1.0) -> nn.Sequential:
    """Linear layers with ``activation`` between them, orthogonal init (CleanRL's)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"model.activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    layers: list[nn.Module] = []
    sizes = [in_dim, *hidden_sizes]
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [_init(nn.Linear(a, b), math.sqrt(2)), ACTIVATIONS[activation]()]
    layers.append(_init(nn.Linear(sizes[-1], out_dim), out_gain))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class Actor(GroupInputs):
    """The policy: the groups ``model.actor_inputs`` (a dict of them, or the one tensor) to an action distribution.

    Its running statistics (``obs_norm``) are in its state_dict, so the shards receive them with the weights.
    """

    def __init__(self, observation_spaces: dict[str, gym.Space], action_space: gym.Space, config: ModelConfig):
        super().__init__(observation_spaces, config.actor_inputs, "model.actor_inputs", config)
        self.sampling = ActionSampling(action_space, config.action_transform)
        self.discrete = self.sampling.discrete
        state_std = config.log_std == "state"
        if state_std and self.discrete:
            raise ValueError(
                "model.log_std: state gives Gaussian actions a log-std per state; discrete actions have none: "
                "leave model.log_std at parameter"
            )
        width = self.sampling.width
        recurrent = config.recurrent != "none"
        self.core = RecurrentCore(config.recurrent, self.in_dim, config.recurrent_size) if recurrent else None
        net_in = self.core.size if self.core is not None else self.in_dim
        self.net = mlp(net_in, config.hidden_sizes, 2 * width if state_std else width, config.activation, 0.01)
        self.log_std = None  # the learned log-std (``parameter``); none for discrete actions or a log-std per state
        if not self.discrete:
            if state_std:
                self.reset_log_std(_checked_init_log_std(config.init_log_std))
            else:
                self.log_std = nn.Parameter(torch.full((width,), float(config.init_log_std)))
            self.register_buffer("action_low", self.sampling.low.clone(), persistent=False)  # moved with the actor
            self.register_buffer("action_high", self.sampling.high.clone(), persistent=False)
            self.squash = self.sampling.squash

    def forward(
        self,
        obs: dict[str, torch.Tensor] | torch.Tensor,
        by_row: bool = False,
        encoded: Mapping[str, torch.Tensor] | None = None,
        memory: RowMemory | None = None,
    ) -> torch.Tensor:
        """The network's output: logits (discrete) or the Gaussian's parameters (``mean_log_std``). ``by_row``: the
        MLP (and recurrent core) computes each row bitwise the same in any batch (``raysim.models.rowwise``;
        evaluation). CNN features are computed the normal, batched way (a convolution row-wise would cost many
        times more): with image inputs a row's action may differ in its last bits with the batch it is computed in.
        ``encoded``: image features already computed. ``memory``: the rows' recurrent state (a recurrent actor's),
        moved on by this step."""
        x = self.features(obs, encoded)
        if self.core is not None:
            if memory is None:
                raise ValueError("a recurrent actor (model.recurrent) acts on rows with a state: pass their RowMemory")
            x = memory.advance(self.core, x, by_row)
        return rowwise(self.net, x) if by_row else self.net(x)

    def replay(
        self,
        obs: dict[str, torch.Tensor] | torch.Tensor,
        sequences: dict[str, torch.Tensor],
        encoded: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The recurrent core's output [rows, T, size] along sequences of observations [rows, T, ...] (row-major),
        from ``sequences``' ``state0`` [rows, S], zeroed where ``starts`` [rows, T]; ``encoded``: image features
        already computed, flat [rows x T, ...]."""
        rows, steps = sequences["starts"].shape
        flat = {g: v.flatten(0, 1) for g, v in self.groups(obs).items()}
        x = self.features(flat, encoded).view(rows, steps, -1).transpose(0, 1)
        out, _ = self.core.replay(x, sequences["state0"], sequences["starts"].t())
        return out.transpose(0, 1)

    def sample(
        self,
        obs: dict[str, torch.Tensor] | torch.Tensor,
        generator: torch.Generator | None = None,
        keys: tuple[torch.Tensor, torch.Tensor] | None = None,
        by_row: bool = False,
        memory: RowMemory | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled action and its log-probability, without building distribution objects.

        ``keys``: ``(key [B], counter [B])`` int64; the draws are then the counter-based noise of
        ``raysim.seeding`` (row ``i``'s depend on its key and counter alone), not the generator's;
        with ``by_row`` too, a row's action and log-probability do not depend on the batch at all.
        ``memory``: as in ``forward``.
        """
        out = self(obs, by_row, memory=memory)
        return self.act_with(out, self.draws(out.shape[0], generator, keys))

    def draws(
        self, rows: int, generator: torch.Generator | None = None, keys: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """What sampling ``rows`` actions draws (``ActionSampling.draws``), apart from the forward pass: the rows'
        process draws them and a policy server acts with them (``act_with``)."""
        return self.sampling.draws(rows, generator, keys)

    def act_with(self, out: torch.Tensor, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The action and its log-probability for the network's output ``out`` and the rows' ``draws``: the argmax of
        ``probs / draws`` (``sample_categorical``), or ``mean + draws * std`` (the std per row or one for all)."""
        if self.discrete:
            log_probs = out.log_softmax(-1)
            action = torch.div(log_probs.exp(), draws).argmax(-1)
            return action, log_probs.gather(1, action.unsqueeze(1)).squeeze(1)
        mean, log_std = self.mean_log_std(out)
        action = mean + draws * log_std.exp()
        logp = -0.5 * draws.square().sum(-1) - log_std.sum(-1) - 0.5 * math.log(2 * math.pi) * mean.shape[-1]
        return action, logp

    def mean_log_std(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian's mean and log-std for the network's output ``out``: ``out`` and the log-std parameter, or
        (``model.log_std: state``) the first D columns and the last D bounded into [LOG_STD_MIN, LOG_STD_MAX]."""
        if self.log_std is not None:
            return out, self.log_std
        raw = out[..., self.sampling.width :]
        return self.mean_of(out), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw) + 1)

    def mean_of(self, out: torch.Tensor) -> torch.Tensor:
        """The Gaussian mean in the network's output ``out`` (logits as they are): what imitation fits, a teacher
        labels with and the deterministic action is."""
        return out if self.log_std is not None or self.discrete else out[..., : self.sampling.width]

    def mode_of(self, out: torch.Tensor) -> torch.Tensor:
        """The most likely action for the network's output ``out``: the argmax of the logits, or the mean."""
        return out.argmax(-1) if self.discrete else self.mean_of(out)

    def reset_log_std(self, value: float) -> None:
        """Gaussian exploration from ``value`` again, in every state: the log-std parameter filled with it, or the
        network's log-std outputs made constant (their weights zero, their bias the value's preimage)."""
        with torch.no_grad():
            if self.log_std is not None:
                self.log_std.fill_(float(value))
                return
            head, width = self.net[-1], self.sampling.width
            head.weight[width:].zero_()
            head.bias[width:].fill_(math.atanh(2 * (value - LOG_STD_MIN) / (LOG_STD_MAX - LOG_STD_MIN) - 1))

    def deterministic(
        self, obs: dict[str, torch.Tensor] | torch.Tensor, by_row: bool = False, memory: RowMemory | None = None
    ) -> torch.Tensor:
        """The mode: argmax for discrete actions, the mean for continuous ones (``by_row``, ``memory``: as in
        ``forward``)."""
        return self.mode_of(self(obs, by_row, memory=memory))

    def log_prob_entropy(
        self,
        obs: dict[str, torch.Tensor] | torch.Tensor,
        actions: torch.Tensor,
        encoded: Mapping[str, torch.Tensor] | None = None,
        sequences: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of ``actions`` and the distribution's entropy, per row (for the loss); ``encoded``: image
        features already computed. ``sequences`` (a recurrent actor's): ``obs`` and ``actions`` are sequences
        [rows, T, ...] replayed (``replay``), and the results are at their valid steps (``mask``), flat, row by row."""
        if sequences is None:
            return self.log_prob_entropy_of(self(obs, encoded=encoded), actions)
        valid = sequences["mask"]
        return self.log_prob_entropy_of(self.net(self.replay(obs, sequences, encoded)[valid]), actions[valid])

    def log_prob_entropy_of(self, out: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of ``actions`` and the entropy under the network's output ``out`` (logits, or the Gaussian's
        parameters: ``mean_log_std``)."""
        if self.discrete:
            log_probs = out.log_softmax(-1)
            logp = log_probs.gather(1, actions.long().unsqueeze(1)).squeeze(1)
            return logp, -(log_probs.exp() * log_probs).sum(-1)
        mean, log_std = self.mean_log_std(out)
        dist = torch.distributions.Normal(mean, log_std.exp().expand_as(mean))
        return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """The action the env receives for a sampled one (continuous: clipped or squashed)."""
        if self.discrete:
            return action
        return to_action_space(action, self.action_low, self.action_high, self.squash)


def _checked_init_log_std(value: float) -> float:
    """``model.init_log_std`` for a log-std per state: strictly within its bounds, or a ValueError naming the key."""
    if not LOG_STD_MIN < value < LOG_STD_MAX:
        raise ValueError(
            f"model.init_log_std: {value} is outside ({LOG_STD_MIN:g}, {LOG_STD_MAX:g}), the bounds of a log-std per "
            "state (model.log_std: state)"
        )
    return float(value)


def sample_categorical(
    probs: torch.Tensor,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    uniform: torch.Tensor | None = None,
) -> torch.Tensor:
    """One action per row [B] from ``probs`` [B, K]: ``argmax(probs / q)`` with ``q ~ Exp(1)``.

    This is exactly what ``torch.multinomial(probs, 1)`` computes on the CPU (its one-sample
    path: the same exponential draws from the generator, the same division and argmax), so the
    actions are bitwise those of ``multinomial``, without its argument checks (cheaper for
    small batches). ``noise`` [B, K] and ``out`` [B] int64 are optional preallocated buffers.
    ``uniform`` [B, K] in (0, 1): ``q = -log(uniform)`` instead of the generator's draws.
    """
    q = torch.empty_like(probs) if noise is None else noise
    if uniform is None:
        q.exponential_(1, generator=generator)
    else:
        q.copy_(uniform.log().neg_())
    torch.div(probs, q, out=q)
    return torch.argmax(q, -1, out=out) if out is not None else q.argmax(-1)


class Critic(GroupInputs):
    """The value function on the groups ``model.critic_inputs`` (the actor's when the env has no ``critic`` group)."""

    def __init__(
        self,
        observation_spaces: dict[str, gym.Space],
        config: ModelConfig,
        shared_encoders: Mapping[str, nn.Module] | None = None,
    ):
        """``shared_encoders``: the actor's, used for the image groups the critic reads too."""
        inputs = critic_groups(observation_spaces, config.critic_inputs, config.actor_inputs)
        super().__init__(observation_spaces, inputs, "model.critic_inputs", config, shared_encoders)
        self.memory_size = int(config.recurrent_size) if config.recurrent != "none" else 0
        self.net = mlp(self.memory_size + self.in_dim, config.hidden_sizes, 1, config.activation, 1.0)

    @property
    def fusable(self) -> bool:
        """Vector groups into a plain MLP, no recurrent core's output: the fused inference path applies."""
        return super().fusable and not self.memory_size

    def forward(
        self,
        obs: dict[str, torch.Tensor],
        encoded: Mapping[str, torch.Tensor] | None = None,
        memory: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Values [B] of a batch of observation groups; ``encoded``: image features already computed; ``memory``:
        the actor's recurrent core's output for the same rows [B, size] (``model.recurrent``), read first."""
        x = self.features(obs, encoded)
        if self.memory_size:
            if memory is None:
                raise ValueError("with model.recurrent the critic reads the recurrent core's output: pass memory")
            x = torch.cat([memory, x], 1)
        return self.net(x).squeeze(-1)


class ActorCritic(nn.Module):
    """The learner's model: ``actor`` (shipped to the shards) and an optional ``critic``; ``shared_groups``: the image
    groups whose encoder the critic shares with the actor (``model.shared_encoders``)."""

    def __init__(self, observation_spaces: dict[str, gym.Space], action_space: gym.Space, config: ModelConfig):
        super().__init__()
        # what it was built from (an algorithm's own networks read it: SAC's critics)
        self.observation_spaces, self.action_space, self.config = observation_spaces, action_space, config
        self.actor = Actor(observation_spaces, action_space, config)
        shared = self.actor.encoders if config.shared_encoders else None
        self.critic = Critic(observation_spaces, config, shared) if config.critic else None
        self.shared_groups = [g for g in self.critic.image_groups if g in shared] if self.critic and shared else []
        if self.shared_groups:
            self.register_state_dict_post_hook(_name_shared_once)
            self.register_load_state_dict_pre_hook(_load_shared_from_actor)

    def evaluate(
        self, obs: dict[str, torch.Tensor], actions: torch.Tensor, sequences: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logp, entropy, value)`` per row, for the loss: a CNN the critic shares with the actor runs once.

        ``sequences`` (``model.recurrent``): ``obs`` and ``actions`` are sequences [rows, T, ...]; the actor's core
        replays them once for both heads, and the results are at the valid steps, flat, row by row.
        """
        if sequences is None:
            encoded = {g: self.actor.encoders[g](obs[g]) for g in self.shared_groups}
            logp, entropy = self.actor.log_prob_entropy(obs, actions, encoded)
            return logp, entropy, self.critic(obs, encoded)
        flat = {g: v.flatten(0, 1) for g, v in obs.items()}
        encoded = {g: self.actor.encoders[g](flat[g]) for g in self.shared_groups}
        valid = sequences["mask"]
        memory = self.actor.replay(obs, sequences, encoded)[valid]
        logp, entropy = self.actor.log_prob_entropy_of(self.actor.net(memory), actions[valid])
        at_valid = valid.flatten()
        value = self.critic(
            {g: v[at_valid] for g, v in flat.items()}, {g: e[at_valid] for g, e in encoded.items()}, memory
        )
        return logp, entropy, value

    def shared_prefixes(self, prefix: str) -> list[tuple[str, str]]:
        """``(critic's, actor's)`` state_dict prefix of each shared encoder, under the model's ``prefix``."""
        return [(f"{prefix}critic.encoders.{g}.", f"{prefix}actor.encoders.{g}.") for g in self.shared_groups]


def _name_shared_once(model: ActorCritic, state: dict[str, torch.Tensor], prefix: str, *_: object) -> None:
    """A state_dict hook: a shared encoder's weights under the actor's names only (the critic's are the same)."""
    for critic, _actor in model.shared_prefixes(prefix):
        for key in [k for k in state if k.startswith(critic)]:
            del state[key]


def _load_shared_from_actor(model: ActorCritic, state: dict[str, torch.Tensor], prefix: str, *_: object) -> None:
    """A load_state_dict pre-hook: the critic's entries of a shared encoder are the actor's."""
    for critic, actor in model.shared_prefixes(prefix):
        for key in [k for k in state if k.startswith(actor)]:
            state.setdefault(critic + key[len(actor) :], state[key])


def actor_state(model_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``Actor``'s entries of an ``ActorCritic`` state_dict (a checkpoint's ``state["model"]``)."""
    return {k[len("actor.") :]: v for k, v in model_state.items() if k.startswith("actor.")}
