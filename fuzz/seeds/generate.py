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
    return struct.pack("<4sB3xQQQII", b"MCM2", op, rid, region, page, len(payload), crc) + payload


def resp(status, rid, payload=b""):
    return struct.pack("<4sB3xQII", b"MCM2", status, rid, len(payload), zlib.crc32(payload)) + payload


def refusal(status, reason):
    return struct.pack("<4sB3xI", b"MCM2", status, len(reason)) + reason


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
    resp(0, 1, struct.pack("<IQI", 4096, 0x1234_5678_9ABC_DEF0, 120_000)),
    resp(0, 3, page),
    resp(1, 3, b"page 7:3 not found"),
    resp(2, 2, struct.pack("<II", 1, 2)),
    resp(3, 2, struct.pack("<QQ", 1 << 30, 1 << 30)),
    resp(0, 5, struct.pack("<Q", 12)),
    resp(0, 6, struct.pack("<6Q", 1, 4096, 2, 3, 0, 0)),
    resp(0, 7, struct.pack("<3Q", 0, 3, 9)),
]
# The handshake of crates/memcolo-tier/src/channel.rs: what a client without the
# secret sends (a client hello with a made-up proof, the other mode, the old
# protocol, another protocol), and what a hostile server sends a client.
nonce = bytes(range(32))
hellos = [
    struct.pack("<4sB3x", b"MCM2", 1) + nonce + bytes(32),
    struct.pack("<4sB3x", b"MCM2", 0) + nonce + bytes(32),
    struct.pack("<4sB3x", b"MCM2", 7) + nonce,
    req(1, 1, 0, 0, struct.pack("<I", 4096)).replace(b"MCM2", b"MCM1", 1),
    b"GET / HTTP/1.1\r\nHost: memserver\r\n\r\n",
]
greetings = [
    struct.pack("<4sBB2x", b"MCM2", 0, 1) + nonce + struct.pack("<4sB3x", b"MCM2", 0) + bytes(32),
    struct.pack("<4sBB2x", b"MCM2", 0, 0) + nonce + refusal(2, b"authentication failed"),
    refusal(1, b"the server serves 64 connections already"),
    refusal(2, b"x" * 64)[:8] + struct.pack("<I", 0xFFFF_FFFF) + b"x" * 64,
    struct.pack("<4sBB2x", b"MCM1", 0, 1) + nonce,
]
# First byte (memserver_frame.rs): 0/4 server handshake, 1/5 client handshake,
# 2 server reads requests, 3 client reads responses; bit 2 fits lengths, bits 3..6
# pick damage in transit at the position in the next two bytes.
frame = [b"\x00" + h for h in hellos] + [b"\x04" + hellos[1]]
frame += [b"\x01" + g for g in greetings] + [b"\x05" + greetings[1]]
frame += [b"\x02" + s for s in server] + [b"\x03" + c for c in client]
frame += [b"\x06" + server[-1], b"\x07" + b"".join(client[:3])]
for kind in range(1, 7):
    frame.append(bytes([2 | kind << 3]) + struct.pack("<H", 77 * kind) + server[-1])
    frame.append(bytes([3 | kind << 3]) + struct.pack("<H", 91 * kind) + b"".join(client[:3]))
write("memserver_frame", frame)


# What one connection to a real server sends (memserver_conn.rs): first byte even,
# a client without the secret; odd, a client with it running a program of steps
# (command, op, region, page, payload size or 0xff for a whole page of one byte).
def step(cmd, op, region=0, page=0, payload=b"", fill=None, extra=b""):
    size = bytes([0xFF, fill]) if fill is not None else bytes([len(payload)]) + payload
    return bytes([cmd, op, region, page]) + size + extra


hello = step(0, 1, payload=struct.pack("<I", 4096))
programs = [
    hello,
    hello + step(0, 2, 7, 3, fill=0x41) + step(0, 3, 7, 3) + step(0, 7, 7, 0, payload=struct.pack("<I", 16)),
    hello + step(0, 2, 7, 4, fill=0) + step(0, 4, 7, 4) + step(0, 5, 7) + step(0, 6),
    hello + step(4, 2, 7, 5, fill=0x42) + step(0, 3, 7, 5),
    hello + step(5, 2, 7, 6, payload=b"abc", extra=b"\x00\x10\x00") + step(0, 6),
    hello + step(6, 0, payload=bytes(range(56))),
    step(0, 9) + step(0, 3, 1, 1),
]
write("memserver_conn", [b"\x00" + h for h in hellos] + [b"\x01" + p for p in programs])
