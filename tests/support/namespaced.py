"""A package that registers a Gymnasium id in its own namespace when imported (as ale_py does for ``ALE/``)."""

import gymnasium

gymnasium.register("RaysimTest/Pole-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv")
