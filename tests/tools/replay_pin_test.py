#!/usr/bin/env python3
"""`kvtier replay --pin-system-prompt`: the hierarchy run pins the system-prompt workload's shared
prompt (8 blocks of 512 tokens) in the named tiers, renewing the pin until it covers all of it;
the report's pin block shows the prompt covered and the pinned tokens of each named tier (0 in the
others), the file store keeps the pages (store_pinned), and every loaded byte checks out. With a
TTL shorter than the run (--pin-ttl), the pin has ended by the end: pins_expired 1 and nothing
pinned.

Usage: replay_pin_test.py KVTIER
"""
import json
import os
import subprocess
import sys
import tempfile

PROMPT = 8 * 512


def run(kvtier, out, extra, rate="200"):
    cmd = [kvtier, "replay", "--workload", "system-prompt", "--requests", "40", "--rate", rate,
           "--seed", "4", "--model", "tiny", "--compute-model", "llama3-8b", "--device", "cpu",
           "--compute", "model", "--device-tokens", "8192", "--host-tokens", "16384",
           "--hicache-write-policy", "write_through", "--runs", "hierarchy", "--no-progress",
           "--metrics", "--json", out] + extra
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=240)
    if proc.returncode != 0:
        raise SystemExit("FAIL: exit %d\n%s" % (proc.returncode, proc.stdout[-3000:]))
    with open(out) as f:
        report = json.load(f)
    hier = [r for r in report["runs"] if r["name"] == "hierarchy"][0]
    return proc.stdout, hier


def check(cond, message):
    if not cond:
        raise SystemExit("FAIL: " + message)


def main():
    kvtier = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        text, hier = run(kvtier, out, ["--pin-system-prompt", "device,storage"])
        pin = hier.get("pin")
        check(pin is not None, "no pin block in the report")
        check(pin["system_prompt_tokens"] == PROMPT, "prompt %r" % pin)
        check(pin["covered_tokens"] == PROMPT, "the pin does not cover the prompt: %r" % pin)
        check(pin["pinned_tokens"] == {"device": PROMPT, "host": 0, "storage": PROMPT},
              "pinned tokens %r" % pin["pinned_tokens"])
        check(pin["store_pinned"], "the file store did not pin the pages")
        check(pin["pins_expired"] == 0, "a pin without TTL expired")
        check(hier["integrity"]["wrong_bytes"] == 0, "wrong bytes")
        check('kvtier:pinned_tokens{tier="device"} %d' % PROMPT in text, "metrics")
        check("pin: system prompt of %d tokens pinned in device,storage" % PROMPT in text,
              "report line")
        print("pinned:", pin)

        # A TTL far shorter than the run: renewed only until covered, then it runs out.
        text, hier = run(kvtier, out, ["--pin-system-prompt", "all", "--pin-ttl", "0.001"],
                         rate="20")
        pin = hier["pin"]
        check(pin["pins_expired"] >= 1, "the TTL did not end the pin: %r" % pin)
        check(pin["pinned_tokens"] == {"device": 0, "host": 0, "storage": 0},
              "pinned after the TTL: %r" % pin["pinned_tokens"])
        check(hier["integrity"]["wrong_bytes"] == 0, "wrong bytes")
        print("with a TTL:", pin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
