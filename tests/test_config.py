"""Settings: defaults < config file < environment < code, and clear errors."""
from __future__ import annotations

import pytest

import fiberlite
from fiberlite import config
from fiberlite.errors import ConfigError


@pytest.fixture
def fresh_config(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(config, "_overrides", {})
    monkeypatch.setattr(config, "_inherited", None)
    monkeypatch.setattr(config, "_resolved", None)
    for name in config.SETTINGS:
        monkeypatch.delenv("FIBERLITE_" + name.upper(), raising=False)
    monkeypatch.delenv("FIBERLITE_CONFIG", raising=False)
    yield tmp_path
    config._resolved = None


def test_defaults(fresh_config):
    assert config.get("backend") == "local"
    assert config.get("docker_network") == "host"
    assert config.get("log_level") == "WARNING"


def test_precedence_file_env_code(fresh_config, monkeypatch):
    (fresh_config / ".fiberlite.toml").write_text('backend = "docker"\nimage = "from-file"\ncpu = 2\n')
    assert config.get("backend") == "docker" and config.get("cpu") == 2.0
    monkeypatch.setenv("FIBERLITE_IMAGE", "from-env")
    config._resolved = None
    assert config.get("image") == "from-env"
    fiberlite.init(image="from-code", memory="1Gi")
    assert config.get("image") == "from-code"
    assert config.get("memory") == 2**30


@pytest.mark.parametrize("name,value,needle", [
    ("backend", "nomad", "available"),
    ("cpu", "lots", "CPU count"),
    ("memory", "12 parsecs", "memory size"),
    ("log_level", "LOUD", "DEBUG"),
    ("start_timeout", "-1", "positive"),
    ("peer_timeout", "-5", "0 for never"),
    ("peer_timeout", "soon", "could not convert"),
    ("idle_timeout", "-1", "0 for never"),
])
def test_invalid_environment_value_names_setting(fresh_config, monkeypatch, name, value, needle):
    monkeypatch.setenv("FIBERLITE_" + name.upper(), value)
    with pytest.raises(ConfigError) as info:
        config.settings()
    message = str(info.value)
    assert repr(name) in message and f"FIBERLITE_{name.upper()}" in message and needle in message


def test_unknown_setting_in_code_and_file(fresh_config, monkeypatch):
    with pytest.raises(ConfigError, match="unknown setting 'bakend'"):
        fiberlite.init(bakend="docker")
    (fresh_config / "custom.toml").write_text("colour = 'blue'\n")
    monkeypatch.setenv("FIBERLITE_CONFIG", str(fresh_config / "custom.toml"))
    with pytest.raises(ConfigError, match="colour"):
        config.settings()


def test_a_renamed_setting_names_its_new_name(fresh_config):
    with pytest.raises(ConfigError, match="'parent_timeout' .* is now 'peer_timeout'"):
        fiberlite.init(parent_timeout=30)
    with pytest.raises(ConfigError, match="is now 'peer_timeout'"):
        config.get("parent_timeout")


def test_bad_toml_and_missing_config_file(fresh_config, monkeypatch):
    (fresh_config / ".fiberlite.toml").write_text("backend = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.settings()
    monkeypatch.setenv("FIBERLITE_CONFIG", "/nonexistent/fiberlite.toml")
    with pytest.raises(ConfigError, match="not a file"):
        config.settings()


def test_meta_validates_and_attaches():
    @fiberlite.meta(cpu="500m", memory="2Gi", gpu=1, image="img:1")
    def target():
        pass
    from fiberlite.meta import requests_of
    assert requests_of(target) == {"cpu": 0.5, "memory": 2 * 2**30, "gpu": 1, "image": "img:1"}
    with pytest.raises(ValueError, match="memory"):
        fiberlite.meta(memory="lots")
    with pytest.raises(ValueError, match="cpu"):
        fiberlite.meta(cpu=-1)


def test_unknown_backend_in_context_is_clear():
    with pytest.raises(ValueError, match="available|backend"):
        fiberlite.get_context("no-such-backend")
