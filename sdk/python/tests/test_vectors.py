"""The shared protocol vectors (sdk/testvectors, generated from memcolo-proto)."""

import json
import os

import pytest

from memcolo import protocol

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "testvectors")


def load(name):
    with open(os.path.join(VECTORS, name)) as f:
        return json.load(f)


CASES = [
    ("requests.json", protocol.decode_request, protocol.REQUESTS),
    ("replies.json", protocol.decode_reply, protocol.REPLIES),
]


@pytest.mark.parametrize("file,decode,schema", CASES)
def test_valid_lines_decode_to_their_meaning(file, decode, schema):
    vectors = load(file)
    assert vectors["protocol_version"] == protocol.PROTOCOL_VERSION
    assert vectors["max_line_bytes"] == protocol.MAX_LINE_BYTES
    for v in vectors["valid"]:
        assert decode(v["line"]) == v["message"], v["name"]


@pytest.mark.parametrize("file,decode,schema", CASES)
def test_encoding_is_byte_identical_to_the_reference(file, decode, schema):
    for v in load(file)["valid"]:
        if v["canonical"]:
            assert protocol.encode(v["message"], schema) == v["line"] + "\n", v["name"]


@pytest.mark.parametrize("file,decode,schema", CASES)
def test_invalid_lines_fail_with_the_expected_code(file, decode, schema):
    vectors = load(file)
    for v in vectors["invalid"]:
        with pytest.raises(protocol.ProtocolError) as e:
            decode(v["line"])
        assert e.value.code == v["code"], v["name"]
    t = vectors["too_long"]
    line = t["prefix"] + t["fill"] * t["count"] + t["suffix"]
    with pytest.raises(protocol.ProtocolError) as e:
        decode(line)
    assert e.value.code == t["code"]


def test_encode_rejects_a_message_that_breaks_the_schema():
    with pytest.raises(ValueError):
        protocol.encode({"type": "reclaimed", "bytes": -1, "duration_ms": 0})
    with pytest.raises(ValueError):
        protocol.encode({"type": "register"})
