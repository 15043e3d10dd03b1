"""The shape of the code: dependencies point one way, no import cycles, short functions, a clean linter."""

from __future__ import annotations

import ast
import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raysim.algos import Algorithm, OptimizerConfig, algorithm_class
from raysim.algos.optimizer import missing_settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "raysim"
#: The core, lowest first: each may import only those before it (docs/concepts.md, "Architecture").
CORE = ("seeding", "schema", "envs", "models", "rollout", "algos")
#: What the roles above the core must never import.
NEVER = {
    "learner": {
        "coordinator",
        "cli",
        "config",
        "checkpoint",
        "metrics",
        "evaluation",
        "storage",
        "plot",
        "export",
        "bench",
    },
    "coordinator": {"cli", "plot", "export", "bench"},
}
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every raysim module ``path`` imports, anywhere in it (lazy and TYPE_CHECKING imports included)."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # ``from package import submodule`` runs the package's ``__init__`` too: both are imported
            names = [base] + [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
        else:
            continue
        found |= {name for name in names if name.split(".")[0] == "raysim" and name in known}
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def unit(module: str) -> str:
    """The subpackage or top-level module a module belongs to (``raysim.rollout.shard`` -> ``rollout``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "raysim"


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_modules_lazy_imports_included():
    assert cycle(graph()) is None, " -> ".join(cycle(graph()))


def test_no_cycle_between_subpackages_and_top_level_modules():
    units: dict[str, set[str]] = {}
    for module, targets in graph().items():
        if module == "raysim":  # the package's own __init__ re-exports the public API
            continue
        units.setdefault(unit(module), set()).update(
            unit(t) for t in targets if unit(t) not in (unit(module), "raysim")
        )
    found = cycle(units)
    assert found is None, " -> ".join(found)


def test_the_core_imports_only_what_lies_below_it_and_the_roles_never_import_upwards():
    offenders = []
    for module, targets in graph().items():
        here = unit(module)
        for target in {unit(t) for t in targets} - {here}:
            if here in CORE and (target not in CORE or CORE.index(target) > CORE.index(here)):
                offenders.append(f"{module} imports raysim.{target}")
            if target in NEVER.get(here, ()):
                offenders.append(f"{module} imports raysim.{target}")
    assert not offenders, offenders


def test_the_graph_sees_lazy_imports():
    edges = graph()
    assert "raysim.envs.gym_adapter" in edges["raysim.envs.registry"]  # imported inside make()
    assert "raysim.coordinator" in edges["raysim.cli"]  # imported inside train()
    assert (
        cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"] and cycle({"a": {"b"}, "b": set()}) is None
    )


def test_from_a_package_import_a_submodule_counts_as_importing_the_package(tmp_path, monkeypatch):
    """``from raysim.coordinator import faults`` runs ``raysim/coordinator/__init__.py`` (which imports the trainer):
    the graph sees the package, so such an import inside the package shows up as a cycle."""
    source = tmp_path / "raysim" / "coordinator" / "saving.py"  # a module of the package, in a copy of the tree
    source.parent.mkdir(parents=True)
    source.write_text("from raysim.coordinator import faults\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    known = {
        name: PACKAGE for name in ("raysim.coordinator", "raysim.coordinator.faults", "raysim.coordinator.trainer")
    }
    edges = {"raysim.coordinator.saving": imports(source, known), "raysim.coordinator": {"raysim.coordinator.trainer"}}
    assert edges["raysim.coordinator.saving"] == {"raysim.coordinator", "raysim.coordinator.faults"}
    edges["raysim.coordinator.trainer"] = {"raysim.coordinator.saving"}
    assert cycle(edges) is not None


def test_no_function_in_raysim_is_longer_than_sixty_lines_unless_a_comment_says_why():
    long = []
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                reason = "# long:" in lines[first - 2] if first >= 2 else False
                if length > MAX_FUNCTION_LINES and not reason:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long


def environment_reads(tree: ast.AST) -> list[str]:
    """The names in ``os.environ.get(NAME)``, ``os.getenv(NAME)`` and ``os.environ[NAME]`` (string constants)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv") and node.args:
            key = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            key = node.slice
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.append(key.value)
    return names


def test_production_code_reads_no_test_hook_from_the_environment():
    read, mentions = set(), []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        read |= set(environment_reads(ast.parse(text)))
        if "RAYSIM_FAULT" in text:
            mentions.append(str(path.relative_to(ROOT)))
    assert "RAYSIM_DEBUG" in read  # the scan finds what raysim does read
    assert not [name for name in read if "FAULT" in name or "TEST" in name] and not mentions, mentions


def assigned_attributes(node: ast.AST) -> set[str]:
    """The ``X`` of every ``self.X = ...``, ``self.X += ...`` and ``with ... as self.X`` within ``node``."""
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Assign):
            targets = child.targets
        elif isinstance(child, (ast.AnnAssign, ast.AugAssign)):
            targets = [child.target]
        elif isinstance(child, ast.withitem) and child.optional_vars is not None:
            targets = [child.optional_vars]
        else:
            continue
        for target in targets:
            for item in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) and item.value.id == "self":
                    names.add(item.attr)
    return names


