"""Draws the Grafana dashboard's panels from a real run (see hack/dashboard.sh).

A CDS-like load runs against the local control plane through kubectl: a hatchery spawns a
worker every second or two (secret `cds-worker-config-<w>`, then pod `<w>`; one in five
pods never comes, leaving an orphan), pods end after 20-70 s, and a cleanup with a stale
view of the pods tries every 8 s to delete every worker secret. Meanwhile the guard's
/metrics are scraped every 2 s. Each panel of dashboard.json (its title and place) is then
drawn with the same computation as its query: rates over 30 s, histogram quantiles as
Prometheus interpolates them, sums by the same labels.
"""

import argparse
import json
import random
import re
import subprocess
import threading
import time
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GRACE = 20  # the guard's CDS_GUARD_GRACE_PERIOD in hack/dashboard.sh
WINDOW = 30.0  # seconds, the panels' rate interval
PREFIX = "cds_secret_guard_"


def kubectl(*args, stdin=None):
    return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True)


# --- load ---


class Load:
    def __init__(self, namespace, seconds):
        self.ns = namespace
        self.until = time.time() + seconds
        self.ending = []  # (when, pod)
        self.lock = threading.Lock()

    def spawn(self, worker):
        labels = {"CDS_HATCHERY_NAME": "hatchery-1", "CDS_WORKER_NAME": worker}
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"cds-worker-config-{worker}", "namespace": self.ns, "labels": labels},
            "stringData": {"CDS_CONFIG": "worker configuration"},
        }
        kubectl("apply", "-f", "-", stdin=json.dumps(secret))
        if random.random() < 0.2:
            return  # the pod never comes: an orphan, for the cleanup once the grace period is over
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": worker, "namespace": self.ns, "labels": labels},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "worker",
                        "image": "cds-worker",
                        "env": [
                            {
                                "name": "CDS_CONFIG",
                                "valueFrom": {
                                    "secretKeyRef": {"name": f"cds-worker-config-{worker}", "key": "CDS_CONFIG"}
                                },
                            }
                        ],
                    }
                ],
            },
        }
        kubectl("apply", "-f", "-", stdin=json.dumps(pod))
        with self.lock:
            self.ending.append((time.time() + random.uniform(20, 70), worker))

    def hatchery(self):
        n = 0
        while time.time() < self.until:
            n += 1
            self.spawn(f"w{n}")
            time.sleep(random.uniform(0.5, 2.0))

    def pods_end(self):
        # A pod that ends is deleted; the garbage collector then deletes its secret.
        while time.time() < self.until + 10:
            now = time.time()
            with self.lock:
                done = [w for t, w in self.ending if t <= now]
                self.ending = [(t, w) for t, w in self.ending if t > now]
            for worker in done:
                kubectl("-n", self.ns, "delete", "pod", worker, "--wait=false")
            time.sleep(1)

    def cleanup(self):
        # The race the guard is for: a cleanup that believes no worker pod exists.
        while time.time() < self.until:
            time.sleep(8)
            names = kubectl("-n", self.ns, "get", "secrets", "-l", "CDS_HATCHERY_NAME", "-o", "name").stdout.split()
            if names:
                kubectl("-n", self.ns, "delete", "--wait=false", *names)


