"""StoreConfig: every §15 setting with its 4.4.0 default, precedence, aliases, and errors."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from mqstore.config import NO_EFFECT_SETTINGS, ROCKETMQ_ALIASES, ConfigError, StoreConfig, load_defaults

# (RocketMQ name, our field, 4.4.0 default) straight from the spec §15 table.
SPEC_DEFAULTS = [
    ("mapedFileSizeCommitLog", "mapped_file_size_commitlog_bytes", 1073741824),
    ("mapedFileSizeConsumeQueue", "mapped_file_size_consume_queue_bytes", 6000000),
    ("enableConsumeQueueExt", "enable_consume_queue_ext", False),
    ("mappedFileSizeConsumeQueueExt", "mapped_file_size_consume_queue_ext_bytes", 50331648),
    ("bitMapLengthConsumeQueueExt", "bit_map_length_consume_queue_ext_bits", 64),
    ("flushIntervalCommitLog", "flush_interval_commitlog_ms", 500),
    ("commitIntervalCommitLog", "commit_interval_commitlog_ms", 200),
    ("useReentrantLockWhenPutMessage", "use_reentrant_lock_when_put_message", False),
    ("flushCommitLogTimed", "flush_commitlog_timed", False),
    ("flushIntervalConsumeQueue", "flush_interval_consume_queue_ms", 1000),
    ("cleanResourceInterval", "clean_resource_interval_ms", 10000),
    ("deleteCommitLogFilesInterval", "delete_commitlog_files_interval_ms", 100),
    ("deleteConsumeQueueFilesInterval", "delete_consume_queue_files_interval_ms", 100),
    ("destroyMapedFileIntervalForcibly", "destroy_mapped_file_interval_forcibly_ms", 120000),
    ("redeleteHangedFileInterval", "redelete_hanged_file_interval_ms", 120000),
    ("deleteWhen", "delete_when", "04"),
    ("diskMaxUsedSpaceRatio", "disk_max_used_space_ratio_percent", 75),
    ("fileReservedTime", "file_reserved_time_hours", 72),
    ("putMsgIndexHightWater", "put_msg_index_high_water", 600000),
    ("maxMessageSize", "max_message_size_bytes", 4194304),
    ("checkCRCOnRecover", "check_crc_on_recover", True),
    ("flushCommitLogLeastPages", "flush_commitlog_least_pages", 4),
    ("commitCommitLogLeastPages", "commit_commitlog_least_pages", 4),
    ("flushLeastPagesWhenWarmMapedFile", "flush_least_pages_when_warm_mapped_file", 4096),
    ("flushConsumeQueueLeastPages", "flush_consume_queue_least_pages", 2),
    ("flushCommitLogThoroughInterval", "flush_commitlog_thorough_interval_ms", 10000),
    ("commitCommitLogThoroughInterval", "commit_commitlog_thorough_interval_ms", 200),
    ("flushConsumeQueueThoroughInterval", "flush_consume_queue_thorough_interval_ms", 60000),
    ("maxTransferBytesOnMessageInMemory", "max_transfer_bytes_on_message_in_memory", 262144),
    ("maxTransferCountOnMessageInMemory", "max_transfer_count_on_message_in_memory", 32),
    ("maxTransferBytesOnMessageInDisk", "max_transfer_bytes_on_message_in_disk", 65536),
    ("maxTransferCountOnMessageInDisk", "max_transfer_count_on_message_in_disk", 8),
    ("accessMessageInMemoryMaxRatio", "access_message_in_memory_max_ratio_percent", 40),
    ("messageIndexEnable", "message_index_enable", True),
    ("maxHashSlotNum", "max_hash_slot_num", 5000000),
    ("maxIndexNum", "max_index_num", 20000000),
    ("maxMsgsNumBatch", "max_msgs_num_batch", 64),
    ("messageIndexSafe", "message_index_safe", False),
    ("haListenPort", "ha_listen_port", 10912),
    ("haSendHeartbeatInterval", "ha_send_heartbeat_interval_ms", 5000),
    ("haHousekeepingInterval", "ha_housekeeping_interval_ms", 20000),
    ("haTransferBatchSize", "ha_transfer_batch_size_bytes", 32768),
    ("haMasterAddress", "ha_master_address", None),
    ("haSlaveFallbehindMax", "ha_slave_fallbehind_max_bytes", 268435456),
    ("brokerRole", "broker_role", "ASYNC_MASTER"),
    ("flushDiskType", "flush_disk_type", "ASYNC_FLUSH"),
    ("syncFlushTimeout", "sync_flush_timeout_ms", 5000),
    ("messageDelayLevel", "message_delay_level", "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"),
    ("flushDelayOffsetInterval", "flush_delay_offset_interval_ms", 10000),
    # 4.4.0's default is true: deletion of unexpired messages under disk pressure. Off here, the
    # brief's first rule over the spec (README, "Disk pressure deletes no message").
    ("cleanFileForciblyEnable", "clean_file_forcibly_enable", False),
    ("warmMapedFileEnable", "warm_mapped_file_enable", False),
    ("offsetCheckInSlave", "offset_check_in_slave", False),
    ("debugLockEnable", "debug_lock_enable", False),
    ("duplicationEnable", "duplication_enable", False),
    ("diskFallRecorded", "disk_fall_recorded", True),
    ("osPageCacheBusyTimeOutMills", "os_page_cache_busy_timeout_ms", 1000),
    ("defaultQueryMaxNum", "default_query_max_num", 32),
    ("transientStorePoolEnable", "transient_store_pool_enable", False),
    ("transientStorePoolSize", "transient_store_pool_size", 5),
    ("fastFailIfNoBufferInStorePool", "fast_fail_if_no_buffer_in_store_pool", False),
    ("rocketmq.broker.diskSpaceWarningLevelRatio", "disk_space_warning_level_ratio", 0.90),
    ("rocketmq.broker.diskSpaceCleanForciblyRatio", "disk_space_clean_forcibly_ratio", 0.85),
    ("longPollingEnable", "long_polling_enable", True),
    ("brokerId", "broker_id", 0),
]


@pytest.fixture
def defaults() -> StoreConfig:
    return StoreConfig.load(env={})


@pytest.mark.parametrize(("rocketmq_name", "field", "default"), SPEC_DEFAULTS)
def test_every_spec_setting_has_its_4_4_0_default_and_its_rocketmq_alias(
    defaults: StoreConfig, rocketmq_name: str, field: str, default: object
) -> None:
    assert getattr(defaults, field) == default
    assert ROCKETMQ_ALIASES[rocketmq_name] == field


def test_our_own_settings_have_their_documented_defaults(defaults: StoreConfig) -> None:
    assert defaults.store_path_root_dir == "./mqstore-data"
    assert defaults.store_path_commitlog is None
    assert defaults.store_host == "127.0.0.1:10911"
    assert defaults.allocate_wait_timeout_ms == 5000
    assert defaults.log_json is False


def test_defaults_file_is_the_single_source_of_the_field_set() -> None:
    names = {f.name for f in dataclasses.fields(StoreConfig)} - {"explicit_settings"}  # not a setting
    assert names == set(load_defaults())
    # every §15 setting is covered (the storePath* pair is checked separately)
    assert {field for _, field, _ in SPEC_DEFAULTS} | {"store_path_root_dir", "store_path_commitlog"} <= names


def test_the_typed_settings_of_open_are_the_configs_fields_with_their_types() -> None:
    """StoreSettings (open's **settings for a type checker) is StoreConfig's field set, each
    with the field's type (a Literal of the allowed values where the config checks them)."""
    import typing

    from mqstore.config import BROKER_ROLES, FLUSH_DISK_TYPES, StoreSettings

    fields = typing.get_type_hints(StoreConfig)
    fields.pop("explicit_settings")
    typed = typing.get_type_hints(StoreSettings)
    assert set(typed) == set(fields)
    choices = {"flush_disk_type": FLUSH_DISK_TYPES, "broker_role": BROKER_ROLES}
    for name, kind in typed.items():
        if name in choices:
            assert typing.get_origin(kind) is typing.Literal and typing.get_args(kind) == choices[name], name
        else:
            assert kind == fields[name], name
    # (max_put_bytes_in_flight, this stop's new setting, comes with its documented default)
    assert StoreConfig().max_put_bytes_in_flight == 64 * 1024 * 1024


def test_config_is_frozen_and_slotted(defaults: StoreConfig) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        defaults.flush_interval_commitlog_ms = 1  # type: ignore[misc]
    assert not hasattr(defaults, "__dict__")


def test_derived_paths_live_under_the_root(tmp_path: Path) -> None:
    cfg = StoreConfig(store_path_root_dir=str(tmp_path))
    assert cfg.commitlog_dir == str(tmp_path / "commitlog")
    assert cfg.consume_queue_dir == str(tmp_path / "consumequeue")
    assert cfg.index_dir == str(tmp_path / "index")
    assert cfg.checkpoint_path == str(tmp_path / "checkpoint")
    assert cfg.abort_path == str(tmp_path / "abort")
    assert cfg.lock_path == str(tmp_path / "lock")
    assert cfg.config_dir == str(tmp_path / "config")
    other = cfg.replace(store_path_commitlog=str(tmp_path / "elsewhere"))
    assert other.commitlog_dir == str(tmp_path / "elsewhere")
    assert StoreConfig(store_path_root_dir="~/store").root_dir == os.path.expanduser("~/store")


def test_derived_values(defaults: StoreConfig) -> None:
    assert defaults.delay_levels_ms[0] == 1000 and defaults.delay_levels_ms[-1] == 7_200_000
    assert len(defaults.delay_levels_ms) == 18
    assert defaults.index_file_size_bytes == 420_000_040
    assert str(defaults.store_host_address) == "127.0.0.1:10911"
    assert defaults.delete_when_hours == (4,)
    assert not defaults.is_sync_flush


def test_consume_queue_size_is_rounded_up_to_whole_units() -> None:
    assert StoreConfig(mapped_file_size_consume_queue_bytes=1001).mapped_file_size_consume_queue_bytes == 1020
    assert StoreConfig(mapped_file_size_consume_queue_bytes=1000).mapped_file_size_consume_queue_bytes == 1000
    # Review 35 F2: 2**31-1 passed the Java-int check, was rounded to 2147483660 and written;
    # every later open that read the size from the files failed.
    assert StoreConfig(mapped_file_size_consume_queue_bytes=2147483640).mapped_file_size_consume_queue_bytes == 2147483640
    with pytest.raises(ConfigError, match="rounded up .* 2147483660"):
        StoreConfig(mapped_file_size_consume_queue_bytes=2147483641)


def test_max_puts_in_flight_is_bounded() -> None:
    """Review 35 F3: 2**31-1 slots held the GIL ~6 s at every open; more was a bare OSError."""
    assert StoreConfig(max_puts_in_flight=1 << 20).max_puts_in_flight == 1 << 20
    with pytest.raises(ConfigError, match="max_puts_in_flight.*at most 1048576"):
        StoreConfig(max_puts_in_flight=(1 << 20) + 1)


@pytest.mark.parametrize(("given", "effective"), [(5, 10), (75, 75), (99, 95)])
def test_disk_max_used_space_ratio_is_clamped_like_the_getter(given: int, effective: int) -> None:
    assert StoreConfig(disk_max_used_space_ratio_percent=given).disk_max_used_space_ratio_percent == effective


def test_environment_overrides_defaults_and_values_are_parsed() -> None:
    env = {
        "MQSTORE_FLUSH_DISK_TYPE": "SYNC_FLUSH",
        "MQSTORE_FLUSH_INTERVAL_COMMITLOG_MS": "250",
        "MQSTORE_WARM_MAPPED_FILE_ENABLE": "true",
        "MQSTORE_DISK_SPACE_WARNING_LEVEL_RATIO": "0.8",
        "PATH": "/usr/bin",
    }
    cfg = StoreConfig.load(env=env)
    assert cfg.flush_disk_type == "SYNC_FLUSH"
    assert cfg.flush_interval_commitlog_ms == 250
    assert cfg.warm_mapped_file_enable is True
    assert cfg.disk_space_warning_level_ratio == 0.8


def test_only_mqstore_known_setting_variables_are_settings() -> None:
    # Issue 14: a host's own MQSTORE_* variable (MQSTORE_DATA_URL) must not make open() raise.
    env = {"MQSTORE_DATA_URL": "s3://bucket", "MQSTORE_PURE_PYTHON": "1", "MQSTORE_SYNC_FLUSH_TIMEOUT_MS": "7"}
    cfg = StoreConfig.load(env=env)
    assert cfg.sync_flush_timeout_ms == 7
    assert cfg.explicit == {"sync_flush_timeout_ms"}


def test_precedence_is_file_then_environment_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "store.toml"
    path.write_text('flush_interval_commitlog_ms = 100\nsync_flush_timeout_ms = 100\ndelete_when = "02;14"\n')
    env = {"MQSTORE_SYNC_FLUSH_TIMEOUT_MS": "200", "MQSTORE_DELETE_WHEN": "03"}
    cfg = StoreConfig.load(path, overrides={"delete_when": "05"}, env=env)
    assert cfg.flush_interval_commitlog_ms == 100  # file
    assert cfg.sync_flush_timeout_ms == 200  # env beats file
    assert cfg.delete_when == "05"  # overrides beat env
    assert cfg.max_message_size_bytes == 4194304  # untouched default


def test_broker_properties_file_with_rocketmq_names(tmp_path: Path) -> None:
    path = tmp_path / "broker.properties"
    path.write_text(
        "# a broker's store settings\n"
        "mapedFileSizeCommitLog=8192\n"
        "flushDiskType = SYNC_FLUSH\n"
        "fileReservedTime=48\n"
        "warmMapedFileEnable=true\n"
        "rocketmq.broker.diskSpaceCleanForciblyRatio=0.8\n"
    )
    cfg = StoreConfig.load(path, env={})
    assert cfg.mapped_file_size_commitlog_bytes == 8192
    assert cfg.flush_disk_type == "SYNC_FLUSH"
    assert cfg.file_reserved_time_hours == 48
    assert cfg.warm_mapped_file_enable is True
    assert cfg.disk_space_clean_forcibly_ratio == 0.8


def test_camel_case_aliases_in_a_dict_and_in_toml(tmp_path: Path) -> None:
    cfg = StoreConfig.from_dict({"mapedFileSizeCommitLog": 8192, "flushIntervalCommitLog": 300, "brokerRole": "SLAVE"})
    assert cfg.mapped_file_size_commitlog_bytes == 8192
    assert cfg.flush_interval_commitlog_ms == 300
    assert cfg.broker_role == "SLAVE"
    # RocketMQ 4.5+ spells it "mapped"
    assert StoreConfig.from_dict({"mappedFileSizeCommitLog": 4096}).mapped_file_size_commitlog_bytes == 4096
    path = tmp_path / "s.toml"
    path.write_text("osPageCacheBusyTimeOutMills = 2000\n")
    assert StoreConfig.load(path, env={}).os_page_cache_busy_timeout_ms == 2000


def test_same_setting_under_two_names_is_an_error() -> None:
    with pytest.raises(ConfigError, match="twice"):
        StoreConfig.from_dict({"flushIntervalCommitLog": 1, "flush_interval_commitlog_ms": 2})


def test_unknown_key_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="flush_interval_commitlog\\b") as err:
        StoreConfig.from_dict({"flush_interval_commitlog": 500})
    assert err.value.key == "flush_interval_commitlog"
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("flush_interval_commitlog_ms", "fast"),
        ("flush_interval_commitlog_ms", -1),
        ("max_message_size_bytes", True),
        ("mapped_file_size_commitlog_bytes", 0),
        ("mapped_file_size_commitlog_bytes", -8192),
        ("mapped_file_size_commitlog_bytes", 2**31),
        ("flush_disk_type", "FAST_FLUSH"),
        ("broker_role", "MASTER"),
        ("warm_mapped_file_enable", "maybe"),
        ("warm_mapped_file_enable", 1),
        ("delete_when", "4am"),
        ("delete_when", "25"),
        ("message_delay_level", "1s 5x"),
        ("store_host", "localhost"),
        ("disk_space_warning_level_ratio", 1.5),
        ("ha_listen_port", 70000),
        ("max_index_num", 0),
        ("store_path_root_dir", ""),
    ],
)
def test_bad_value_is_an_error_naming_the_key_and_value(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        StoreConfig.from_dict({key: value})
    assert key in str(err.value)
    assert repr(value) in str(err.value)


def test_bad_value_from_the_environment_names_the_key() -> None:
    with pytest.raises(ConfigError, match="sync_flush_timeout_ms='soon'"):
        StoreConfig.load(env={"MQSTORE_SYNC_FLUSH_TIMEOUT_MS": "soon"})


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ConfigError, match="flush_disk_type"):
        StoreConfig(flush_disk_type="NEVER")


