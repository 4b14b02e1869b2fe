"""Reading metrics files (one JSON object per line) and the statistics drawn from them.
plot.py imports this module: it imports nothing else of the launcher."""
import json


def read_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass  # a line cut short by a killed process
    except FileNotFoundError:
        pass
    return rows


def merged_staleness(finals):
    """{mean, p99, max, count} over the staleness histograms of every server and worker."""
    counts = []
    for fin in finals:
        for hist in (fin.get("staleness_hist") or {}).values():
            for s, c in enumerate(hist):
                if s >= len(counts):
                    counts.extend([0] * (s + 1 - len(counts)))
                counts[s] += c
    total = sum(counts)
    if total == 0:
        return None
    mean = sum(s * c for s, c in enumerate(counts)) / total
    cum, p99 = 0, 0
    for s, c in enumerate(counts):
        cum += c
        if cum >= 0.99 * total:
            p99 = s
            break
    mx = max(s for s, c in enumerate(counts) if c > 0)
    return {"mean": mean, "p99": p99, "max": mx, "count": total}
