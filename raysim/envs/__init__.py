"""Batched environments: the step contract, native torch tasks, and the Gymnasium adapter."""

from raysim.envs.cartpole import CartPole
from raysim.envs.contract import BatchedEnv, Obs, Step
from raysim.envs.registry import make, register, registered
from raysim.envs.torch_env import TorchEnv

register("raysim/CartPole", CartPole)

__all__ = ["BatchedEnv", "CartPole", "Obs", "Step", "TorchEnv", "make", "register", "registered"]
