"""Checks before any work: the env and the model can be built from the config, in the driver, in a second.

A typo in ``env.id`` or ``env.kwargs``, a task option out of its range, an env whose package is not
installed (saying what to install), an action space the model cannot act in, a CNN setting where the
networks read no image, a run directory that cannot be written: each is a ``ConfigError`` naming the
key, raised before Ray starts or anything is written, not a traceback from inside a shard on another node.
"""

from __future__ import annotations

from typing import Any

from raysim.algos import algorithm_class
from raysim.composition import ConfigError
from raysim.config import Config, training_shards
from raysim.envs import make, stacked
from raysim.envs.errors import CannotRender, EnvOptionError, MissingDependencyError, UnknownEnvError
from raysim.envs.gym_adapter import with_pictures
from raysim.envs.messages import captured
from raysim.envs.registry import row_multiple
from raysim.envs.spaces import is_image_space
from raysim.models import ActorCritic, ModelConfig
from raysim.rollout import GroupEpisodes
from raysim.rollout.policies import scripted_policy
from raysim.storage import is_uri, unwritable

#: Model settings that only an image group's encoder reads.
IMAGE_SETTINGS = ("cnn", "cnn_features", "shared_encoders")


class RowCountError(Exception):
    """A row count that is not a multiple of what the task needs (``row_multiple``)."""


def check_env_and_model(config: Config, new_run: bool = True) -> tuple[Any, Any]:
    """Build one row of the env and the model of ``config``; a ``ConfigError`` naming the key when it fails.
    Returns the env's observation spaces and action space (the learner is built from them). A setting that
    can have no effect refuses a ``new_run``; a run trained with it (a resume, an evaluation) only hears of it."""
    env_id = config.env.id
    try:
        rows = row_multiple(env_id, config.env.kwargs)  # 1 but for a task over the rows (K tasks: K rows)
        check_row_counts(config, rows)
        check_groups(config, rows)
        with captured() as messages:  # what building the env prints, said here once (the shards keep theirs)
            env = make(env_id, rows, seed=0, success=config.env.success, **config.env.kwargs)
    except RowCountError as error:
        raise ConfigError(str(error)) from None
    except (UnknownEnvError, MissingDependencyError) as error:
        raise ConfigError(f"env.id: {one_line(error)}") from error
    except EnvOptionError as error:
        raise ConfigError(f"env.kwargs.{error.key}: {one_line(error)}") from error
    except (ValueError, TypeError, KeyError, LookupError) as error:  # the task's own check of its options
        said = one_line(error)
        named = said if said.startswith(f"{env_id}:") else f"{env_id}: {said}"  # named once (a task's own names it)
        raise ConfigError(f"env.kwargs: {named}") from error
    for message in messages:
        print(f"raysim: {env_id}: {message}", flush=True)
    if "atari" in config.env.kwargs and config.env.frame_stack.k > 1:
        env.close()
        raise ConfigError(
            "env.frame_stack: the Atari preset stacks frames itself (env.kwargs.atari.frame_stack); "
            "leave env.frame_stack.k at 1"
        )
    try:
        env = stacked(env, config.env.frame_stack)
    except ValueError as error:
        env.close()
        raise ConfigError(one_line(error)) from error
    try:
        algorithm_class(config.algo.name).check_model(  # the algorithm's reason first: a model it needs
            config.algo, config.model, env.observation_spaces, env.action_space
        )
        model = ActorCritic(env.observation_spaces, env.action_space, config.model)
    except ValueError as error:
        raise ConfigError(f"model: {one_line(error)} (env {env_id})") from error
    finally:
        env.close()
    try:
        check_image_settings(config, model, env.observation_spaces)
    except ConfigError as error:
        if new_run:
            raise
        print(f"raysim: note: {error}", flush=True)
    return env.observation_spaces, env.action_space