# --- scraping ---


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ([^ ]+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if m:
            labels = tuple(sorted(LABEL.findall(m.group(2) or "")))
            samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def scrape(url, seconds, scrapes):
    until = time.time() + seconds + 15
    while time.time() < until:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                scrapes.append((time.time(), parse(response.read().decode())))
        except OSError:
            scrapes.append((time.time(), None))
        time.sleep(2)


# --- the panels' queries, evaluated on the scrapes ---


def at(scrapes, t):
    """The last successful scrape at or before t."""
    best = None
    for when, samples in scrapes:
        if when <= t and samples is not None:
            best = samples
    return best or {}


def rate_by(scrapes, metric, by=(), where=None):
    """sum by (BY) (rate(METRIC{WHERE}[30s])) → {label values: [(t, v)]}."""
    series = {}
    for t, now in scrapes:
        if now is None or t - scrapes[0][0] < WINDOW:
            continue
        before = at(scrapes, t - WINDOW)
        sums = {}
        for (name, labels), value in now.items():
            d = dict(labels)
            if name != metric or (where and any(d.get(k) != v for k, v in where.items())):
                continue
            key = tuple(d.get(k, "") for k in by)
            delta = value - before.get((name, labels), 0.0)
            sums[key] = sums.get(key, 0.0) + max(delta, 0.0) / WINDOW
        for key, v in sums.items():
            series.setdefault(key, []).append((t, v))
    return series


def quantile(q, buckets):
    """histogram_quantile as Prometheus computes it, from {le: cumulative count}."""
    les = sorted(buckets, key=float)
    total = buckets[les[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le in les:
        count = buckets[le]
        if count >= rank:
            if le == "+Inf":
                return float(prev_le)
            upper = float(le)
            if count == prev_count:
                return upper
            return prev_le + (upper - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = float(le) if le != "+Inf" else prev_le, count
    return None


def quantile_by(scrapes, q, metric, by=()):
    series = {}
    for t, now in scrapes:
        if now is None or t - scrapes[0][0] < WINDOW:
            continue
        before = at(scrapes, t - WINDOW)
        groups = {}
        for (name, labels), value in now.items():
            if name != metric:
                continue
            d = dict(labels)
            key = tuple(d.get(k, "") for k in by)
            delta = value - before.get((name, labels), 0.0)
            groups.setdefault(key, {})
            groups[key][d["le"]] = groups[key].get(d["le"], 0.0) + delta
        for key, buckets in groups.items():
            v = quantile(q, buckets)
            if v is not None:
                series.setdefault(key, []).append((t, v))
    return series


def gauge(scrapes, metric, transform=lambda t, v: v):
    points = []
    for t, now in scrapes:
        for (name, _), value in (now or {}).items():
            if name == metric:
                points.append((t, transform(t, value)))
    return {(): points}


# --- drawing ---


def draw(dashboard, scrapes, out):
    t0 = scrapes[0][0]
    last = at(scrapes, scrapes[-1][0])
    up = sum(1 for _, s in scrapes if s is not None)
    p = PREFIX

    def total(metric, **where):
        return sum(
            v for (n, labels), v in last.items()
            if n == metric and all(dict(labels).get(k) == w for k, w in where.items())
        )

    expiry = next((v for (n, _), v in last.items() if n == p + "certificate_expiry_timestamp_seconds"), 0)
    version = next((dict(labels)["version"] for (n, labels) in last if n == p + "build_info"), "?")
    stats = {
        "Replicas answering scrapes": f"1\n({up}/{len(scrapes)} scrapes)",
        "Denied secret deletes, last hour": f"{total(p + 'admission_decisions_total', operation='DELETE', decision='deny'):.0f}",
        "Serving certificate expires in": f"{(expiry - scrapes[-1][0]) / 86400:.0f} days",
        "Version": version,
    }
    series = {
        "Secret DELETE decisions by reason": (
            rate_by(scrapes, p + "admission_decisions_total", ("decision", "reason"), {"operation": "DELETE"}), "req/s"),
        "Pod CREATE decisions": (
            rate_by(scrapes, p + "admission_decisions_total", ("decision", "reason"), {"operation": "CREATE"}), "req/s"),
        "Admission latency": (
            {("p99",) + k: v for k, v in quantile_by(scrapes, 0.99, p + "admission_duration_seconds_bucket", ("endpoint",)).items()}
            | {("p50",) + k: v for k, v in quantile_by(scrapes, 0.5, p + "admission_duration_seconds_bucket", ("endpoint",)).items()},
            "s"),
        "Quorum lookups": (
            {("lookups",): rate_by(scrapes, p + "lookup_duration_seconds_count").get((), []),
             ("errors",): rate_by(scrapes, p + "lookup_errors_total").get((), [])}, "ops/s"),
        "Lookup latency": (
            {("p99",): quantile_by(scrapes, 0.99, p + "lookup_duration_seconds_bucket").get((), []),
             ("p50",): quantile_by(scrapes, 0.5, p + "lookup_duration_seconds_bucket").get((), [])}, "s"),
        "Adoptions": (
            {("ownerReferences added",): rate_by(scrapes, p + "owner_references_added_total").get((), []),
             ("conflicts (retried)",): rate_by(scrapes, p + "owner_reference_conflicts_total").get((), []),
             ("errors (retried)",): rate_by(scrapes, p + "reconcile_errors_total").get((), [])}, "ops/s"),
        "Adoption latency": (
            {("p99",): quantile_by(scrapes, 0.99, p + "adoption_latency_seconds_bucket").get((), []),
             ("p50",): quantile_by(scrapes, 0.5, p + "adoption_latency_seconds_bucket").get((), [])}, "s"),
        "Serving certificate": (
            gauge(scrapes, p + "certificate_expiry_timestamp_seconds", lambda t, v: (v - t) / 86400), "days left"),
        "Certificate reloads": (
            rate_by(scrapes, p + "certificate_reloads_total", ("result",)), "reloads/s"),
    }

    panels = dashboard["panels"]
    rows = max(pp["gridPos"]["y"] + pp["gridPos"]["h"] for pp in panels)
    fig = plt.figure(figsize=(20, rows * 0.55))
    fig.suptitle(f"{dashboard['title']}: {len(scrapes)} scrapes of a local run under a CDS-like load "
                 f"(x: minutes; grace period {GRACE} s)", fontsize=14, y=0.995)
    grid = fig.add_gridspec(rows, 24, hspace=4, wspace=1.5, top=0.96, bottom=0.03, left=0.04, right=0.99)
    for panel in panels:
        g = panel["gridPos"]
        ax = fig.add_subplot(grid[g["y"]:g["y"] + g["h"], g["x"]:g["x"] + g["w"]])
        ax.set_title(panel["title"], fontsize=10, loc="left")
        if panel["type"] == "stat":
            ax.axis("off")
            ax.text(0.5, 0.4, stats[panel["title"]], ha="center", va="center", fontsize=18, color="tab:green")
            continue
        lines, unit = series[panel["title"]]
        for key, points in sorted(lines.items()):
            if points:
                xs = [(t - t0) / 60 for t, _ in points]
                ax.plot(xs, [v for _, v in points], label=" ".join(k for k in key if k) or panel["title"])
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.grid(alpha=0.3)
        if any(points for points in lines.values()):
            ax.legend(fontsize=7, loc="upper left", framealpha=0.7)
        else:
            ax.text(0.5, 0.5, "none in this run", ha="center", va="center", transform=ax.transAxes, color="grey")
    fig.savefig(out, dpi=80, bbox_inches="tight")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--seconds", type=int, default=180)
    parser.add_argument("--dashboard", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scrapes", help="keep the scrapes in this JSON file (with --replay: draw from it)")
    parser.add_argument("--replay", action="store_true", help="no load: draw from --scrapes")
    args = parser.parse_args()
    random.seed(1)
    with open(args.dashboard) as f:
        dashboard = json.load(f)
    if args.replay:
        with open(args.scrapes) as f:
            scrapes = [(t, None if s is None else {(n, tuple(map(tuple, l))): v for n, l, v in s})
                       for t, s in json.load(f)]
        draw(dashboard, scrapes, args.out)
        return

    namespace = f"dashboard-{int(time.time())}"
    kubectl("create", "namespace", namespace)
    load = Load(namespace, args.seconds)
    scrapes = []
    threads = [
        threading.Thread(target=scrape, args=(args.metrics, args.seconds, scrapes)),
        threading.Thread(target=load.hatchery),
        threading.Thread(target=load.pods_end),
        threading.Thread(target=load.cleanup),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    kubectl("delete", "namespace", namespace, "--wait=false")
    if args.scrapes:
        with open(args.scrapes, "w") as f:
            json.dump([(t, None if s is None else [(n, l, v) for (n, l), v in s.items()]) for t, s in scrapes], f)
    draw(dashboard, scrapes, args.out)


if __name__ == "__main__":
    main()
