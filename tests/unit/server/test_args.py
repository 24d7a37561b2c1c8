"""The command line parses as llama-server's does: defaults, short/long forms, LoRA forms,
flags accepted and ignored, and clear errors (exit status 2) on bad values."""

from __future__ import annotations

import dataclasses
import os

import pytest

from loraserve.server.config.args import (
    AUTO_PARALLEL,
    LoraSpec,
    ServerConfig,
    parse_server_args,
)
from loraserve.server.config.llama_flags import (
    IGNORED_OPTIONAL_VALUE,
    IGNORED_SWITCHES,
    IGNORED_WITH_VALUE,
)


def parse(line: str) -> ServerConfig:
    return parse_server_args(line.split())


def parse_error(line: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse(line)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_defaults_are_llama_servers():
    cfg = parse("")
    assert cfg == ServerConfig(router=True)  # no -m: router mode, as llama-server
    assert (cfg.host, cfg.port) == ("127.0.0.1", 8080)
    assert cfg.n_parallel == AUTO_PARALLEL == 4
    assert (cfg.n_ctx, cfg.n_batch, cfg.n_ubatch) == (0, 2048, 512)
    assert (cfg.cache_ram_mib, cfg.cache_prompt) == (8192, True)
    assert (cfg.n_predict, cfg.temperature, cfg.seed, cfg.top_k) == (-1, 0.8, -1, 40)
    assert (cfg.top_p, cfg.min_p, cfg.repeat_penalty, cfg.repeat_last_n) == (0.95, 0.05, 1.0, 64)
    assert cfg.model is None and cfg.lora == () and cfg.api_keys == () and not cfg.metrics
    assert cfg.dtype == "auto" and cfg.ignored == ()


@pytest.mark.parametrize(
    ("short", "long", "field", "value"),
    [
        ("-m a.gguf", "--model a.gguf", "model", "a.gguf"),
        ("-np 3", "--parallel 3", "n_parallel", 3),
        ("-c 4096", "--ctx-size 4096", "n_ctx", 4096),
        ("-b 256", "--batch-size 256", "n_batch", 256),
        ("-ub 128", "--ubatch-size 128", "n_ubatch", 128),
        ("-cram 0", "--cache-ram 0", "cache_ram_mib", 0),
        ("-t 2", "--threads 2", "n_threads", 2),
        ("-n 64", "--n-predict 64", "n_predict", 64),
        ("-n 64", "--predict 64", "n_predict", 64),
        ("--temp 0.2", "--temperature 0.2", "temperature", 0.2),
        ("-s 42", "--seed 42", "seed", 42),
        ("-a m1", "--alias m1", "alias", ("m1",)),
    ],
)
def test_short_and_long_forms(short: str, long: str, field: str, value: object):
    assert getattr(parse(short), field) == value
    assert getattr(parse(long), field) == value


def test_server_flags():
    cfg = parse(
        "--host 0.0.0.0 --port 9000 --metrics --no-cache-prompt --api-key k1,k2 --api-key k3"
        " --alias a,b -cram -1 --dtype int8 --top-k 5 --top-p 0.5 --min-p 0.1"
        " --repeat-penalty 1.1 --repeat-last-n 32 --presence-penalty 0.5 --frequency-penalty 0.25"
    )
    assert (cfg.host, cfg.port, cfg.metrics, cfg.cache_prompt) == ("0.0.0.0", 9000, True, False)
    assert cfg.api_keys == ("k1", "k2", "k3") and cfg.alias == ("a", "b")
    assert (cfg.cache_ram_mib, cfg.dtype, cfg.top_k, cfg.top_p, cfg.min_p) == (
        -1,
        "int8",
        5,
        0.5,
        0.1,
    )
    assert (cfg.repeat_penalty, cfg.repeat_last_n) == (1.1, 32)
    assert (cfg.presence_penalty, cfg.frequency_penalty) == (0.5, 0.25)
    assert parse("--cache-prompt").cache_prompt is True


def test_lora_forms_keep_command_line_order():
    cfg = parse(
        "--lora a.gguf,b --lora-scaled c:0.5,d:-1 --lora e --lora-scaled f 0.25"
        " --lora-scaled dir/with:colon:2 --lora-init-without-apply"
    )
    assert cfg.lora == (
        LoraSpec("a.gguf", 1.0),
        LoraSpec("b", 1.0),
        LoraSpec("c", 0.5),
        LoraSpec("d", -1.0),
        LoraSpec("e", 1.0),
        LoraSpec("f", 0.25),
        LoraSpec("dir/with:colon", 2.0),
    )
    assert cfg.lora_init_without_apply
    assert parse("--lora-scaled x -0.5 -c 8").lora == (LoraSpec("x", -0.5),)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("--lora-scaled a.gguf", "--lora-scaled"),
        ("--lora-scaled a.gguf:", "--lora-scaled"),
        ("--lora-scaled a.gguf:big", "--lora-scaled: expected a number, got 'big'"),
        ("--lora-scaled a b c", "--lora-scaled"),
        ("--lora-scaled a nan", "finite"),
        ("-np 0", "--parallel"),
        ("-np -2", "--parallel"),
        ("--parallel two", "--parallel"),
        ("-c -1", "--ctx-size"),
        ("-b 0", "--batch-size"),
        ("-ub 0", "--ubatch-size"),
        ("-cram -2", "--cache-ram"),
        ("--port 70000", "--port"),
        ("--port -1", "--port"),
        ("-n -2", "--n-predict"),
        ("--temp hot", "--temp"),
        ("--top-p 1.5", "--top-p"),
        ("--min-p -0.1", "--min-p"),
        ("-s -2", "--seed"),
        ("--dtype float16", "--dtype"),
        ("--scan-form parallel", "--scan-form"),
        ("--host", "--host"),
        ("--host a,", "--host: expected addresses"),
        ("--rope-scaling linear", "unrecognized"),
        ("-hf ggml-org/x", "-hf/--hf-repo: ggml-org/x is not in the download cache"),
        ("-hf ggml-org/x --offline", "and was not downloaded (--offline)"),
        ("-mu http://h/x.gguf", "-mu: not supported by loraserve (downloading models"),
        ("--mmproj x.gguf", "not supported"),
        ("--pooling max", "--pooling"),
        ("--sleep-idle-seconds -2", "--sleep-idle-seconds"),
        ("--mdl x", "unrecognized"),
        ("extra", "unrecognized"),
    ],
)
def test_bad_values_exit_2_naming_the_flag(line: str, needle: str, capsys):
    assert needle in parse_error(line, capsys)


