"""Native batched CartPole: Gymnasium's CartPole-v1 physics for N rows at once in torch tensors.

Same constants, Euler integration, termination thresholds (|x| > 2.4, |theta| > 12 degrees),
reward 1 on every step (the terminal one included) and initial states uniform in [-0.05, 0.05].
Truncation at ``max_episode_steps`` (500, as CartPole-v1's TimeLimit). ``frames`` draws every row from the
side (track, cart, pole; ``raysim.envs.camera``), for videos.

Option ``initial_states``: a fixed table of initial states (a task resource) that resets draw
rows from, declared as ``{generate: K, seed: S}`` (materialized once, deterministically), as
``{file: table.npy}``, or given as an array [K, 4].

Option ``velocities: false``: the observation is (x, theta) alone, the standard partially observed test of
memory (RLlib's stateless CartPole, SB3-contrib's ``CartPoleNoVel-v1``): a policy must infer the velocities
from what it saw before (``model.recurrent``).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from raysim.envs.camera import Camera, Disks, Segments
from raysim.envs.contract import Obs
from raysim.envs.torch_env import TorchEnv

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_CART + MASS_POLE
HALF_LENGTH = 0.5
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
FORCE_MAG = 10.0
TAU = 0.02
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4


class CartPole(TorchEnv):
    """``raysim/CartPole``: observation group ``policy`` = (x, x_dot, theta, theta_dot), or (x, theta) with
    ``velocities=False``."""

    env_id = "raysim/CartPole"
    defines_success = False
    state_keys = ("state",)

    def __init__(
        self,
        num_envs: int,
        seed: int | None = None,
        max_episode_steps: int = 500,
        device: str = "cpu",
        initial_states: Any = None,
        velocities: bool = True,
    ):
        super().__init__(num_envs, seed, max_episode_steps, device)
        table = self.materialize({"initial_states": initial_states})["initial_states"]
        self.initial_states = None if table is None else torch.as_tensor(table, dtype=torch.float32, device=self.device)
        if not isinstance(velocities, bool):
            raise ValueError(f"raysim/CartPole: velocities must be true or false, got {velocities!r}")
        self.observed = [0, 1, 2, 3] if velocities else [0, 2]  # the state's columns the policy sees
        high = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], dtype=np.float32)[self.observed]
        self.observation_spaces = {"policy": gym.spaces.Box(-high, high, dtype=np.float32)}
        self.action_space = gym.spaces.Discrete(2)
        self.state = torch.zeros(self.num_envs, 4, device=self.device)
        self.reset(seed)

    @classmethod
    def materialize(cls, options: dict[str, Any]) -> dict[str, Any]:
        spec = options.get("initial_states")
        if isinstance(spec, dict) and "generate" in spec:
            rng = np.random.default_rng(int(spec.get("seed", 0)))
            spec = rng.uniform(-0.05, 0.05, size=(int(spec["generate"]), 4)).astype(np.float32)
        elif isinstance(spec, dict) and "file" in spec:
            spec = np.load(spec["file"])
        elif spec is not None:
            spec = np.asarray(spec, dtype=np.float32)
        if spec is not None and (spec.ndim != 2 or spec.shape[1] != 4):
            raise ValueError(f"raysim/CartPole: initial_states must be a [K, 4] table, got shape {spec.shape}")
        options["initial_states"] = spec
        return options

    def _reset_state(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        if self.initial_states is not None:
            pick = torch.randint(len(self.initial_states), (rows.numel(),), generator=generator, device=self.device)
            self.state[rows] = self.initial_states[pick]
            return
        initial = torch.rand(rows.numel(), 4, generator=generator, device=self.device)
        c = self._scratch() and self._constants
        self.state[rows] = initial.mul_(c["0.1"]).sub_(c["0.05"])  # initial * 0.1 - 0.05, in [-0.05, 0.05)

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gymnasium's Euler step, op for op the plain expression below, in place into scratch buffers.

        ``x' = x + TAU*x_dot``, ``x_dot' = x_dot + TAU*x_acc``, ``theta' = theta + TAU*theta_dot``,
        ``theta_dot' = theta_dot + TAU*theta_acc`` with::

            force = +-FORCE_MAG
            temp = (force + POLE_MASS_LENGTH * theta_dot**2 * sin) / TOTAL_MASS
            theta_acc = (GRAVITY * sin - cos * temp) / (HALF_LENGTH * (4/3 - MASS_POLE * cos**2 / TOTAL_MASS))
            x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS

        Each float32 operation is the same (same operands, order and rounding), so the states are
        bitwise those of the plain form; it just issues ~30 mostly in-place torch calls instead of
        ~40 allocating ones (per-call overhead dominates at small N). The four updates run as one
        ``[N, 4]`` multiply and add on the derivative matrix ``(x_dot, x_acc, theta_dot, theta_acc)``.
        """
        b = self._scratch()
        _, x_dot, theta, theta_dot = self.state.unbind(1)
        force = torch.index_select(self._force, 0, actions)  # action 0: -FORCE_MAG, 1: +FORCE_MAG
        cos, sin, temp, num, den, x_acc = b["cos"], b["sin"], b["temp"], b["num"], b["den"], b["x_acc"]
        deriv, d_x, d_x_dot, d_theta, d_theta_dot = b["deriv"], *b["deriv_columns"]
        c = self._constants
        torch.cos(theta, out=cos)
        torch.sin(theta, out=sin)
        torch.square(theta_dot, out=temp).mul_(c["pml"]).mul_(sin).add_(force).div_(c["total_mass"])
        torch.mul(sin, c["gravity"], out=num).sub_(torch.mul(cos, temp, out=x_acc))
        torch.square(cos, out=den).mul_(c["mass_pole"]).div_(c["total_mass"])
        den.neg_().add_(c["four_thirds"]).mul_(c["half_length"])  # 4/3 - den: the negation is exact
        theta_acc = torch.div(num, den, out=d_theta_dot)
        torch.mul(theta_acc, c["pml"], out=x_acc).mul_(cos).div_(c["total_mass"])
        torch.sub(temp, x_acc, out=d_x_dot)
        d_x.copy_(x_dot)
        d_theta.copy_(theta_dot)
        # a new state tensor each step: observations handed out earlier stay as they were
        self.state = state = torch.add(self.state, deriv.mul_(c["tau"]))
        terminated = torch.gt(state[:, 0::2].abs(), self._thresholds).any(1)  # |x| > 2.4 or |theta| > 12 deg
        return torch.ones(self.num_envs, device=self.device), terminated

    def frames(self, size: int) -> torch.Tensor:
        """Every row's cart and pole seen from the side, the track's whole width, ``[N, size, size, 3]`` uint8."""
        camera = getattr(self, "_video_camera", None)
        if camera is None or camera.size != size:
            camera = self._video_camera = Camera(size, 2.6, (0.0, 0.6), (245, 245, 240), self.device)
        x, theta = self.state[:, 0:1], self.state[:, 2:3]
        base = torch.stack((x, torch.zeros_like(x)), dim=2)  # [N, 1, 2]: the pole's pivot on the cart
        tip = base + 2 * HALF_LENGTH * torch.stack((torch.sin(theta), torch.cos(theta)), dim=2)
        ends = torch.tensor([[[-X_THRESHOLD, -0.1]], [[X_THRESHOLD, -0.1]]], device=self.device)
        offset = torch.tensor([0.25, 0.0], device=self.device)
        layers = [
            Segments(ends[0].expand(len(x), 1, 2), ends[1].expand(len(x), 1, 2), 0.02, (120, 120, 120)),
            Segments(base - offset, base + offset, 0.12, (40, 40, 40)),
            Segments(base, tip, 0.05, (200, 140, 80)),
            Disks(base, 0.05, (130, 130, 200)),
        ]
        return camera.render(layers, self.num_envs).permute(0, 2, 3, 1).contiguous()

    def _scratch(self) -> dict[str, torch.Tensor]:
        """Per-env scratch tensors of ``_advance`` (never handed out)."""
        if getattr(self, "_buffers", None) is None:
            new = lambda: torch.empty(self.num_envs, device=self.device)  # noqa: E731
            self._buffers = {k: new() for k in ("cos", "sin", "temp", "num", "den", "x_acc")}
            self._buffers["deriv"] = torch.empty(self.num_envs, 4, device=self.device)
            self._buffers["deriv_columns"] = self._buffers["deriv"].unbind(1)
            self._force = torch.tensor([-FORCE_MAG, FORCE_MAG], device=self.device)
            self._thresholds = torch.tensor([X_THRESHOLD, THETA_THRESHOLD], device=self.device)
            # The constants as float32 0-dim tensors: a Python float operand is converted into one
            # on every call (4 hidden dispatches per op); the values, float32-rounded, are the same.
            constants = {
                "pml": POLE_MASS_LENGTH,
                "total_mass": TOTAL_MASS,
                "gravity": GRAVITY,
                "mass_pole": MASS_POLE,
                "four_thirds": 4.0 / 3.0,
                "half_length": HALF_LENGTH,
                "tau": TAU,
                "0.1": 0.1,
                "0.05": 0.05,
            }
            self._constants = {k: torch.tensor(v, device=self.device) for k, v in constants.items()}
        return self._buffers

    def _observe(self) -> Obs:
        return {"policy": self.state if len(self.observed) == 4 else self.state[:, self.observed]}