def check_row_counts(config: Config, rows: int) -> None:
    """A ``RowCountError`` for a count of rows of one env that is not a multiple of ``rows`` (``row_multiple``): a
    shard's, an evaluation shard's, and a pipelined worker's group's (``servers.pipeline``: an env of its own)."""
    where = f"({config.env.id}: one row per task)"
    for key, count in (("env.num_envs", config.env.num_envs), ("eval.num_envs", config.eval.num_envs)):
        if count % rows:
            raise RowCountError(f"{key}: {count} is not a multiple of {rows} {where}")
    groups = config.servers.pipeline if config.shards.placement == "servers" and training_shards(config) else 1
    if (config.env.num_envs // groups) % rows:
        raise RowCountError(
            f"env.num_envs / servers.pipeline: each group of a pipelined worker has {config.env.num_envs // groups} "
            f"rows ({config.env.num_envs} / {groups}), not a multiple of {rows} {where}"
        )


def check_groups(config: Config, tasks: int) -> None:
    """A ``RowCountError`` for GRPO groups that cannot be rows of one task each (``group_order``: row i plays task
    i mod K, a group's members start from one state)."""
    plan = algorithm_class(config.algo.name).collection(config.algo)
    per_task = config.env.num_envs // tasks
    if tasks > 1 and isinstance(plan, GroupEpisodes) and per_task % plan.group_size:
        raise RowCountError(
            f"algo.group_size: {plan.group_size} does not divide the {per_task} rows of each task (env.num_envs "
            f"{config.env.num_envs} over the {tasks} tasks of {config.env.id}; row i plays task i mod {tasks}): a GRPO "
            "group's members play one task"
        )


def check_image_settings(config: Config, model: ActorCritic, observation_spaces: dict[str, Any]) -> None:
    """A ``ConfigError`` for a CNN setting (``model.cnn``, ``cnn_features``, ``shared_encoders``) away from its
    default where no network reads an image group: it could have no effect, and would be ignored silently."""
    if model.actor.image_groups or (model.critic is not None and model.critic.image_groups):
        return
    defaults = ModelConfig()
    for key in IMAGE_SETTINGS:
        value = getattr(config.model, key)
        if value == getattr(defaults, key):
            continue
        if any(is_image_space(space) for space in observation_spaces.values()):
            why = "the networks read none of its image groups (model.actor_inputs, model.critic_inputs)"
        else:
            why = "the env has no image observations"
        raise ConfigError(
            f"model.{key}: {value} can have no effect: {why} ({config.env.id}: {sorted(observation_spaces)}); "
            f"leave model.{key} out"
        )


def check_renders(config: Config) -> None:
    """A ``ConfigError`` when the env of ``config`` cannot draw its rows for a video (``eval.video``, ``raysim eval
    --video``): one row is built as a filmed evaluation builds it and drawn once."""
    env_id = config.env.id
    try:
        with captured():  # what building the env prints was said by ``check_env_and_model``
            env = make(env_id, 1, seed=0, **with_pictures(env_id, config.env.kwargs))
    except Exception as error:  # noqa: BLE001 - e.g. a Gymnasium env that takes no render_mode
        raise ConfigError(
            f"a video of {env_id} cannot be made: building it to draw failed: {one_line(error)}"
        ) from error
    try:
        env.frames(config.eval.video_size)
    except CannotRender as error:
        raise ConfigError(f"a video of {env_id} cannot be made: {one_line(error)}") from error
    finally:
        env.close()


def check_policy(config: Config, policy: str) -> None:
    """A ``ConfigError`` when the env of ``config`` cannot play the scripted ``policy`` (``raysim.rollout.policies``:
    no scripted expert, an unbounded action space): its rows are built as an evaluation shard builds them."""
    env_id = config.env.id
    rows = row_multiple(env_id, config.env.kwargs)
    with captured():  # what building the env prints was said by ``check_env_and_model``
        env = make(env_id, rows, seed=0, evaluation=True, success=config.env.success, **config.env.kwargs)
    try:
        scripted_policy(policy, stacked(env, config.env.frame_stack))
    except ValueError as error:
        raise ConfigError(f"--policy {policy}: {one_line(error)}") from error
    finally:
        env.close()


def check_weights_fit(spaces: tuple[Any, Any], config: Config, saved: dict[str, Any], where: str) -> None:
    """A ``ConfigError`` when a checkpoint's model weights (``saved``) do not fit the model ``config`` builds on
    ``spaces``: a resume with ``--force`` past an env whose observation or action shapes changed."""
    built = ActorCritic(*spaces, config.model).state_dict()
    for name, tensor in built.items():
        have = saved.get(name)
        if have is not None and tuple(have.shape) != tuple(tensor.shape):
            raise ConfigError(
                f"{where}: the checkpoint's weights do not fit this env: {name} is {list(have.shape)} in the "
                f"checkpoint and {list(tensor.shape)} here (the observation or action shapes changed, which --force "
                "cannot bridge)"
            )


def check_run_dir(run_dir: str, resume: bool = False) -> None:
    """A ``ConfigError`` when nothing can be written at the local ``run_dir`` (a read-only filesystem, a file
    on its path): said before Ray starts, where it was an ``OSError`` from inside the run."""
    problem = None if is_uri(run_dir) else unwritable(run_dir)
    if problem:
        what = "copy the run where it can be written and resume it there" if resume else "choose another --run-dir"
        raise ConfigError(f"run_dir {run_dir}: {problem}: {what}")


def one_line(error: BaseException) -> str:
    """The first line of an error's message (Gymnasium's and the tasks' messages can run on)."""
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]
