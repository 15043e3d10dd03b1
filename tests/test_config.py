"""Config loading: defaults, overrides, and errors that name the key (and the closest valid one)."""

from __future__ import annotations

import pytest

import raysim
from raysim.cli import main
from raysim.config import Config, ConfigError, load_config


def write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_the_packaged_config_loads_by_default_and_by_name():
    default = load_config(None)
    by_name = load_config("cartpole_ppo")
    assert isinstance(default, Config)
    assert default == by_name
    assert default.env.id == "raysim/CartPole" and default.algo.name == "ppo"
    assert raysim.load_config is load_config


def test_overrides_are_parsed_as_yaml_and_reach_nested_sections():
    config = load_config(
        None,
        overrides=[
            "algo.lr=1e-3",
            "algo.clip_coef=0.1",
            "shards.count=2",
            "model.hidden_sizes=[32, 32]",
            "backend=local",
            "algo.target_kl=null",
        ],
    )
    assert config.algo.lr == pytest.approx(1e-3) and isinstance(config.algo.lr, float)
    assert config.algo.clip_coef == 0.1
    assert config.shards.count == 2
    assert config.model.hidden_sizes == [32, 32]
    assert config.backend == "local"
    assert config.algo.target_kl is None


def test_exponent_notation_without_a_dot_is_a_float_in_files_and_overrides(tmp_path):
    # PyYAML's YAML 1.1 reads "1e-3" as a string; the CLI's own example is --set algo.lr=1e-3
    config = load_config(
        write(tmp_path, "algo:\n  lr: 3e-4\n  target_kl: 1E-2\n"), overrides=["algo.max_grad_norm=5e-1"]
    )
    assert config.algo.lr == pytest.approx(3e-4)
    assert config.algo.target_kl == pytest.approx(1e-2)
    assert config.algo.max_grad_norm == pytest.approx(0.5)


def test_an_int_is_widened_to_float_but_a_bool_is_not_an_int():
    assert load_config(None, overrides=["algo.lr=1"]).algo.lr == 1.0
    assert isinstance(load_config(None, overrides=["algo.lr=1"]).algo.lr, float)
    with pytest.raises(ConfigError, match=r"shards\.count must be int, got True"):
        load_config(None, overrides=["shards.count=true"])


def test_an_unknown_nested_key_is_named_with_the_closest_valid_key(tmp_path):
    path = write(tmp_path, "algo:\n  clip_cof: 0.1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message
    assert "'algo.clip_cof'" in message
    assert "did you mean 'algo.clip_coef'?" in message


def test_an_unknown_key_in_an_override_is_named_with_the_closest_valid_key():
    with pytest.raises(ConfigError, match=r"unknown key 'sead'; did you mean 'seed'\?"):
        load_config(None, overrides=["sead=3"])
    with pytest.raises(ConfigError, match=r"unknown key 'train\.total_step'; did you mean 'train\.total_steps'\?"):
        load_config(None, overrides=["train.total_step=10"])


def test_an_unknown_key_without_a_close_match_lists_the_valid_keys():
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'learner\.zzzzzz'; valid keys: "
        r"\['device', 'max_restarts', 'num_cpus', 'num_gpus', 'ranks', 'resources'\]",
    ):
        load_config(None, overrides=["learner.zzzzzz=1"])


def test_a_value_of_the_wrong_type_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"algo\.lr must be float, got 'fast'"):
        load_config(write(tmp_path, 'algo:\n  lr: "fast"\n'))
    with pytest.raises(ConfigError, match=r"model\.hidden_sizes\[1\] must be int, got 'x'"):
        load_config(None, overrides=["model.hidden_sizes=[64, x]"])
    with pytest.raises(ConfigError, match=r"algo must be a mapping"):
        load_config(None, overrides=["algo=3"])


def test_a_missing_config_file_is_a_clear_error():
    with pytest.raises(
        ConfigError, match=r"config file 'no/such/file\.yaml' not found \(packaged configs: \[.*'cartpole_ppo\.yaml'"
    ):
        load_config("no/such/file.yaml")


