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


def reread() -> None:
    """The settings are read again at the next look: call it once a test's file and
    variables are in place (a thread an earlier test left, the connections' watch, reads
    them every few seconds, perhaps between the fixture's reset and the test's writes)."""
    config._resolved = None


def test_defaults(fresh_config):
    assert config.get("backend") == "local"
    assert config.get("docker_network") == "host"
    assert config.get("log_level") == "WARNING"


def test_precedence_file_env_code(fresh_config, monkeypatch):
    (fresh_config / ".fiberlite.toml").write_text('backend = "docker"\nimage = "from-file"\ncpu = 2\n')
    reread()
    assert config.get("backend") == "docker" and config.get("cpu") == 2.0
    monkeypatch.setenv("FIBERLITE_IMAGE", "from-env")
    reread()
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
    reread()
    with pytest.raises(ConfigError) as info:
        config.settings()
    message = str(info.value)
    assert repr(name) in message and f"FIBERLITE_{name.upper()}" in message and needle in message


def test_unknown_setting_in_code_and_file(fresh_config, monkeypatch):
    with pytest.raises(ConfigError, match="unknown setting 'bakend'"):
        fiberlite.init(bakend="docker")
    (fresh_config / "custom.toml").write_text("colour = 'blue'\n")
    monkeypatch.setenv("FIBERLITE_CONFIG", str(fresh_config / "custom.toml"))
    reread()
    with pytest.raises(ConfigError, match="colour"):
        config.settings()


def test_a_renamed_setting_names_its_new_name(fresh_config):
    with pytest.raises(ConfigError, match="'parent_timeout' .* is now 'peer_timeout'"):
        fiberlite.init(parent_timeout=30)
    with pytest.raises(ConfigError, match="is now 'peer_timeout'"):
        config.get("parent_timeout")


def test_bad_toml_and_missing_config_file(fresh_config, monkeypatch):
    (fresh_config / ".fiberlite.toml").write_text("backend = \n")
    reread()
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.settings()
    monkeypatch.setenv("FIBERLITE_CONFIG", "/nonexistent/fiberlite.toml")
    reread()
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


# -- settings a backend declares ----------------------------------------------------------------
TOY_BACKEND = '''
from fiberlite.config import Setting, positive_count, text
from fiberlite.backends.local.backend import LocalBackend

SETTINGS = (
    Setting("toy_queue", "default", text, "the toy cluster's queue"),
    Setting("toy_slots", 2, positive_count, "slots per toy job"),
)


class ToyBackend(LocalBackend):
    name = "toy"

    def workers_per_job(self, processes, cpu):
        from fiberlite import config
        return config.get("toy_slots")
'''


@pytest.fixture
def toy_plugin(fresh_config, monkeypatch):
    """A backend of another package, ``toy``, found through its entry point."""
    import sys
    from fiberlite import backends, plugins
    (fresh_config / "toy_backend.py").write_text(TOY_BACKEND)
    monkeypatch.delitem(sys.modules, "toy_backend", raising=False)
    monkeypatch.delitem(backends._instances, "toy", raising=False)
    monkeypatch.syspath_prepend(str(fresh_config))
    monkeypatch.setattr(plugins, "_entry_points", lambda: {"toy": "toy_backend:ToyBackend"})
    monkeypatch.setattr(config, "_table", None)
    monkeypatch.setattr(config, "_table_has_plugins", False)
    for name in ("TOY_QUEUE", "TOY_SLOTS"):
        monkeypatch.delenv("FIBERLITE_" + name, raising=False)
    yield fresh_config
    config._table = None  # the toy's settings go with it
    sys.modules.pop("toy_backend", None)
    backends._instances.pop("toy", None)


def test_the_built_in_backends_declare_their_settings_in_their_packages():
    import importlib
    owners = {"docker": ("docker_network", "mount_working_dir"), "kubernetes": ("namespace", "kubeconfig"),
              "slurm": ("slurm_partition", "slurm_account", "slurm_qos", "slurm_time", "slurm_options",
                        "slurm_dir")}
    core = {s.name for s in config.CORE}
    for backend, names in owners.items():
        package = importlib.import_module(f"fiberlite.backends.{backend}")
        assert tuple(s.name for s in package.SETTINGS) == names
        assert core.isdisjoint(names) and set(names) <= set(config.SETTINGS)


