"""ProfilerConfig and ProfilingRange: validation messages, range specs, dict/JSON round trips."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

import pytest

from stallwatch.config import ConfigError, ProfilerConfig, ProfilingRange

ISO_US = int(datetime(2026, 11, 22, 6, 0, 0, tzinfo=timezone.utc).timestamp()) * 1_000_000


# -- field validation ----------------------------------------------------------------------------------

# (field, bad value, words the "allowed" part must contain)
BAD_FIELDS = [
    ("sample_interval_ms", 50, "100 to 60000"),
    ("sample_interval_ms", 60_001, "100 to 60000"),
    ("sample_interval_ms", 500.0, "integer"),
    ("sample_interval_ms", True, "integer"),
    ("sample_interval_ms", "500", "integer"),
    ("flush_interval_s", 0.1, "0.2 to 300"),
    ("flush_interval_s", 301, "0.2 to 300"),
    ("flush_interval_s", math.nan, "0.2 to 300"),
    ("flush_interval_s", "5", "0.2 to 300"),
    ("max_storage_mb", 0, "> 0"),
    ("max_storage_mb", -1.5, "> 0"),
    ("max_storage_mb", math.inf, "> 0"),
    ("max_storage_mb", None, "> 0"),
    ("upload_timeout_s", -1, "0 to 3600"),
    ("upload_timeout_s", 3601, "0 to 3600"),
    ("node", "", "1-128 characters"),
    ("node", "-leading-dash", "starting with a letter or digit"),
    ("node", "has space", "1-128 characters"),
    ("node", "a/b", "1-128 characters"),
    ("node", "x" * 129, "1-128 characters"),
    ("node", 123, "1-128 characters"),
    ("out", "   ", "directory path or an s3:// URI"),
    ("out", 5, "directory path or an s3:// URI"),
    ("runs_dir", "", "directory path"),
    ("runs_dir", None, "directory path"),
    ("gpu", "yes", "true or false"),
    ("gpu", 1, "true or false"),
    ("python_profiler", "yappi", "cprofile, pyinstrument"),
    ("cprofile_timer", "wall", "total, cpu, off_cpu"),
    ("detailed_profiling", "5:2", "ProfilingRange"),
    ("rules_interval_s", 0.5, "0 (evaluate the rules only when the job ends) or from 1 to 3600"),
    ("rules_interval_s", -1, "0 (evaluate the rules only when the job ends) or from 1 to 3600"),
    ("rules_interval_s", "10", "0 (evaluate the rules only when the job ends) or from 1 to 3600"),
    ("rule_actions", "StepOutlier=log", "must be a list of strings"),
    ("stop_training", "  ", "must be the reason"),
]


@pytest.mark.parametrize(("name", "value", "allowed"), BAD_FIELDS)
def test_bad_field_error_names_field_value_and_allowed(name, value, allowed):
    """Every rejected field says which field, which value, and what would be accepted."""
    with pytest.raises(ConfigError) as err:
        ProfilerConfig(**{name: value})
    exc = err.value
    assert exc.field == name
    assert exc.value == value or (isinstance(value, float) and math.isnan(value))
    assert allowed in exc.allowed
    msg = str(exc)
    assert msg.startswith(f"invalid {name}=")
    assert repr(value) in msg
    assert allowed in msg


def test_a_flush_interval_shorter_than_the_sampling_interval_is_allowed():
    """The interval may change live up to a minute whatever the flush interval is; the system writer then
    flushes at most once per snapshot (tests/store/test_system_writer.py), so no empty parts are written."""
    cfg = ProfilerConfig(sample_interval_ms=60_000, flush_interval_s=1.0)
    assert (cfg.sample_interval_ms, cfg.flush_interval_s) == (60_000, 1.0)


def test_sample_interval_error_lists_presets():
    """The interval error lists the preset values so the user can pick one."""
    with pytest.raises(ConfigError) as err:
        ProfilerConfig(sample_interval_ms=99)
    assert "presets: 100, 200, 500, 1000, 5000, 60000" in str(err.value)


@pytest.mark.parametrize("value", [100, 60_000, 500])
def test_interval_bounds_are_inclusive(value):
    """The documented range 100 ms … 60 s includes both ends."""
    cfg = ProfilerConfig(sample_interval_ms=value, flush_interval_s=300)
    assert cfg.sample_interval_ms == value


def test_defaults_and_derived_units():
    """The defaults are valid and the derived µs / bytes values are exact."""
    cfg = ProfilerConfig()
    assert cfg.sample_interval_ms == 500
    assert cfg.flush_interval_us == 5_000_000
    assert cfg.max_storage_bytes == 10_240 * 1024 * 1024
    assert ProfilerConfig(max_storage_mb=0.5).max_storage_bytes == 524_288


def test_replace_validates():
    """replace() goes through validation like the constructor does."""
    cfg = ProfilerConfig()
    assert cfg.replace(node="algo-1").node == "algo-1"
    with pytest.raises(ConfigError) as err:
        cfg.replace(cprofile_timer="nope")
    assert err.value.field == "cprofile_timer"


# -- ProfilingRange ------------------------------------------------------------------------------------

def test_parse_steps():
    """START:NUM is a step range."""
    rng = ProfilingRange.parse("detailed_profiling", "5:2")
    assert rng == ProfilingRange(start_step=5, num_steps=2)
    assert rng.by_steps
    assert rng.to_spec() == "5:2"


def test_parse_single_step_defaults_to_one_step():
    """A bare START profiles one step."""
    assert ProfilingRange.parse("detailed_profiling", " 7 ") == ProfilingRange(start_step=7, num_steps=1)


def test_parse_iso_window():
    """ISO-8601 with Z is UTC; the duration is seconds."""
    rng = ProfilingRange.parse("python_profiling", "2026-11-22T06:00:00Z/30")
    assert rng == ProfilingRange(start_time_us=ISO_US, duration_s=30.0)
    assert not rng.by_steps
    assert rng.to_spec() == "2026-11-22T06:00:00Z/30"


def test_parse_iso_window_with_offset_and_naive():
    """An explicit offset is honoured and a naive time is taken as UTC."""
    with_offset = ProfilingRange.parse("r", "2026-11-22T08:00:00+02:00/1")
    naive = ProfilingRange.parse("r", "2026-11-22T06:00:00/1")
    assert with_offset.start_time_us == ISO_US
    assert naive.start_time_us == ISO_US


def test_parse_unix_seconds_window_with_s_suffix():
    """Unix seconds and a `s` suffix on the duration are accepted."""
    rng = ProfilingRange.parse("dataloader_profiling", "1763790000/10s")
    assert rng == ProfilingRange(start_time_us=1_763_790_000_000_000, duration_s=10.0)
    frac = ProfilingRange.parse("dataloader_profiling", "1763790000.25/0.5")
    assert frac.start_time_us == 1_763_790_000_250_000
    assert frac.duration_s == 0.5


@pytest.mark.parametrize(("spec", "field", "allowed"), [
    ("", "detailed_profiling", "START:NUM"),
    ("abc", "detailed_profiling", "START:NUM"),
    ("5:", "detailed_profiling", "START:NUM"),
    ("-1:2", "detailed_profiling", "START:NUM"),
    ("1.5:2", "detailed_profiling", "START:NUM"),
    ("5:0", "detailed_profiling.num_steps", ">= 1"),
    ("yesterday/30", "detailed_profiling", "ISO-8601"),
    ("inf/30", "detailed_profiling", "ISO-8601"),
    ("nan/30", "detailed_profiling", "ISO-8601"),
    ("1e300/30", "detailed_profiling.start_time_us", "before the year 10000"),
    ("-5/30", "detailed_profiling.start_time_us", ">= 0"),
    ("2026-11-22T06:00:00Z/thirty", "detailed_profiling", "TIME/SECONDS"),
    ("2026-11-22T06:00:00Z/0", "detailed_profiling.duration_s", "> 0"),
    ("2026-11-22T06:00:00Z/-3", "detailed_profiling.duration_s", "> 0"),
    ("2026-11-22T06:00:00Z/301", "detailed_profiling.duration_s", "<= 300 seconds"),
    ("2026-11-22T06:00:00Z/nan", "detailed_profiling.duration_s", "> 0"),
])
def test_parse_bad_specs(spec, field, allowed):
    """Bad range specs raise ConfigError naming the field (or sub-field), the value and the accepted form."""
    with pytest.raises(ConfigError) as err:
        ProfilingRange.parse("detailed_profiling", spec)
    assert err.value.field == field
    assert allowed in str(err.value)
    assert str(err.value).startswith(f"invalid {field}=")


def test_parse_rejects_non_string():
    """A number where a spec string is expected is a ConfigError, not an AttributeError."""
    with pytest.raises(ConfigError) as err:
        ProfilingRange.parse("detailed_profiling", 5)  # type: ignore[arg-type]
    assert err.value.field == "detailed_profiling"
    assert err.value.value == 5


def test_range_mixing_steps_and_time_is_rejected():
    """A range is either steps or a time window."""
    with pytest.raises(ConfigError) as err:
        ProfilerConfig(detailed_profiling=ProfilingRange(start_step=1, num_steps=1, duration_s=5))
    assert err.value.field == "detailed_profiling"
    assert "not both" in str(err.value)


@pytest.mark.parametrize(("rng", "field"), [
    (ProfilingRange(start_step=1.5, num_steps=1), "python_profiling.start_step"),
    (ProfilingRange(start_step=True, num_steps=1), "python_profiling.start_step"),
    (ProfilingRange(start_step="5", num_steps=1), "python_profiling.start_step"),
    (ProfilingRange(start_step=5), "python_profiling.num_steps"),
    (ProfilingRange(num_steps=2), "python_profiling.start_step"),
    (ProfilingRange(start_time_us=1.5, duration_s=1), "python_profiling.start_time_us"),
    (ProfilingRange(duration_s=3), "python_profiling.start_time_us"),
    (ProfilingRange(start_time_us=ISO_US), "python_profiling.duration_s"),
    (ProfilingRange(start_time_us=ISO_US, duration_s="3"), "python_profiling.duration_s"),
])
def test_range_fields_are_type_checked(rng, field):
    """Wrong types inside a range are ConfigErrors naming the sub-field, never a TypeError."""
    with pytest.raises(ConfigError) as err:
        ProfilerConfig(python_profiling=rng)
    assert err.value.field == field


# -- dicts and files ----------------------------------------------------------------------------------

def _full_config() -> ProfilerConfig:
    return ProfilerConfig(
        sample_interval_ms=200, out="s3://bucket/prefix/run-1", runs_dir="runs", node="algo-1",
        flush_interval_s=2.5, max_storage_mb=512.0, upload_timeout_s=12.0, gpu=False,
        detailed_profiling=ProfilingRange(start_step=5, num_steps=2),
        dataloader_profiling=ProfilingRange(start_time_us=ISO_US, duration_s=30.0),
        python_profiling=ProfilingRange(start_step=0, num_steps=1),
        python_profiler="pyinstrument", cprofile_timer="off_cpu",
    )


def test_to_dict_from_dict_round_trip():
    """Every field survives to_dict -> JSON -> from_dict."""
    cfg = _full_config()
    data = json.loads(cfg.to_json())
    assert data["detailed_profiling"] == {"start_step": 5, "num_steps": 2}
    assert data["dataloader_profiling"] == {"start_time_us": ISO_US, "duration_s": 30.0}
    assert ProfilerConfig.from_dict(data) == cfg
    assert ProfilerConfig.from_dict(cfg.to_dict()) == cfg


def test_from_dict_accepts_spec_strings_and_base():
    """Ranges may be given as spec strings; fields not given come from `base`."""
    base = ProfilerConfig(node="n1", sample_interval_ms=1000)
    cfg = ProfilerConfig.from_dict({"python_profiling": "3:4", "gpu": False}, base=base)
    assert cfg.python_profiling == ProfilingRange(start_step=3, num_steps=4)
    assert cfg.node == "n1" and cfg.sample_interval_ms == 1000 and cfg.gpu is False


def test_from_dict_unknown_key_is_an_error():
    """A typo in a key is reported with the known fields, not silently ignored."""
    with pytest.raises(ConfigError) as err:
        ProfilerConfig.from_dict({"sample_intervall_ms": 100})
    assert err.value.field == "sample_intervall_ms"
    assert err.value.value == 100
    assert "is not a config field" in str(err.value)
    assert "sample_interval_ms" in err.value.allowed


def test_from_dict_unknown_range_key_and_bad_range_type():
    """Range objects with unknown keys, or of the wrong JSON type, are ConfigErrors."""
    with pytest.raises(ConfigError) as err:
        ProfilerConfig.from_dict({"detailed_profiling": {"start": 5}})
    assert err.value.field == "detailed_profiling"
    assert "start" in str(err.value) and "start_step" in str(err.value)
    with pytest.raises(ConfigError) as err:
        ProfilerConfig.from_dict({"detailed_profiling": [5, 2]})
    assert err.value.field == "detailed_profiling"


def test_from_dict_rejects_non_object():
    """A JSON list at top level is named as such."""
    with pytest.raises(ConfigError) as err:
        ProfilerConfig.from_dict([1, 2])  # type: ignore[arg-type]
    assert err.value.field == "config"
    assert err.value.value == "list"


def test_save_load_round_trip(tmp_path):
    """save() writes JSON that load() reads back to an equal config."""
    cfg = _full_config()
    path = tmp_path / "config.json"
    cfg.save(path)
    assert json.loads(path.read_text())["node"] == "algo-1"
    assert ProfilerConfig.load(path) == cfg
    assert ProfilerConfig.load(str(path)) == cfg


def test_load_missing_file(tmp_path):
    """A missing file is a ConfigError naming the path."""
    path = tmp_path / "nope.json"
    with pytest.raises(ConfigError) as err:
        ProfilerConfig.load(path)
    assert err.value.field == "config file"
    assert err.value.value == str(path)
    assert "cannot be read" in str(err.value)


def test_load_invalid_json(tmp_path):
    """Invalid JSON is a ConfigError with the parser's message and line."""
    path = tmp_path / "bad.json"
    path.write_text('{\n  "node": "a",\n  oops\n}\n')
    with pytest.raises(ConfigError) as err:
        ProfilerConfig.load(path)
    assert err.value.value == str(path)
    assert "is not valid JSON" in str(err.value)
    assert "line 3" in str(err.value)


