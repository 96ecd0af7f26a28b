#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/seeds/<target>/) from the protocol's
own examples: the SDK test vectors (sdk/testvectors/*.json) for the agent socket,
docs/protocol.md section 11 for the tiering socket, and the frame tables of
crates/memcolo-tier/src/wire.rs for the memory server (frame decoders and a
real server's connection). Run from anywhere; the output
is committed, so run it again only when those sources change."""
import hashlib
import json
import pathlib
import re
import struct
import zlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "fuzz" / "seeds"


def write(target, blobs):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    for old in d.iterdir():
        old.unlink()
    for b in blobs:
        (d / hashlib.sha1(b).hexdigest()).write_bytes(b)


def vector_lines(name):
    v = json.loads((ROOT / "sdk" / "testvectors" / name).read_text())
    lines = [e["line"] for e in v["valid"]] + [e["line"] for e in v["invalid"]]
    t = v["too_long"]
    lines.append(t["prefix"] + t["fill"] * min(t["count"], 64) + t["suffix"])
    return [l.encode() for l in lines]


agent = vector_lines("requests.json") + vector_lines("replies.json")
write("agent_request", agent)

doc = (ROOT / "docs" / "protocol.md").read_text()
tier_section = doc[doc.index("## 11."):]
tier = sorted(set(re.findall(r'^\{"v":1,"type":"tier_[^\n]*\}$', tier_section, re.M)))
tier += [
    '{"v":1,"type":"tier_unregister","start":4096}',
    '{"v":1,"type":"tier_status"}',
    '{"v":1,"type":"tier_target","t_miss":1.0}',
    '{"v":1,"type":"tier_target_set","t_miss":0.25}',
    '{"v":1,"type":"tier_status","status":{"regions":[]}}',
    '{"v":1,"type":"error","code":"bad_request","message":"no descriptors"}',
    '{"v":1,"type":"ok"}',
]
write("tier_request", [l.encode() for l in tier])


def req(op, rid, region, page, payload=b"", crc=None):
    crc = zlib.crc32(payload) if crc is None else crc
    return struct.pack("<4sB3xQQQII", b"MCM1", op, rid, region, page, len(payload), crc) + payload


def resp(status, rid, payload=b""):
    return struct.pack("<4sB3xQII", b"MCM1", status, rid, len(payload), zlib.crc32(payload)) + payload


page = bytes(range(256)) * 16
server = [
    req(1, 1, 0, 0, struct.pack("<I", 4096)),
    req(2, 2, 7, 3, page),
    req(3, 3, 7, 3),
    req(4, 4, 7, 3),
    req(5, 5, 7, 0),
    req(6, 6, 0, 0),
    req(7, 7, 7, 0),
    req(7, 8, 7, 1 << 40, struct.pack("<I", 16)),
    req(1, 9, 0, 0, struct.pack("<I", 4096)) + req(3, 10, 1, 1) + req(6, 11, 0, 0),
]
client = [
    resp(0, 1, struct.pack("<IQ", 4096, 0x1234_5678_9ABC_DEF0)),
    resp(0, 3, page),
    resp(1, 3, b"page 7:3 not found"),
    resp(2, 2, struct.pack("<II", 1, 2)),
    resp(3, 2, struct.pack("<QQ", 1 << 30, 1 << 30)),
    resp(0, 5, struct.pack("<Q", 12)),
    resp(0, 6, struct.pack("<6Q", 1, 4096, 2, 3, 0, 0)),
    resp(0, 7, struct.pack("<3Q", 0, 3, 9)),
]
# First byte picks the side: even = server reads requests, odd = client reads responses.
write("memserver_frame", [b"\x00" + s for s in server] + [b"\x01" + c for c in client])
# What a client sends on one connection to a real server.
write("memserver_conn", server)
