"""Local-mode settings from an environment snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.core.errors import ConfigError
from flexinfer.local.config import local_config, resolve_admin_token, state_dir


def test_defaults(tmp_path: Path) -> None:
    config = local_config({"HOME": "/home/u"}, tmp_path, cold_start_timeout=42, queue_limit=7)
    assert config.engine.stop_grace == 10 and config.engine.start_timeout == 300
    assert config.engine.log_dir == Path("/home/u/.local/state/flexinfer/logs")
    assert config.engine.shm_root == Path("/dev/shm/flexinfer") and config.engine.base_dir == tmp_path
    assert config.policy.min_hold == 15 and config.policy.max_wait == 30 and config.policy.drain_timeout == 30
    assert config.policy.cold_start_timeout == 42 and config.policy.queue_limit == 7
    assert config.policy.restart_changed, "serve restarts a model whose manifest changed"


def test_overrides(tmp_path: Path) -> None:
    env = {"FLEXINFER_STATE_DIR": "/var/x", "FLEXINFER_SHM_ROOT": "/tmp/shm", "FLEXINFER_STOP_GRACE": "2s",
           "FLEXINFER_SWAP_MIN_HOLD": "0s", "FLEXINFER_START_TIMEOUT": "1m", "FLEXINFER_RESTART_BACKOFF": "500ms"}
    config = local_config(env, tmp_path)
    assert config.engine.log_dir == Path("/var/x/logs") and config.engine.shm_root == Path("/tmp/shm")
    assert config.engine.stop_grace == 2 and config.engine.start_timeout == 60
    assert config.policy.min_hold == 0 and config.policy.restart_backoff == 0.5
    assert config.engine.env["FLEXINFER_STOP_GRACE"] == "2s"


def test_xdg_state_home() -> None:
    assert state_dir({"XDG_STATE_HOME": "/s", "HOME": "/h"}) == Path("/s/flexinfer")


def test_malformed_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="FLEXINFER_STOP_GRACE"):
        local_config({"FLEXINFER_STOP_GRACE": "soon"}, tmp_path)


def test_the_admin_token_comes_from_its_file_or_the_environment(tmp_path: Path) -> None:
    config = local_config({"FLEXINFER_ADMIN_TOKEN": " from-env \n"}, tmp_path)
    assert resolve_admin_token(config, None) == "from-env"
    assert resolve_admin_token(local_config({}, tmp_path), None) == "", "unset: the admin routes follow PROXY_AUTH_*"
    token_file = tmp_path / "admin-token"
    token_file.write_text("from-file\n")
    assert resolve_admin_token(config, token_file) == "from-file", "the file wins, its trailing newline stripped"


def test_an_empty_or_unreadable_token_file_stops_start_up_naming_the_flag(tmp_path: Path) -> None:
    config = local_config({}, tmp_path)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"^--admin-token-file: .*empty is empty$"):
        resolve_admin_token(config, tmp_path / "empty")
    with pytest.raises(ConfigError, match=r"^--admin-token-file: cannot read .*missing: No such file or directory$"):
        resolve_admin_token(config, tmp_path / "missing")
