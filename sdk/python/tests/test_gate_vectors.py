"""The shared allow-rate gate vectors (sdk/testvectors/gate.json, generated from the
Rust SDK's gate): every case replayed on :class:`memcolo.AllowRateGate` with a
synthetic clock. Times in the file are nanoseconds; this gate takes seconds."""

import json
import os

import pytest

from memcolo.gate import AllowRateGate

GATE_JSON = os.path.join(os.path.dirname(__file__), "..", "..", "testvectors", "gate.json")

with open(GATE_JSON, encoding="utf-8") as f:
    CASES = json.load(f)["cases"]


def s(t_ns):
    return t_ns / 1e9


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_gate_vector(case):
    gate = AllowRateGate(num_epochs=case["num_epochs"], clock=lambda: 0.0,
                         min_epoch_s=case["min_epoch_ns"] / 1e9)
    for i, step in enumerate(case["steps"]):
        where = "%s step %d %r" % (case["name"], i, step)
        op = step["op"]
        if op == "signal":
            if step["level"] != "low":
                gate.signal_received(s(step["t_ns"]))
        elif op == "handled":
            if step["level"] != "low":
                gate.signal_handled(s(step["t_ns"]))
        elif op == "rate":
            assert gate.allow_rate(s(step["t_ns"])) == pytest.approx(step["rate"], abs=1e-12), where
        elif op == "admit":
            got = [gate.admit(s(step["t_ns"])) for _ in step["admitted"]]
            assert got == step["admitted"], where
        elif op == "epoch":
            want = step["epoch_ns"]
            if want is None:
                assert gate.epoch_s is None, where
            else:
                assert gate.epoch_s == pytest.approx(want / 1e9, abs=1e-12), where
        else:
            raise AssertionError("unknown op in %s" % where)
