#!/usr/bin/env python3
"""Plots of `kvtier replay --json`: hit rate over time per tier, TTFT CDF of the runs, and, with
--sweep, hit rate and TTFT against the swept capacity.

Usage: replay_plot.py REPLAY.json OUT.png
Exit codes: 0 written, 2 bad arguments or input, 3 matplotlib missing (Debian: python3-matplotlib).
kvtier embeds this file and runs it for `kvtier replay --plot`.
"""
import json
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:
    sys.stderr.write("replay_plot.py: matplotlib is missing (apt-get install python3-matplotlib): "
                     "%s\n" % e)
    sys.exit(3)

COLORS = {"device": "#1b9e77", "host": "#d95f02", "storage": "#7570b3",
          "no_cache": "#999999", "device_only": "#e7298a", "hierarchy": "#1f78b4",
          "ideal": "#33a02c"}


def rolling_hit_rates(t, window):
    """Per request: hit rate of each tier over the last `window` requests (token-weighted)."""
    n = len(t["input_tokens"])
    out = {k: [] for k in ("device", "host", "storage")}
    sums = {"device": 0, "host": 0, "storage": 0, "input": 0}
    for i in range(n):
        for k in ("device", "host", "storage"):
            sums[k] += t[k + "_hit"][i]
        sums["input"] += t["input_tokens"][i]
        if i >= window:
            for k in ("device", "host", "storage"):
                sums[k] -= t[k + "_hit"][i - window]
            sums["input"] -= t["input_tokens"][i - window]
        for k in ("device", "host", "storage"):
            out[k].append(100.0 * sums[k] / sums["input"] if sums["input"] else 0.0)
    return out


def cdf(values):
    xs = sorted(values)
    n = len(xs)
    return xs, [100.0 * (i + 1) / n for i in range(n)]


def main():
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    try:
        with open(sys.argv[1]) as f:
            report = json.load(f)
        timeline = report["timeline"]
        hier = timeline["hierarchy"]
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write("replay_plot.py: cannot read %s: %s\n" % (sys.argv[1], e))
        return 2
    sweep = report.get("sweep") or []
    rows = 2 if sweep else 1
    fig, axes = plt.subplots(rows, 2, figsize=(13, 4.6 * rows), squeeze=False)

    ax = axes[0][0]
    n = len(hier["input_tokens"])
    window = max(1, min(500, n // 20))
    rates = rolling_hit_rates(hier, window)
    xs = [a / 1000.0 for a in hier["arrival_ms"]]
    ax.stackplot(xs, rates["device"], rates["host"], rates["storage"],
                 labels=["device", "host", "storage"],
                 colors=[COLORS["device"], COLORS["host"], COLORS["storage"]], alpha=0.85)
    if "fault" in report["runs"][-1]:
        ax.axvline(report["runs"][-1]["fault"]["at_s"], color="black", ls="--", lw=1,
                   label="storage down")
    ax.set_xlabel("arrival (s, replay clock)")
    ax.set_ylabel("hit rate, %% of input tokens (last %d requests)" % window)
    ax.set_title("Hierarchy: hit rate over time per tier")
    ax.set_ylim(0, 100)
    ax.legend(loc="upper left")

    ax = axes[0][1]
    for name in ("no_cache", "device_only", "hierarchy"):
        if name in timeline:
            x, y = cdf(timeline[name]["ttft_ms"])
            ax.plot(x, y, label=name.replace("_", " "), color=COLORS[name])
    if "ideal_ttft_ms" in hier:
        x, y = cdf(hier["ideal_ttft_ms"])
        ax.plot(x, y, label="ideal (hierarchy)", color=COLORS["ideal"], ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("% of requests")
    ax.set_title("TTFT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")

    if sweep:
        values = [p["value"] for p in sweep]
        ax = axes[1][0]
        for tier in ("device", "host", "storage"):
            ax.plot(values, [100 * p["hit_rate_by_tier"][tier] for p in sweep], marker="o",
                    label=tier, color=COLORS[tier])
        ax.plot(values, [100 * p["hit_rate"] for p in sweep], marker="o", label="total",
                color="black")
        ax.set_xlabel(sweep[0]["knob"])
        ax.set_ylabel("hit rate (%)")
        ax.set_title("Hit rate against capacity")
        ax.legend()
        ax = axes[1][1]
        for q in ("p50", "p90"):
            ax.plot(values, [p["ttft_ms"][q] for p in sweep], marker="o", label="TTFT " + q)
        ax.set_xlabel(sweep[0]["knob"])
        ax.set_ylabel("TTFT (ms)")
        ax.set_title("TTFT against capacity")
        ax.legend()

    fig.suptitle("kvtier replay: %s\n%s" % (report.get("workload", ""), report.get("model", "")),
                 fontsize=10)
    fig.tight_layout()
    try:
        # format given: matplotlib then writes exactly this path (never "PATH.png" beside it)
        fig.savefig(sys.argv[2], dpi=110, format="png")
    except OSError as e:
        sys.stderr.write("replay_plot.py: cannot write %s: %s\n" % (sys.argv[2], e))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