def test_ignored_flags_are_accepted_and_consume_their_values():
    cfg = parse("-ngl 99 -c 128 -fa -cb --no-jinja -fa on -kvu -dt 0.1 --no-mmap -fit off -np 2")
    assert (cfg.n_ctx, cfg.n_parallel, cfg.kv_unified) == (128, 2, True)
    assert cfg.ignored == (
        "-ngl",
        "-fa",
        "-cb",
        "--no-jinja",
        "-fa",
        "-dt",
        "--no-mmap",
        "-fit",
    )
    assert cfg == dataclasses.replace(parse("-c 128 -np 2 -kvu"), ignored=cfg.ignored)
    assert not parse("-kvu -no-kvu").kv_unified


def test_cache_types_f32_and_f16_and_nothing_else(capsys):
    """-ctk/-ctv: f16 keeps the KV pool in fp16 with llama.cpp's f16 attention numerics
    (llama-server's default type), f32 (loraserve's default) the fixed-order float32 path;
    K and V in one type; llama.cpp's quantized cache types are refused, naming the flag."""
    assert (parse("-c 16").cache_type_k, parse("-c 16").cache_type_v) == ("f32", "f32")
    cfg = parse("-ctk f16 --cache-type-v f16")
    assert (cfg.cache_type_k, cfg.cache_type_v) == ("f16", "f16") and cfg.ignored == ()
    assert "give both the same" in parse_error("-ctk f16", capsys)
    err = parse_error("-ctk q8_0 -ctv q8_0", capsys)
    assert "-ctk/--cache-type-k: invalid choice: 'q8_0'" in err


@pytest.mark.parametrize("word", IGNORED_SWITCHES + IGNORED_OPTIONAL_VALUE + IGNORED_WITH_VALUE)
def test_every_ignored_spelling_parses(word: str):
    takes_value = word in IGNORED_WITH_VALUE
    for spelling in word.split("|"):
        cfg = parse(f"{spelling} 7 -c 16" if takes_value else f"{spelling} -c 16")
        assert cfg.ignored == (spelling,) and cfg.n_ctx == 16


