"""Review 61 H4: a RocketMQ 5.x consumerOffset.json keeps its other top-level keys
(dataVersion, pullOffsetTable, resetOffsetTable: a pending admin reset) through mqstore's
writes, as the exact text they had; only offsetTable is mqstore's to change.

Before: the first persist wrote `{"offsetTable":...}` alone, and the rest survived in `.bak`
only until the next persist rotated it out."""

from __future__ import annotations

from pathlib import Path

import mqstore
from mqstore.storage.consumer_offsets import ConsumerOffsetStore, load_fastjson
from mqstore.storage.fs import SimulatedFileSystem

SETTINGS = dict(
    mapped_file_size_commitlog_bytes=64 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 200,
    max_hash_slot_num=64,
    max_index_num=400,
)
DATA_VERSION = '{\n\t\t"counter":7,\n\t\t"stateVersion":0,\n\t\t"timestamp":1700000000000\n\t}'
PULL = '{\n\t\t"TopicA@g1":{0:3}\n\t}'
RESET = '{\n\t\t"TopicA@g2":{0:1}\n\t}'
FIVE_X = (
    '{\n\t"dataVersion":' + DATA_VERSION + ',\n\t"offsetTable":{\n\t\t"TopicA@g1":{0:2},\n'
    '\t\t"%RETRY%g1@g1":{0:0}\n\t},\n\t"pullOffsetTable":' + PULL + ',\n\t"resetOffsetTable":' + RESET + "\n}"
)


def test_a_5x_file_keeps_its_other_keys_verbatim_through_commits_and_restarts(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with mqstore.open(str(root), **SETTINGS):
        pass
    path = root / "config" / "consumerOffset.json"
    path.write_text(FIVE_X)
    for session, offset in enumerate((3, 4)):  # the second persist rotates the first one's file into .bak
        with mqstore.open(str(root), **SETTINGS) as store:
            assert store.query_offset("g1", "TopicA", 0) == 2 + session
            store.commit_offset("g1", "TopicA", 0, offset)
            store.commit_offset("g2", "TopicA", 0, 9)  # the queue with the pending reset
        text = path.read_text()
        for key, value in (("dataVersion", DATA_VERSION), ("pullOffsetTable", PULL), ("resetOffsetTable", RESET)):
            assert f'"{key}":{value}' in text, f"session {session}: {key} not kept as it was:\n{text}"
        doc = load_fastjson(text)
        assert list(doc) == ["dataVersion", "offsetTable", "pullOffsetTable", "resetOffsetTable"]
        assert doc["offsetTable"] == {"TopicA@g1": {"0": offset}, "TopicA@g2": {"0": 9}, "%RETRY%g1@g1": {"0": 0}}
        assert doc["resetOffsetTable"] == {"TopicA@g2": {"0": 1}}  # never dropped, never applied or erased
        assert doc["dataVersion"] == {"counter": 7, "stateVersion": 0, "timestamp": 1700000000000}


def test_the_store_that_loaded_from_bak_keeps_the_bak_s_keys() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/s/config")
    fs.write_atomic("/s/config/consumerOffset.json.bak", FIVE_X.encode())
    fs.write_atomic("/s/config/consumerOffset.json", b"{\n\t\"offsetTable\":{\n\t\t\"TopicA@g1\":{0:")  # cut short
    offsets = ConsumerOffsetStore(fs, "/s")
    assert offsets.load()
    offsets.commit_offset("g1", "TopicA", 0, 5)
    offsets.persist()
    doc = load_fastjson(fs.read_bytes("/s/config/consumerOffset.json").decode())
    assert doc["resetOffsetTable"] == {"TopicA@g2": {"0": 1}} and doc["pullOffsetTable"] == {"TopicA@g1": {"0": 3}}
    assert doc["offsetTable"]["TopicA@g1"] == {"0": 5}


def test_a_4x_file_is_written_as_before() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/s/config")
    fs.write_atomic("/s/config/consumerOffset.json", b'{\n\t"offsetTable":{\n\t\t"T@g":{0:250,1:250\n\t\t}\n\t}\n}')
    offsets = ConsumerOffsetStore(fs, "/s")
    assert offsets.load()
    offsets.commit_offset("g", "T", 0, 251)
    assert offsets.encode() == '{\n\t"offsetTable":{\n\t\t"T@g":{\n\t\t\t"0":251,\n\t\t\t"1":250\n\t\t}\n\t}\n}'
    empty = ConsumerOffsetStore(fs, "/nowhere")
    assert not empty.load() and empty.encode() == '{\n\t"offsetTable":{}\n}'


def test_keys_with_awkward_text_survive() -> None:
    """Strings holding braces, commas, colons and escaped quotes; values of every JSON kind."""
    fs = SimulatedFileSystem()
    fs.makedirs("/s/config")
    odd = '{"a:b":"}{,\\"", "n":null, "l":[1,{2:3},"]"], "offsetTable":{}, "z":-1.5e3}'
    fs.write_atomic("/s/config/consumerOffset.json", odd.encode())
    offsets = ConsumerOffsetStore(fs, "/s")
    assert offsets.load()
    offsets.commit_offset("g", "T", 0, 1)
    text = offsets.encode()
    for raw in ('"a:b":"}{,\\""', '"n":null', '"l":[1,{2:3},"]"]', '"z":-1.5e3'):
        assert raw in text, text
    assert list(load_fastjson(text)) == ["a:b", "n", "l", "offsetTable", "z"]