def test_backend_settings_work_as_every_other(fresh_config, monkeypatch):
    (fresh_config / ".fiberlite.toml").write_text('slurm_partition = "gpu"\ndocker_network = "bridge"\n')
    monkeypatch.setenv("FIBERLITE_SLURM_QOS", "high")
    reread()
    assert (config.get("slurm_partition"), config.get("slurm_qos")) == ("gpu", "high")
    assert config.get("docker_network") == "bridge" and config.get("mount_working_dir") is True
    monkeypatch.setenv("FIBERLITE_MOUNT_WORKING_DIR", "maybe")
    reread()
    with pytest.raises(ConfigError, match="'mount_working_dir' .*FIBERLITE_MOUNT_WORKING_DIR.*true or false"):
        config.settings()
    with pytest.raises(ConfigError, match="unknown setting 'slurm_partiton'.*slurm_partition"):
        fiberlite.init(slurm_partiton="x")


def test_reading_settings_imports_no_backend_but_their_settings():
    from interpreters import run_python
    done = run_python("-c", "import sys, fiberlite; fiberlite.config.settings(); "
                            "print(sorted(m for m in sys.modules if m.startswith('fiberlite.backends.')))",
                      timeout=60, clean=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['fiberlite.backends.base',", "'fiberlite.backends.docker',",
                                   "'fiberlite.backends.kubernetes',", "'fiberlite.backends.local',",
                                   "'fiberlite.backends.slurm']"]


def test_a_plugin_backend_declares_settings_read_when_it_is_chosen(toy_plugin, monkeypatch):
    assert "toy_queue" not in config.SETTINGS  # entry points are not read for built-in backends
    monkeypatch.setenv("FIBERLITE_BACKEND", "toy")
    monkeypatch.setenv("FIBERLITE_TOY_QUEUE", "short")
    reread()
    assert config.get("backend") == "toy" and config.get("toy_queue") == "short"
    assert config.get("toy_slots") == 2
    monkeypatch.setenv("FIBERLITE_TOY_SLOTS", "0")
    reread()
    with pytest.raises(ConfigError, match="'toy_slots' .*FIBERLITE_TOY_SLOTS.*at least 1"):
        config.settings()


def test_a_plugin_setting_named_in_code_or_file_is_found(toy_plugin):
    fiberlite.init(toy_slots=5)  # backend still local: the name makes the entry points be read
    assert config.get("toy_slots") == 5 and config.get("toy_queue") == "default"
    from fiberlite.pool.master.packing import workers_per_job
    from fiberlite.runtime.launch_options import LaunchOptions
    toy = type("ToyProcess", (), {"launch_options": LaunchOptions(backend="toy")})
    assert workers_per_job(12, toy) == 5 and workers_per_job(3, toy) == 3  # the backend says, up to the pool
    with pytest.raises(ConfigError, match="unknown setting 'toy_colour'.*toy_queue, toy_slots"):
        config.get("toy_colour")
    config.adopt({"toy_queue": "long", "backend": "local"})
    assert config.get("toy_queue") == "long"


def test_a_plugin_may_not_declare_a_setting_fiberlite_has(toy_plugin):
    (toy_plugin / "toy_backend.py").write_text(TOY_BACKEND.replace('"toy_queue"', '"namespace"'))
    with pytest.raises(ConfigError, match="backend 'toy' declares the setting 'namespace', which another"):
        config.known_settings(plugins=True)


def test_the_built_in_backends_are_the_entry_points_pyproject_registers():
    """plugins.BUILTIN spares a process the slow read of entry points; it must say what
    pyproject.toml registers, which is what another package's backend does too."""
    import os
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    from fiberlite.plugins import BUILTIN, GROUP
    from paths import ROOT
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        registered = tomllib.load(file)["project"]["entry-points"][GROUP]
    assert registered == BUILTIN
