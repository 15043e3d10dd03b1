"""raysim: Ray-based rollout collection and PPO / GRPO training for batched environments."""

from raysim.config import Config, load_config
from raysim.coordinator import Summary, Trainer, evaluate
from raysim.evaluation import EvalReport
from raysim.sweep import tune

__version__ = "0.1.0"
__all__ = ["Config", "EvalReport", "Summary", "Trainer", "evaluate", "load_config", "tune"]
