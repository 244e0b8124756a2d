"""Draws the Grafana dashboard's panels from a real Prometheus (see hack/dashboard.sh).

  dashboard.py draw   a CDS-like load runs against the local control plane through kubectl:
                      a hatchery spawns a worker every second or two (secret
                      `cds-worker-config-<w>`, then pod `<w>`; one in five pods never comes,
                      leaving an orphan), pods end after 20-70 s, a cleanup with a stale view
                      of the pods tries every 8 s to delete every worker secret, and the serving
                      certificate is renewed twice (at a third and two thirds of the run: a
                      counter's first sample, at 1, is no increase to Prometheus, so the first
                      renewal only creates the reloads' series). Prometheus scrapes the guard's
                      replicas meanwhile. Then each panel of dashboard.json is drawn from
                      Prometheus's answers to its own queries (/api/v1/query_range), with
                      Grafana's variables substituted: $__rate_interval by Grafana's rule, and
                      every query variable by the values Prometheus gives for its
                      label_values() query.
  dashboard.py alert  waits until Prometheus reports an alert firing (/api/v1/alerts) and
                      prints it.

This file computes nothing from samples: every number drawn is a value Prometheus returned.
It fails when a query returns no data, or when the alert does not fire in time.
"""

import argparse
import json
import math
import random
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

GRACE = 20  # the guard's CDS_GUARD_GRACE_PERIOD in hack/dashboard.sh


def log(message):
    print(f"dashboard.py: {message}", file=sys.stderr, flush=True)


def fail(message):
    log(f"FAILED: {message}")
    sys.exit(1)


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

    def rotate(self, command, seconds):
        # The serving certificate renewed in place, as cert-manager does: the replicas reload it.
        for _ in range(2):
            time.sleep(seconds / 3)
            result = subprocess.run(command, shell=True, capture_output=True, text=True)
            if result.returncode != 0:
                fail(f"certificate renewal failed: {result.stderr.strip()}")


# --- Prometheus's HTTP API ---


class Prometheus:
    def __init__(self, url):
        self.url = url.rstrip("/")

    def get(self, path, **params):
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            fail(f"GET {path} {params}: HTTP {error.code}: {error.read().decode(errors='replace')}")
        except OSError as error:
            fail(f"GET {path}: {error}")
        if body.get("status") != "success":
            fail(f"GET {path} {params}: {body}")
        return body["data"]

    def query_range(self, expr, start, end, step):
        data = self.get("/api/v1/query_range", query=expr, start=start, end=end, step=step)
        if data["resultType"] != "matrix":
            fail(f"{expr}: a {data['resultType']}, not a matrix")
        return data["result"]

    def label_values(self, label, selector, start, end):
        return self.get(f"/api/v1/label/{label}/values", **{"match[]": selector, "start": start, "end": end})

    def alerts(self):
        return self.get("/api/v1/alerts")["alerts"]


# --- Grafana's variables ---


LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$")
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
REGEX_SPECIAL = re.compile(r"([\\^$.|?*+()\[\]{}])")


def variables(dashboard, prometheus, start, end, step, scrape_interval):
    """Grafana's values for the dashboard's variables over the run, every value selected."""
    # Grafana: $__rate_interval = max($__interval + scrape interval, 4 × scrape interval),
    # with $__interval the query's step and the data source's scrape interval.
    values = {
        "__interval": f"{step}s",
        "__rate_interval": f"{max(step + scrape_interval, 4 * scrape_interval)}s",
        "__range": f"{int(end - start)}s",
    }
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable["type"] != "query":
            continue
        definition = variable.get("definition") or variable["query"]["query"]
        m = LABEL_VALUES.match(definition)
        if not m:
            fail(f"variable {variable['name']}: only label_values(selector, label) is understood: {definition}")
        found = prometheus.label_values(m.group(2), m.group(1), start, end)
        if not found:
            fail(f"variable {variable['name']}: Prometheus has no value for {definition}")
        # A multi-value variable becomes a regex alternation, as Grafana formats it for Prometheus.
        escaped = [REGEX_SPECIAL.sub(r"\\\\\1", v) for v in found]
        values[variable["name"]] = escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
        log(f"${variable['name']} = {values[variable['name']]} (from {definition})")
    return values