def test_a_file_that_is_not_a_mapping_or_not_yaml_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="the top level must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "algo: [1, 2\n"))


@pytest.mark.parametrize(
    "item, pattern",
    [
        ("algo.lr", r"--set 'algo\.lr': expected key=value"),
        ("algo.lr=[1, 2", r"--set 'algo\.lr=\[1, 2': the value is not valid YAML"),
        ("seed.x=1", r"--set 'seed\.x=1': 'seed' is not a section"),
        ("=3", r"--set '=3': expected key=value"),
        ("algo..lr=3", r"--set 'algo\.\.lr=3': expected key=value"),
    ],
)
def test_bad_override_syntax_is_a_config_error_that_quotes_the_override(item, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(None, overrides=[item])


def test_cli_train_with_a_missing_config_exits_2_with_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "nonexistent.yaml"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("raysim: error: ") and "nonexistent.yaml" in lines[0] and "not found" in lines[0]
    assert captured.out == ""
    assert not (tmp_path / "runs").exists()


def test_cli_train_with_a_bad_override_exits_2_naming_the_key(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--set", "algo.clip_cof=0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'algo.clip_cof'" in err[0] and "'algo.clip_coef'" in err[0]
    assert main(["train", "--set", "algo.lr"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected key=value" in err[0]
    assert not (tmp_path / "runs").exists()


def test_the_old_name_shards_first_arrived_is_read_as_shards_wait_fraction_with_a_one_line_note(tmp_path, capsys):
    old = write(tmp_path, "shards:\n  count: 2\n  first_arrived: 0.5\n")
    assert load_config(old).shards.wait_fraction == 0.5
    note = capsys.readouterr().err
    assert note.count("\n") == 1 and note.startswith(f"raysim: {old}: shards.first_arrived is deprecated")
    assert note.endswith("read as shards.wait_fraction, its new name\n")
    assert load_config(old, ["shards.wait_fraction=0.25"]).shards.wait_fraction == 0.25  # --set wins over the file
    assert load_config(None, ["shards.first_arrived=0.75"]).shards.wait_fraction == 0.75
    assert load_config(None, ["shards={count: 2, first_arrived: 0.75}"]).shards.wait_fraction == 0.75
    assert capsys.readouterr().err.count("shards.first_arrived is deprecated") == 3
    both = write(tmp_path, "shards:\n  first_arrived: 0.5\n  wait_fraction: 0.5\n")
    with pytest.raises(ConfigError, match="shards.first_arrived is the old name of shards.wait_fraction: set only"):
        load_config(both)
    with pytest.raises(ConfigError, match="shards.wait_fraction must be > 0, got 0"):
        load_config(None, ["shards.first_arrived=0"])  # checked under its new name


def test_a_recurrent_model_is_checked_against_the_rows_that_arrive_with_wait_fraction_below_one():
    """4 shards x 1 env, half of them awaited: a rank trains on 2 rows, too few for 4 minibatches of whole rows."""
    lstm = ["shards.count=4", "env.num_envs=1", "shards.wait_fraction=0.5", "model.recurrent=lstm"]
    with pytest.raises(ConfigError, match=r"a learner rank's 2 rows \(the first 2 of its 4 shards to arrive, "):
        load_config(None, [*lstm, "algo.num_minibatches=4"])
    assert load_config(None, [*lstm, "algo.num_minibatches=2"]).shards.wait_fraction == 0.5
    sets = ["shards.count=4", "shards.wait_fraction=0.25", "env.num_envs=1", "algo.num_steps=32"]
    with pytest.raises(ConfigError, match="batch of 32 transitions .the first 1 of its 4 shards to arrive"):
        load_config(None, [*sets, "algo.num_minibatches=64"])


def test_elastic_recurrent_rows_need_not_divide_into_minibatches_but_the_fewest_must_fill_them():
    elastic = ["shards.count=3", "shards.max=6", "env.num_envs=1", "model.recurrent=lstm"]
    assert load_config(None, [*elastic, "algo.num_minibatches=2"]).shards.max == 6  # 3 to 6 rows, split unevenly
    with pytest.raises(ConfigError, match="can train on as few as 3 rows .* fewer than algo.num_minibatches .4."):
        load_config(None, [*elastic, "algo.num_minibatches=4"])
