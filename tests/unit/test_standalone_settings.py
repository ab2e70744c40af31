"""What the launcher (`make demo`, the tests' standalone) configures beyond the login
(which test_security.py covers)."""

from tidemark_airflow.standalone import RETRY_DELAY_SETTING, environment


def test_the_launcher_tries_a_failed_task_again_after_half_a_minute(tmp_path, monkeypatch):
    monkeypatch.delenv(RETRY_DELAY_SETTING, raising=False)
    assert environment(tmp_path / "home", tmp_path / "lakehouse", 8080)[RETRY_DELAY_SETTING] == "30"


def test_a_retry_delay_from_the_environment_or_the_settings_wins_over_the_launchers(tmp_path, monkeypatch):
    monkeypatch.setenv(RETRY_DELAY_SETTING, "120")
    assert environment(tmp_path / "home", tmp_path / "lakehouse", 8080)[RETRY_DELAY_SETTING] == "120"
    chosen = environment(tmp_path / "home", tmp_path / "lakehouse", 8080, settings={RETRY_DELAY_SETTING: "5"})
    assert chosen[RETRY_DELAY_SETTING] == "5"