def substitute(expr, values):
    def value(m):
        name = m.group(1) or m.group(2)
        if name not in values:
            fail(f"no value for ${name} in {expr}")
        return values[name]

    return VARIABLE.sub(value, expr)


def legend(fmt, labels):
    if fmt:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


# --- the panels' answers ---


def answers(dashboard, prometheus, start, end, step, scrape_interval):
    """[{panel, targets: [{expr, query, result}]}] for every panel, straight from Prometheus."""
    values = variables(dashboard, prometheus, start, end, step, scrape_interval)
    out = []
    empty = []
    for panel in dashboard["panels"]:
        targets = []
        for target in panel.get("targets", []):
            query = substitute(target["expr"], values)
            result = prometheus.query_range(query, start, end, step)
            points = sum(1 for series in result for _, v in series["values"] if math.isfinite(float(v)))
            log(f"{panel['title']!r} [{target.get('legendFormat') or target.get('refId', '')}]: "
                f"{len(result)} series, {points} points: {query}")
            if points == 0:
                empty.append(f"{panel['title']!r}: {query}")
            targets.append({"expr": target["expr"], "query": query, "legendFormat": target.get("legendFormat", ""),
                            "result": result})
        out.append({"title": panel["title"], "targets": targets})
    if empty:
        fail("Prometheus returned no data for:\n  " + "\n  ".join(empty))
    return {"start": start, "end": end, "step": step, "variables": values, "panels": out}


# --- drawing ---


UNITS = {  # Grafana unit → (axis label, scale)
    "reqps": ("req/s", 1),
    "ops": ("ops/s", 1),
    "s": ("s", 1),
    "dtdurations": ("days", 1 / 86400),
    "short": ("", 1),
}


def stat_text(value, unit):
    if unit == "dtdurations":
        return f"{value / 86400:.0f} days"
    # Grafana's automatic decimals: none for large values (increase() extrapolates, so a
    # count over a window is seldom a whole number).
    return f"{value:.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:.2f}"