def attributes_created_outside_init(cls: ast.ClassDef) -> set[str]:
    """The attributes a class's methods assign that neither its ``__init__`` nor its body (dataclass fields) creates."""
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    methods = [m for m in cls.body if isinstance(m, ast.FunctionDef)]
    in_init = set().union(*(assigned_attributes(m) for m in methods if m.name == "__init__"))
    elsewhere = set().union(*(assigned_attributes(m) for m in methods if m.name != "__init__"))
    return elsewhere - in_init - fields


def test_every_attribute_of_a_coordinator_class_is_created_in_its_init():
    late = []
    for path in (PACKAGE / "coordinator").rglob("*.py"):
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            if found := attributes_created_outside_init(cls):
                late.append(f"{path.relative_to(ROOT)}: {cls.name}: {sorted(found)}")
    assert not late, late
    example = ast.parse(
        "class A:\n    def __init__(self):\n        self.a = 1\n    def f(self):\n        self.a, self.b = 2, 3"
    )
    assert attributes_created_outside_init(example.body[0]) == {"b"}  # the check sees a late attribute


def ruff() -> list[str]:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    return [found]


def test_ruff_check_is_clean():
    result = subprocess.run(
        [*ruff(), "check", "raysim", "tests", "benchmarks", "examples"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_format_leaves_every_file_as_it_is():
    result = subprocess.run(
        [*ruff(), "format", "--check", "raysim", "tests", "benchmarks", "examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_a_third_algorithm_trains_through_the_unchanged_learner_and_coordinator(tmp_path):
    import raysim

    (tmp_path / "reinforce.yaml").write_text(
        "name: reinforce\nenv: {id: raysim/CartPole, num_envs: 8}\n"
        "algo: {name: 'examples.custom_algorithm:Reinforce'}\n"
    )
    overrides = ["backend=local", "train.total_steps=8192", "train.log_every=4", "eval.episodes=10"]
    config = raysim.load_config(tmp_path / "reinforce.yaml", [*overrides, f"run_dir={tmp_path / 'run'}"])
    assert type(config.algo).__name__ == "ReinforceConfig" and config.model.critic is False  # critic-free by default
    summary = raysim.Trainer(config, sinks=[]).train()
    assert summary.iterations == 16 and summary.env_steps == 8192
    assert "pg_loss" in summary.metrics and "v_loss" not in summary.metrics
    assert summary.metrics["episode_return"] > 30, summary.metrics  # a random policy averages ~22
    resumed = raysim.load_config(tmp_path / "run" / "configs" / "train.yaml")
    assert resumed.algo.name == "examples.custom_algorithm:Reinforce"


def test_an_unknown_algorithm_name_is_an_error_that_lists_the_registered_ones():
    import raysim
    from raysim.config import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"algo.name must be one of \['bc', 'distill', 'grpo', 'ppo', 'sac'\] or 'module:Class', got 'ppp'",
    ):
        raysim.load_config(None, ["algo.name=ppp"])


@dataclasses.dataclass
class NoLearningRateConfig:
    name: str = "tests.test_architecture:NoLearningRate"
    update_epochs: int = 1
    num_minibatches: int = 1


class NoLearningRate(Algorithm):
    name = "no-lr"
    Config = NoLearningRateConfig


def test_every_registered_algorithms_config_declares_the_settings_the_learner_reads():
    for name in ("ppo", "grpo"):
        config = algorithm_class(name).Config()
        assert isinstance(config, OptimizerConfig) and missing_settings(type(config)) == [], name


def test_an_algorithm_whose_config_lacks_a_setting_the_learner_reads_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"its Config lacks lr, lr_schedule, max_grad_norm, max_nonfinite_updates"):
        algorithm_class("tests.test_architecture:NoLearningRate")
