"""``Settings`` reads the environment as pydantic-settings' ``BaseSettings`` did for it (the
model was one until it stopped loading pydantic-settings): for any environment, the values
``environment_values`` finds are those pydantic-settings' environment source finds with the
model's former configuration (prefix ``MANA_AI_``, any case, empty values unset, lists and
mappings never decoded as JSON)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings.sources import EnvSettingsSource

from worker.settings import load_settings
from worker.settings_model import ENV_PREFIX, Settings
from worker.settings_values import environment_values


class FormerSettings(Settings, BaseSettings):  # type: ignore[misc]
    """``Settings`` configured as it was as a ``BaseSettings``."""

    model_config: ClassVar[SettingsConfigDict] = SettingsConfigDict(  # type: ignore[misc]
        env_prefix=ENV_PREFIX,
        case_sensitive=False,
        env_ignore_empty=True,
        enable_decoding=False,  # every list and mapping field was NoDecode
    )


def former_values(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr("os.environ", environ)
    return EnvSettingsSource(FormerSettings)()


NAMES = ["database_url", "policy_mode", "mcp_scopes", "policy_tool_rate_limits", "nope"]
VARIABLE = st.tuples(
    st.sampled_from(NAMES), st.sampled_from(["upper", "lower", "title"]), st.booleans()
).map(lambda t: getattr(("mana_ai_" if t[2] else "MANA_AI_") + t[0], t[1])())
VALUE = st.sampled_from(["", " ", "x", '["a", "b"]', '{"a": 3}', "a=3", "null", "1e300"])


@settings(max_examples=200, deadline=None)
@given(environ=st.lists(st.tuples(VARIABLE, VALUE), max_size=6).map(dict))
def test_the_environment_is_read_as_pydantic_settings_read_it(environ: dict[str, str]) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        expected = former_values({"PATH": "/bin", **environ}, monkeypatch)
    assert environment_values(Settings.model_fields, {"PATH": "/bin", **environ}) == expected


def test_given_values_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MANA_AI_POLICY_MODE", "enforce")
    monkeypatch.setenv("MANA_AI_LEASE_S", "120")
    settings = load_settings(policy_mode="off")
    assert (settings.policy_mode, settings.lease_s) == ("off", 120)
    assert {"policy_mode", "lease_s"} <= settings.model_fields_set
    assert "data_dir" not in settings.model_fields_set