def test_help_lists_ignored_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        parse("--help")
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "accepted for compatibility with llama-server and ignored" in out
    assert "--n-gpu-layers" in out and "--lora-dir" in out and "--cache-ram" in out


def test_resolved_values():
    assert parse("-np -1").n_parallel == AUTO_PARALLEL
    assert parse("-b 256 -ub 512").n_ubatch == 256
    assert parse("--temp -1").temperature == 0.0
    assert parse("--seed 4294967295").seed == -1
    assert parse("-t 0").n_threads == -1
    assert parse("--api-key k,k --alias m,m").api_keys == ("k",)
    assert parse("serve -c 64").n_ctx == 64
    assert parse("").scan_form == "recurrent"
    assert parse("--scan-form chunked").scan_form == "chunked"


def test_api_key_file(tmp_path, capsys):
    keys = tmp_path / "keys.txt"
    keys.write_text("# comment\nkey-1\n\n  key-2  \n")
    assert parse(f"--api-key k0 --api-key-file {keys}").api_keys == ("k0", "key-1", "key-2")
    assert "--api-key-file" in parse_error(f"--api-key-file {tmp_path / 'nope'}", capsys)


def test_directories_are_checked(tmp_path, capsys):
    cfg = parse(f"--slot-save-path {tmp_path} --lora-dir {tmp_path} --lora-dir {tmp_path}/.")
    assert cfg.slot_save_path == str(tmp_path)
    assert cfg.lora_dirs == (os.path.realpath(tmp_path),) * 2
    assert "--slot-save-path" in parse_error(f"--slot-save-path {tmp_path}/missing", capsys)
    assert "--lora-dir" in parse_error(f"--lora-dir {tmp_path}/missing", capsys)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        parse("").port = 1  # type: ignore[misc]


def test_props_and_request_defaults():
    cfg = parse("-np 2 -c 1024 --metrics -m model.gguf -a mine -n 32 --temp 0.5 --no-cache-prompt")
    props = cfg.to_props_dict()
    assert props["total_slots"] == 2 and props["endpoint_metrics"] is True
    assert props["model_path"] == "model.gguf" and props["model_alias"] == "mine"
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 1024
    assert settings["params"]["n_predict"] == 32 and settings["params"]["temperature"] == 0.5
    assert "model_alias" not in parse("").to_props_dict()
    defaults = cfg.request_defaults()
    assert defaults["n_predict"] == 32 and defaults["cache_prompt"] is False


def test_chat_template_flags(tmp_path, capsys):
    assert parse("").chat_template is None and parse("").chat_template_origin == ""
    cfg = parse('--chat-template gemma --chat-template-kwargs {"enable_thinking":false}')
    assert (cfg.chat_template, cfg.chat_template_origin) == ("gemma", "--chat-template")
    # llama-server adds preserve_reasoning true to its default kwargs (common/arg.cpp)
    assert cfg.chat_template_kwargs == {"enable_thinking": False, "preserve_reasoning": True}
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    cfg = parse(f"--jinja --chat-template-file {jinja}")
    assert cfg.chat_template == jinja.read_text() and cfg.ignored == ()
    assert cfg.chat_template_origin == "--chat-template-file"
    err = parse_error("--chat-template gema", capsys)
    assert "unknown built-in template 'gema'" in err and "gemma" in err
    assert "not ported" in parse_error("--chat-template granite", capsys)
    jinja.write_text("{% for m in messages %}")
    assert "does not compile" in parse_error(f"--chat-template-file {jinja}", capsys)
    assert "cannot read" in parse_error(f"--chat-template-file {tmp_path}/none", capsys)
    assert "JSON object" in parse_error("--chat-template-kwargs [1]", capsys)
    assert "not JSON" in parse_error("--chat-template-kwargs {", capsys)


def test_version_and_help_list_the_commands(capsys):
    from loraserve import __version__

    with pytest.raises(SystemExit) as exc:
        parse("--version")
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"loraserve {__version__}"
    with pytest.raises(SystemExit):
        parse("--help")
    out = capsys.readouterr().out
    for command in ("serve", "generate", "merge"):
        assert f"  {command} " in out
    assert "--strict-model-names" in out and "--chat-template-file" in out
    assert parse("--strict-model-names").strict_model_names is True