def draw(dashboard, answered, out, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = answered["start"]
    by_title = {p["title"]: p for p in answered["panels"]}
    panels = dashboard["panels"]
    rows = max(pp["gridPos"]["y"] + pp["gridPos"]["h"] for pp in panels)
    fig = plt.figure(figsize=(20, rows * 0.55))
    fig.suptitle(title, fontsize=14, y=0.995)
    grid = fig.add_gridspec(rows, 24, hspace=4, wspace=1.5, top=0.96, bottom=0.03, left=0.04, right=0.99)
    for panel in panels:
        g = panel["gridPos"]
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        axis, scale = UNITS.get(unit, (unit, 1))
        ax = fig.add_subplot(grid[g["y"]:g["y"] + g["h"], g["x"]:g["x"] + g["w"]])
        ax.set_title(panel["title"], fontsize=10, loc="left")
        targets = by_title[panel["title"]]["targets"]
        if panel["type"] == "stat":
            # Grafana's reduction "lastNotNull" of each series.
            lines = []
            for target in targets:
                for series in target["result"]:
                    finite = [float(v) for _, v in series["values"] if math.isfinite(float(v))]
                    if not finite:
                        continue
                    last = finite[-1]
                    name = legend(target["legendFormat"], series["metric"]) if target["legendFormat"] else ""
                    lines.append(f"{name}: {stat_text(last, unit)}" if name else stat_text(last, unit))
            ax.axis("off")
            ax.text(0.5, 0.4, "\n".join(lines), ha="center", va="center", fontsize=18, color="tab:green")
            continue
        for target in targets:
            for series in target["result"]:
                xs = [(float(t) - t0) / 60 for t, _ in series["values"]]
                ys = [float(v) * scale for _, v in series["values"]]
                ax.plot(xs, ys, label=legend(target["legendFormat"], series["metric"]))
        ax.set_ylabel(axis, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", framealpha=0.7)
    fig.savefig(out, dpi=80, bbox_inches="tight")


# --- commands ---


def cmd_draw(args):
    with open(args.dashboard) as f:
        dashboard = json.load(f)
    if args.replay:
        with open(args.answers) as f:
            answered = json.load(f)
    else:
        random.seed(1)
        prometheus = Prometheus(args.prometheus)
        namespace = f"dashboard-{int(time.time())}"
        kubectl("create", "namespace", namespace)
        start = time.time()
        load = Load(namespace, args.seconds)
        threads = [threading.Thread(target=load.hatchery), threading.Thread(target=load.pods_end),
                   threading.Thread(target=load.cleanup)]
        if args.rotate:
            threads.append(threading.Thread(target=load.rotate, args=(args.rotate, args.seconds)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # Two more scrapes and one rule evaluation after the load, then ask.
        time.sleep(2 * args.scrape_interval + 1)
        end = time.time()
        kubectl("delete", "namespace", namespace, "--wait=false")
        answered = answers(dashboard, prometheus, start, end, args.step, args.scrape_interval)
        answered["alerts"] = prometheus.alerts()
        if args.answers:
            with open(args.answers, "w") as f:
                json.dump(answered, f, indent=1)
        for alert in answered["alerts"]:
            log(f"while the replicas serve: alert {alert['labels']['alertname']} {alert['state']}")
        if any(a["labels"]["alertname"] == args.quiet_alert for a in answered["alerts"]):
            fail(f"{args.quiet_alert} is active while every replica serves")
    minutes = (answered["end"] - answered["start"]) / 60
    draw(dashboard, answered, args.out,
         f"{dashboard['title']}: Prometheus's answers to the panels' queries over {minutes:.0f} minutes of a local "
         f"run under a CDS-like load (x: minutes; step {answered['step']} s; "
         f"$__rate_interval {answered['variables']['__rate_interval']}; grace period {GRACE} s)")
    series = {p["title"]: sum(len(t["result"]) for t in p["targets"]) for p in answered["panels"]}
    log(f"drew {len(series)} panels into {args.out}; series per panel: {json.dumps(series)}")


def cmd_alert(args):
    prometheus = Prometheus(args.prometheus)
    deadline = time.time() + args.timeout
    seen = None
    while time.time() < deadline:
        alerts = [a for a in prometheus.alerts() if a["labels"]["alertname"] == args.name]
        state = alerts[0]["state"] if alerts else "inactive"
        if state != seen:
            now = time.strftime("%H:%M:%SZ", time.gmtime())
            log(f"{args.name}: {state} at {now}" + (f" (activeAt {alerts[0]['activeAt']})" if alerts else ""))
            seen = state
        if state == "firing":
            print(json.dumps(alerts, indent=1))
            return
        time.sleep(5)
    fail(f"{args.name} did not fire within {args.timeout} s (last state: {seen})")


def main():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    draw_args = commands.add_parser("draw", help="run the load, then draw the panels from Prometheus")
    draw_args.add_argument("--prometheus", help="Prometheus's base URL")
    draw_args.add_argument("--seconds", type=int, default=180)
    draw_args.add_argument("--scrape-interval", type=int, default=5, help="Prometheus's, in seconds")
    draw_args.add_argument("--step", type=int, default=5, help="query_range step, in seconds")
    draw_args.add_argument("--rotate", help="a shell command that renews the serving certificate, run twice")
    draw_args.add_argument("--quiet-alert", default="CdsSecretGuardDown", help="must not be active after the load")
    draw_args.add_argument("--dashboard", required=True)
    draw_args.add_argument("--out", required=True)
    draw_args.add_argument("--answers", help="keep Prometheus's answers in this JSON file (with --replay: draw from it)")
    draw_args.add_argument("--replay", action="store_true", help="no load, no Prometheus: draw from --answers")
    alert_args = commands.add_parser("alert", help="wait until an alert fires")
    alert_args.add_argument("--prometheus", required=True)
    alert_args.add_argument("--name", required=True)
    alert_args.add_argument("--timeout", type=int, required=True, help="seconds")
    args = parser.parse_args()
    if args.command == "draw":
        if args.replay and not args.answers:
            parser.error("--replay needs --answers")
        if not args.replay and not args.prometheus:
            parser.error("--prometheus is needed, except with --replay")
        cmd_draw(args)
    else:
        cmd_alert(args)


if __name__ == "__main__":
    main()
