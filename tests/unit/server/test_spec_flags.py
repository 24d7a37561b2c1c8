"""Speculative decoding flags as llama-server (the llama-cpp-python 0.3.36 sdist's
common/arg.cpp) names them: defaults, ranges and their messages, the type list (llama.cpp's
priority order; `none`; the types loraserve lacks refused clearly), `-md`, `--spec-default`,
the draft-tuning flags accepted and ignored, and the removed flags answered with their
replacement, as llama-server does (exit status 2 here)."""

from __future__ import annotations

import pytest

from loraserve.engine.spec.config import SpecConfig, SpecRequest, parse_types
from loraserve.server.config.args import parse_server_args


def spec(*argv: str) -> SpecConfig:
    return parse_server_args(list(argv)).spec


def refused(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        parse_server_args(list(argv))
    assert e.value.code == 2
    return capsys.readouterr().err


def test_defaults_are_llama_servers() -> None:
    d = spec()
    assert d.types == () and not d.enabled and d.draft_model is None
    assert (d.draft_n_max, d.draft_n_min, d.draft_p_min) == (3, 0, 0.0)
    assert (d.ngram_simple_size_n, d.ngram_simple_size_m, d.ngram_simple_min_hits) == (12, 48, 1)
    assert (d.ngram_mod_n_match, d.ngram_mod_n_min, d.ngram_mod_n_max) == (24, 48, 64)


def test_every_flag_sets_its_field() -> None:
    s = spec(
        "--spec-type", "ngram-mod,ngram-simple",
        "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "9",
        "--spec-ngram-simple-min-hits", "2",
        "--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "5",
        "--spec-ngram-mod-n-max", "6",
        "--spec-draft-n-max", "7", "--spec-draft-n-min", "1", "--draft-p-min", "0.5",
    )  # fmt: skip
    assert s.types == ("ngram-simple", "ngram-mod")  # llama.cpp's priority, not the order given
    assert (s.ngram_simple_size_n, s.ngram_simple_size_m, s.ngram_simple_min_hits) == (3, 9, 2)
    assert (s.ngram_mod_n_match, s.ngram_mod_n_min, s.ngram_mod_n_max) == (4, 5, 6)
    assert (s.draft_n_max, s.draft_n_min, s.draft_p_min) == (7, 1, 0.5)


def test_type_lists_add_up_and_none_clears() -> None:
    assert spec("--spec-type", "ngram-mod", "--spec-type", "ngram-simple").types == (
        "ngram-simple",
        "ngram-mod",
    )
    assert spec("--spec-type", "ngram-mod,none").types == ()
    assert spec("--spec-default").types == ("ngram-mod",)
    d = spec("--spec-default")
    assert (d.ngram_mod_n_match, d.ngram_mod_n_min, d.ngram_mod_n_max) == (24, 48, 64)


def test_draft_model_flags() -> None:
    for flag in ("-md", "--model-draft", "--spec-draft-model"):
        s = spec(flag, "draft.gguf")
        assert s.draft_model == "draft.gguf" and s.types == ("draft-simple",)
    s = spec("-md", "d.gguf", "--spec-type", "ngram-simple,draft-simple")
    assert s.types == ("ngram-simple", "draft-simple")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--spec-type", "ngram-cache"], "speculative type ngram-cache is not supported"),
        (["--spec-type", "draft-eagle3"], "supported: ngram-simple, ngram-mod, draft-simple"),
        (["--spec-type", "bogus"], "unknown speculative type: bogus"),
        (["--spec-type", "draft-simple"], "draft-simple needs a draft model (-md FNAME)"),
        (["--spec-ngram-mod-n-match", "0"], "ngram size N must be between 1 and 1024 inclusive"),
        (["--spec-ngram-mod-n-max", "1025"], "ngram n-max must be between 0 and 1024 inclusive"),
        (["--spec-ngram-mod-n-min", "-1"], "ngram n-min must be between 0 and 1024 inclusive"),
        (["--spec-ngram-simple-size-n", "0"], "ngram size N must be between 1 and 1024"),
        (["--spec-ngram-simple-size-m", "2000"], "ngram size M must be between 1 and 1024"),
        (["--spec-ngram-simple-min-hits", "0"], "ngram min hits must be at least 1"),
        (["--spec-draft-n-max", "-1"], "argument --spec-draft-n-max: invalid value"),
        (["--spec-draft-p-min", "2"], "--spec-draft-p-min: must be in [0, 1]"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(capsys, argv, message) -> None:
    assert message in refused(capsys, *argv)


@pytest.mark.parametrize(
    "flag, replacement",
    [
        ("--draft", "use --spec-draft-n-max or --spec-ngram-mod-n-max"),
        ("--draft-n", "use --spec-draft-n-max or --spec-ngram-mod-n-max"),
        ("--draft-max", "use --spec-draft-n-max or --spec-ngram-mod-n-max"),
        ("--draft-min", "use --spec-draft-n-min or --spec-ngram-mod-n-min"),
        ("--draft-n-min", "use --spec-draft-n-min or --spec-ngram-mod-n-min"),
        ("--spec-ngram-size-n", "use the respective --spec-ngram-*-size-n"),
        ("--spec-ngram-size-m", "use the respective --spec-ngram-*-size-m"),
        ("--spec-ngram-min-hits", "use the respective --spec-ngram-*-min-hits"),
    ],
)
def test_removed_flags_name_their_replacement(capsys, flag, replacement) -> None:
    err = refused(capsys, flag, "4")
    assert f"argument {flag}: the argument has been removed. {replacement}" in err


def test_draft_tuning_flags_are_accepted_and_ignored() -> None:
    cfg = parse_server_args(["-ngld", "99", "-td", "2", "--spec-draft-cpu-moe", "-devd", "none"])
    assert cfg.ignored == ("-ngld", "-td", "--spec-draft-cpu-moe", "-devd")
    assert cfg.spec == SpecConfig()


def test_parse_types_and_request_fields() -> None:
    assert parse_types("draft-simple,ngram-simple") == ("ngram-simple", "draft-simple")
    SpecRequest(n_max=0, n_min=2, p_min=0.5).validate()
    for bad in (SpecRequest(n_max=-1), SpecRequest(n_min=True), SpecRequest(p_min=1.5)):
        with pytest.raises(ValueError, match="speculative\\."):
            bad.validate()
