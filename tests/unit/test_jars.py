import pytest

from spark_jobs import jars


def test_an_unknown_jar_target_is_refused_with_the_targets_there_are():
    with pytest.raises(
        SystemExit,
        match=r"unknown jar targets \['sprak'\]; choose from \['spark', 'token-provider', 'kafka'\]",
    ):
        jars.main(["spark", "sprak"])


def test_the_process_started_for_a_target_resolves_it_and_says_where(monkeypatch, tmp_path, capsys):
    resolved = []
    monkeypatch.setattr(jars, "resolve_one", lambda which: resolved.append(which) or [tmp_path / "a.jar"])
    jars.main([jars.IN_PROCESS, "kafka"])
    assert resolved == ["kafka"]
    assert capsys.readouterr().out == f"tidemark: 1 kafka jars in {tmp_path}\n"
