"""Reading metrics files (one JSON object per line), the evaluations on a resumed run's final
path, the staleness statistics of a PS run, and grouping runs by their sweep labels. plot.py imports this module: it imports nothing of the
rest of the launcher."""
import json


def read_jsonl(path):
    """The JSON objects of a metrics file, one per line; [] when there is no file. A line cut
    short (a killed process) is skipped."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
    except FileNotFoundError:
        pass
    return rows


def last_life(evals, repeats=False):
    """The evaluations on the path of the run's final θ: a resumed run's evaluator goes back to
    the checkpoint's epoch, and the evaluations after it in the life before are of lost work.
    Of evaluations at one epoch the last (a curve's point), or with `repeats` each (the first
    to reach a target: the final θ evaluated again at its epoch, a checkpoint's at its)."""
    out = []
    for e in reversed(evals):
        if e.get("epoch") is None:
            continue
        if not out or e["epoch"] < out[-1]["epoch"] or (repeats and e["epoch"] == out[-1]["epoch"]):
            out.append(e)
    return out[::-1]


def staleness_by_worker(server_finals):
    """{worker: [count per staleness value]} over the servers' final lines (kind "server_final"):
    the sum of every server's "staleness_hist" (keys are the ranks of the workers that pushed, as
    strings)."""
    hist = {}
    for fin in server_finals:
        for w, counts in (fin.get("staleness_hist") or {}).items():
            if not counts:
                continue
            acc = hist.setdefault(int(w), [])
            if len(counts) > len(acc):
                acc.extend([0] * (len(counts) - len(acc)))
            for s, c in enumerate(counts):
                acc[s] += c
    return hist


STALENESS_CAP = 1023  # a server's last histogram bucket holds this staleness and every larger one (shard_state.cpp)


def whole_shards(server_finals):
    """Each shard's histograms once. A server's counts are cumulative: a resumed or restarted
    server goes on from its checkpoint's (a resumed run's file has a final line per life), a
    backup holds its primary's; so the final line with the most counts is the shard's whole.
    Lines without a shard count each."""
    best, rest = {}, []
    for fin in server_finals:
        if fin.get("staleness_hist") is None or "shard" not in fin:
            rest.append(fin)
            continue
        total = sum(sum(c) for c in fin["staleness_hist"].values())
        if fin["shard"] not in best or total >= best[fin["shard"]][0]:
            best[fin["shard"]] = (total, fin)
    return [fin for _, fin in best.values()] + rest


def staleness_stats(server_finals):
    """{mean, p99, max, count} of the staleness of the applied pushes, or None without any.

    The staleness of a push at a server is the number of versions of that server's shard made
    between the pull the worker computed its gradient on and the push's arrival. Every push
    reaches all S servers, and each server counts it in its "staleness_hist" (per worker, one
    count per staleness value; the last value of the server's histogram also holds every larger
    one). mean, p99 and max are those of the merged histograms of all servers, the distribution
    over (push, shard) pairs; p99 is the smallest s with at least 99% of the pairs at s or less.
    count is the number of pushes: the merged total divided by the number of servers that
    reported a histogram (an integer unless a server missed pushes the others counted). Each
    shard counts once (whole_shards). capped_at: present when pushes were at STALENESS_CAP or
    beyond, which the servers count there: max and p99 there read "at least", the mean is low.
    """
    reported = [fin for fin in whole_shards(server_finals) if fin.get("staleness_hist") is not None]
    merged = []
    for counts in staleness_by_worker(reported).values():
        if len(counts) > len(merged):
            merged.extend([0] * (len(counts) - len(merged)))
        for s, c in enumerate(counts):
            merged[s] += c
    total = sum(merged)
    if total == 0:
        return None
    cum, p99 = 0, 0
    for s, c in enumerate(merged):
        cum += c
        if 100 * cum >= 99 * total:
            p99 = s
            break
    count = total // len(reported) if total % len(reported) == 0 else total / len(reported)
    out = {"mean": sum(s * c for s, c in enumerate(merged)) / total, "p99": p99,
           "max": max(s for s, c in enumerate(merged) if c > 0), "count": count}
    if out["max"] >= STALENESS_CAP:
        out["capped_at"] = STALENESS_CAP
    return out


BATCH_KEYS = ("batch=", "accumulate=", "workers=", "seed=")


def without_batch(label):
    """A run's sweep label without what sets its global batch (and its seed): the runs of one
    method at every global batch share it."""
    parts = [p.removeprefix("variant=") for p in (label or "run").split(",") if not p.startswith(BATCH_KEYS)]
    return ",".join(parts) or "run"