def test_round_trip_and_replace(defaults: StoreConfig) -> None:
    assert StoreConfig.from_dict(defaults.to_dict()) == defaults
    changed = defaults.replace(flush_disk_type="SYNC_FLUSH", flushIntervalCommitLog=50)
    assert changed.is_sync_flush and changed.flush_interval_commitlog_ms == 50
    assert defaults.flush_disk_type == "ASYNC_FLUSH"
    with pytest.raises(ConfigError, match="no_such_setting"):
        defaults.replace(no_such_setting=1)


def test_missing_or_malformed_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing.toml"):
        StoreConfig.load(tmp_path / "missing.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        StoreConfig.load(bad, env={})


def test_consume_queue_ext_is_refused_naming_the_setting(tmp_path: Path) -> None:
    # Accepted and silently ignored before: units would be written without their ext entries.
    with pytest.raises(ConfigError, match="enable_consume_queue_ext.*not supported"):
        StoreConfig(enable_consume_queue_ext=True)
    conf = tmp_path / "broker.conf"
    conf.write_text("enableConsumeQueueExt=true\n")
    with pytest.raises(ConfigError, match="not supported"):
        StoreConfig.load(conf)
    with pytest.raises(ConfigError, match="enable_consume_queue_ext"):
        StoreConfig.load(env={"MQSTORE_ENABLE_CONSUME_QUEUE_EXT": "true"})
    assert StoreConfig.from_dict({"enableConsumeQueueExt": "false"}).enable_consume_queue_ext is False


def test_every_setting_has_an_effect_or_is_listed_as_having_none() -> None:
    # A setting nothing reads is either given a behaviour or named by the open-time warning.
    package = Path(__file__).resolve().parents[1]
    sources = [
        p.read_text(encoding="utf-8")
        for p in package.rglob("*.py")
        if not {"tests", "config", "build", ".venv"} & set(p.relative_to(package).parts)
    ]
    text = "\n".join(sources)
    unread = sorted(name for name in load_defaults() if not re.search(rf"\b{name}\b", text))
    # (enable_consume_queue_ext: refused when true, by the config itself.)
    assert set(unread) == set(NO_EFFECT_SETTINGS) | {"enable_consume_queue_ext"}


def test_no_effect_settings_are_those_set_away_from_their_default() -> None:
    assert StoreConfig().no_effect_settings() == {}
    cfg = StoreConfig.from_dict({"haListenPort": 10999, "use_reentrant_lock_when_put_message": True,
                                 "haMasterAddress": "10.0.0.1:10912", "brokerRole": "SYNC_MASTER"})  # fmt: skip
    assert sorted(cfg.no_effect_settings()) == ["ha_listen_port", "ha_master_address", "use_reentrant_lock_when_put_message"]
    # Set explicitly to the default value: it changes nothing, so it is not worth a warning.
    assert StoreConfig.from_dict({"haListenPort": 10912}).no_effect_settings() == {}


def test_a_toml_string_for_a_number_setting_is_refused_naming_it(tmp_path: Path) -> None:
    """Review 45 F5: `mapped_file_size_commitlog_bytes = "65536"` was converted silently."""
    path = tmp_path / "store.toml"
    path.write_text('mapped_file_size_commitlog_bytes = "65536"\n')
    with pytest.raises(ConfigError, match="mapped_file_size_commitlog_bytes.*without quotes"):
        StoreConfig.load(path, env={})
    path.write_text("mapped_file_size_commitlog_bytes = 65536\nflush_disk_type = \"SYNC_FLUSH\"\n")
    assert StoreConfig.load(path).mapped_file_size_commitlog_bytes == 65536


def test_a_config_file_that_is_not_utf8_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "store.toml"
    path.write_bytes(b"\xff\xfem\x00a\x00")
    with pytest.raises(ConfigError, match="store.toml.*not UTF-8"):
        StoreConfig.load(path, env={})


@pytest.mark.parametrize("kind", ["fifo", "device", "too large"])
def test_a_config_file_that_is_no_regular_file_or_too_large_is_refused_without_reading_it(
    tmp_path: Path, kind: str
) -> None:
    """Review 126 F5: a FIFO given as the config file hung the command (and a host's open);
    /dev/zero was read until memory ran out."""
    from mqstore.config import CONFIG_FILE_MAX_BYTES

    if kind == "fifo":
        path = tmp_path / "settings.toml"
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    else:
        path = tmp_path / "big.toml"
        path.write_text("# x\n" * (CONFIG_FILE_MAX_BYTES // 4 + 1))
    with pytest.raises(ConfigError, match="regular file" if kind != "too large" else "at most"):
        StoreConfig.load(path, env={})


def test_max_index_num_of_one_is_refused() -> None:
    """Review 126 F6: entry 0 of an index file is never used, so a file of one entry holds none:
    every key was dropped unsaid (and the Spark reindex divided by zero)."""
    with pytest.raises(ConfigError, match="at least 2"):
        StoreConfig.load(overrides={"max_index_num": 1}, env={})
    assert StoreConfig.load(overrides={"max_index_num": 2}, env={}).max_index_num == 2


@pytest.mark.parametrize(("slots", "entries"), [(2**62, 2**62), (2**29, 2), (2, 2**27)])
def test_an_index_file_past_a_java_int_is_refused(slots: int, entries: int) -> None:
    """Review 137 F1: the index's two counts were bounded each, not the file they make; the
    store opened, answered PUT_OK, and its index actor failed at its first file until the
    supervisor gave up (2**62 each), or made index files RocketMQ cannot size (2**29 slots)."""
    with pytest.raises(ConfigError, match=r"past a Java int \(2147483647\)"):
        StoreConfig.from_dict({"max_hash_slot_num": slots, "max_index_num": entries})


def test_the_largest_index_file_that_fits_a_java_int_is_taken() -> None:
    slots = (2**31 - 1 - 40 - 20 * 2) // 4
    assert StoreConfig.from_dict({"max_hash_slot_num": slots, "max_index_num": 2}).index_file_size_bytes <= 2**31 - 1
