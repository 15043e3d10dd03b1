"""Batched environments: the step contract, native torch tasks, and the Gymnasium adapter."""

from raysim.envs.cartpole import CartPole
from raysim.envs.contract import BatchedEnv, Obs, Step
from raysim.envs.frame_stack import FrameStack, FrameStackConfig, stacked
from raysim.envs.meta_world import MetaWorld
from raysim.envs.reach import Reach
from raysim.envs.reach_camera import ReachCamera
from raysim.envs.registry import make, register, registered
from raysim.envs.torch_env import TorchEnv

register("raysim/CartPole", CartPole)
register("raysim/MetaWorld", MetaWorld)  # needs raysim[metaworld] when built
register("raysim/Reach", Reach)
register("raysim/ReachCamera", ReachCamera)

from raysim.envs.gym_vector import RaysimEnv, RaysimVectorEnv, register_gymnasium  # noqa: E402

register_gymnasium(["raysim/CartPole", "raysim/Reach"])  # gymnasium.make_vec("raysim/CartPole-v0", num_envs=N)

__all__ = [
    "BatchedEnv",
    "CartPole",
    "FrameStack",
    "FrameStackConfig",
    "MetaWorld",
    "Obs",
    "RaysimEnv",
    "RaysimVectorEnv",
    "Reach",
    "ReachCamera",
    "Step",
    "TorchEnv",
    "make",
    "register",
    "registered",
    "stacked",
]