@pytest.mark.parametrize(("data", "field"), [
    ({"sample_interval_ms": "fast"}, "sample_interval_ms"),
    ({"flush_interval_s": [1]}, "flush_interval_s"),
    ({"gpu": "false"}, "gpu"),
    ({"node": 7}, "node"),
    ({"python_profiler": ["cprofile"]}, "python_profiler"),
    ({"detailed_profiling": {"start_step": "5", "num_steps": 2}}, "detailed_profiling.start_step"),
    ({"dataloader_profiling": {"start_time_us": 1, "duration_s": "10"}}, "dataloader_profiling.duration_s"),
])
def test_load_wrong_types(tmp_path, data, field):
    """Values of the wrong JSON type give a ConfigError naming the field."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        ProfilerConfig.load(path)
    assert err.value.field == field


def test_load_uses_base(tmp_path):
    """load(base=...) overrides only the fields present in the file."""
    path = tmp_path / "config.json"
    path.write_text('{"sample_interval_ms": 1000}')
    cfg = ProfilerConfig.load(path, base=ProfilerConfig(node="keep-me"))
    assert cfg.sample_interval_ms == 1000
    assert cfg.node == "keep-me"


@pytest.mark.parametrize(("name", "item", "allowed"), [
    ("rule_actions", "StepOutlier", "write RULE=ACTION"),
    ("rule_actions", "StepOutlier=reboot", "log, stop_training, command:SHELL COMMAND, notify:https://URL"),
    ("rule_actions", "X=notify:ftp://x", "notify:https://URL"),
    ("custom_rules", "no_class_here", "module.path:ClassName"),
])
def test_a_bad_list_item_is_named_with_what_is_allowed(name, item, allowed):
    with pytest.raises(ConfigError) as err:
        ProfilerConfig(**{name: ("Dataloader=log" if name == "rule_actions" else "m:C", item)})
    assert err.value.field == name and err.value.value == item and allowed in str(err.value)


def test_list_fields_round_trip_through_json():
    cfg = ProfilerConfig(rule_actions=("StepOutlier=stop_training", "CPUBottleneck=notify:https://h.example/x"),
                         custom_rules=("my_rules:BusyCpu",), stop_training="asked by hand")
    assert ProfilerConfig.from_dict(json.loads(cfg.to_json())) == cfg


# -- hostile config files: each is one ConfigError naming the field (or the file), read within bounds ------------

HOSTILE_FILES = [
    # (bytes, field named, words of what is allowed)
    (b'{"sample_interval_ms": ' + b"9" * 5000 + b"}", "sample_interval_ms", "100 to 60000"),
    (b'{"max_storage_mb": ' + b"9" * 400 + b"}", "max_storage_mb", "at most 1e+09"),
    (b'{"detailed_profiling": {"start_step": 1, "num_steps": ' + b"1" * 50 + b"}}",
     "detailed_profiling.num_steps", "at most 100"),
    (b'{"max_storage_mb": 1e308}', "max_storage_mb", "at most 1e+09"),
    (b'{"flush_interval_s": 1e999}', "flush_interval_s", "0.2 to 300"),
    (b'{"out": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "config file", "nests arrays or objects too deeply"),
    (b'{"out": ' + b"[" * 500 + b"]" * 500 + b"}", "out", "directory path"),
    (b'{"node": "\xff\xfe"}', "config file", "not UTF-8"),
    (b"\x00" * 64, "config file", "not valid JSON"),
    (b" " * (2 << 20), "config file", "larger than 1 MB"),
]


@pytest.mark.parametrize(("data", "field", "allowed"), HOSTILE_FILES,
                         ids=["huge-int", "huge-int-float-field", "huge-steps", "1e308", "1e999", "deep", "nested-500",
                              "invalid-utf8", "nul-bytes", "2-MB"])
def test_a_hostile_config_file_is_one_clear_error(tmp_path, data, field, allowed):
    """Each raised a traceback (ValueError, OverflowError, RecursionError, UnicodeDecodeError) or was
    accepted; now each is a ConfigError of one short line naming the field, the value and what is allowed."""
    path = tmp_path / "config.json"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        ProfilerConfig.load(path)
    message = str(err.value)
    assert err.value.field == field and allowed in message, message
    assert "\n" not in message and len(message) < 600, message


def test_max_storage_mb_1e308_no_longer_overflows_its_bytes():
    """max_storage_bytes of 1e308 MB raised OverflowError inside the sampler; such a value is refused now."""
    with pytest.raises(ConfigError, match="max_storage_mb"):
        ProfilerConfig(max_storage_mb=1e308)
    assert ProfilerConfig(max_storage_mb=1e9).max_storage_bytes == int(1e9 * 2**20)


@pytest.mark.parametrize("name", ["/dev/zero", "fifo"])
def test_a_config_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path, name):
    """/dev/zero was read forever; a FIFO blocked the open until someone wrote to it."""
    import os

    path = name
    if name == "fifo":
        path = str(tmp_path / "config.json")
        os.mkfifo(path)
    with pytest.raises(ConfigError) as err:
        ProfilerConfig.load(path)
    assert err.value.field == "config file" and "not a regular file" in str(err.value)


def test_a_huge_integer_in_a_message_does_not_break_the_message():
    """repr() of a 5,000-digit int raises ValueError: the error about it must not."""
    with pytest.raises(ConfigError) as err:
        ProfilerConfig(sample_interval_ms=10**5000)
    assert "an integer of" in str(err.value) and "bits" in str(err.value)


def test_a_detailed_window_is_capped_in_steps_and_seconds():
    """torch.profiler holds a window's events in the job's memory: 10,000 steps took it past 1.5 GB."""
    assert ProfilingRange.parse("detailed_profiling", "5:100").num_steps == 100
    with pytest.raises(ConfigError) as err:
        ProfilingRange.parse("detailed_profiling", "5:10000")
    assert err.value.field == "detailed_profiling.num_steps" and "at most 100" in str(err.value)
    with pytest.raises(ConfigError, match="<= 300 seconds"):
        ProfilingRange.parse("detailed_profiling", "2026-11-22T06:00:00Z/3600")
    # the other layers aggregate as they go: long windows stay allowed
    assert ProfilingRange.parse("python_profiling", "5:10000").num_steps == 10000
    assert ProfilingRange.parse("dataloader_profiling", "2026-11-22T06:00:00Z/86400").duration_s == 86400
    with pytest.raises(ConfigError, match="86400"):
        ProfilingRange.parse("python_profiling", "2026-11-22T06:00:00Z/86401")


# -- fuzzing: whatever a config file holds, the answer is a config or one ConfigError ----------------------------

from dataclasses import fields as _fields  # noqa: E402

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from stallwatch.config import ProfilerConfig as _Config  # noqa: E402
from tests.fuzz import JSON, fuzz, json_bytes  # noqa: E402

_KEYS = st.sampled_from([f.name for f in _fields(_Config)] + ["start_step", "num_steps", "typo_field"])
_RANGE = st.dictionaries(st.sampled_from(["start_step", "num_steps", "start_time_us", "duration_s", "x"]), JSON,
                         max_size=4)
_CONFIGS = st.dictionaries(_KEYS, JSON | _RANGE | st.text(max_size=40), max_size=8)


def _one_clear_outcome(data: bytes) -> None:
    try:
        cfg = ProfilerConfig.from_json_bytes(data, "fuzz.json")
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 800, message
        return
    assert ProfilerConfig.from_json_bytes(cfg.to_json().encode(), "again") == cfg  # what is accepted round-trips


@fuzz(120)
@given(_CONFIGS)
def test_fuzz_config_objects(data):
    _one_clear_outcome(json_bytes(data))


@fuzz(200)
@given(st.binary(max_size=200) | JSON.map(json_bytes))
def test_fuzz_config_bytes(data):
    _one_clear_outcome(data)


@fuzz(200)
@given(st.sampled_from(["detailed_profiling", "python_profiling", "dataloader_profiling"]),
       st.text(max_size=40) | st.from_regex(r"\s*-?\d{1,30}(:\d{0,30})?\s*", fullmatch=True)
       | st.from_regex(r"[-+0-9eE.:TZ]{0,30}/[-+0-9eE.naif]{0,12}s?", fullmatch=True))
def test_fuzz_range_specs(layer, spec):
    try:
        rng = ProfilingRange.parse(layer, spec)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"invalid {layer}")
        return
    assert ProfilingRange.parse(layer, rng.to_spec()) == rng


@pytest.mark.parametrize("out", ["s3://", "s3:", "s3:/bucket", "s3:///run", "gs://bucket/run"])
def test_an_out_uri_no_store_can_take_is_refused(out: str) -> None:
    """`--out s3://` made a local folder "s3:" that later runs silently joined."""
    with pytest.raises(ConfigError) as err:
        ProfilerConfig(out=out).validate()
    assert "s3://bucket/prefix/run" in str(err.value)


@pytest.mark.parametrize("out", ["s3://bucket/runs/x", "runs/exp:1", "/tmp/a:b"])
def test_an_out_path_or_bucket_is_taken(out: str) -> None:
    ProfilerConfig(out=out).validate()


def test_a_huge_stop_training_reason_is_cut_once_with_a_note():
    """A reason travels in one message to every job process and into the run's events: bounded at 4,000
    characters, with its length said; cutting it again (a config replaced, re-read) changes nothing."""
    config = ProfilerConfig(stop_training="r" * 600_000)
    assert config.stop_training == "r" * 4000 + " … (cut to 4000 of its 600000 characters)"
    again = ProfilerConfig.from_dict(json.loads(config.to_json()))
    assert again.stop_training == config.stop_training
    assert config.replace(node="n").stop_training == config.stop_training
    assert ProfilerConfig(stop_training="short").stop_training == "short"
