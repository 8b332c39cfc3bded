#!/usr/bin/env python3
"""Builds the bundled sample data in forecasts/data/ from the public traces in ../shared/data.

Reproducible: fixed window, fixed seed. Run from the repository root:
    python3 forecasts/scripts/build_samples.py ../shared/data
Outputs:
    forecasts/data/sample_signals.csv  canonical forecast CSV (formats.md section 3)
    forecasts/data/sample_jobs.csv     jobs in the scenario jobs.csv format (formats.md section 2)
The surplus rule and the job-drawing rules are documented in forecasts/README.md.
"""
import csv
import gzip
import math
import random
import sys
from datetime import datetime, timedelta, timezone

DATA = sys.argv[1] if len(sys.argv) > 1 else "../shared/data"
WINDOW_START = datetime(2023, 5, 20, tzinfo=timezone.utc)
DAYS = 14
# site id, Electricity Maps zone, surplus peak kW (renewable plant share the site can absorb)
SITES = [
    ("ca-solar", "US-CAL-CISO", 12.0),
    ("de-wind", "DE-LU", 12.0),
    ("au-vic", "AU-VIC", 8.0),
    ("ca-on-hydro", "CA-ON", 4.0),
]
JOBS = 120
SEED = 20230527
DEMO_START = datetime(2023, 5, 27, tzinfo=timezone.utc)  # planning start used by `windfall demo`


def fmt(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def hourly(path, time_col, value_col):
    out = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for row in csv.reader(f):
            if row[0].startswith("Datetime"):
                continue
            t = datetime.fromisoformat(row[time_col][:19]).replace(tzinfo=timezone.utc)
            out[t] = float(row[value_col])
    return out


def signals():
    rows = []
    hours = [WINDOW_START + timedelta(hours=i) for i in range(DAYS * 24)]
    for site, zone, peak_kw in SITES:
        carbon = hourly(f"{DATA}/carbon/em_greendcc_16regions_2021_2023/{zone}_2023_hourly.csv.gz", 0, 4)
        price = hourly(f"{DATA}/energy/prices_greendcc_15regions_2021_2023/{zone}_electricity_prices_2023.csv.gz", 0, 2)
        for t in hours:
            p = price[t]
            surplus = peak_kw if p <= 0.0 else 0.0
            rows.append([fmt(WINDOW_START), fmt(t), site, f"{surplus:.1f}", f"{carbon[t]:.2f}", "average", f"{p:.2f}"])
    with open("forecasts/data/sample_signals.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["issued_utc", "time_utc", "site", "surplus_kw", "carbon_g_per_kwh", "carbon_signal", "price_usd_per_mwh"])
        w.writerows(rows)


def jobs():
    rng = random.Random(SEED)
    # Gang sizes: Alibaba GPU trace v2023 (multi-GPU sample), pods with at least one whole GPU.
    gangs = []
    with gzip.open(f"{DATA}/jobs/alibaba_gpu_v2023_openb/openb_pod_list_multigpu50.csv.gz", "rt") as f:
        for row in csv.DictReader(f):
            n = int(row["num_gpu"])
            if n >= 1:
                gangs.append(n)
    # Durations and arrival offsets: GAIA's PAI-derived trace (seconds).
    with open(f"{DATA}/jobs/gaia_pai_derived/pai_1k.csv") as f:
        pai = [(float(r["arrival_time"]), float(r["length"])) for r in csv.DictReader(f)]
    sites = [s[0] for s in SITES]
    out = []
    for i in range(JOBS):
        gpus = rng.choice(gangs)
        _, length_s = rng.choice(pai)
        work_hours = min(max(length_s / 3600.0, 0.25), 20.0)
        # Arrivals spread over the first day of the demo horizon, at PAI inter-arrival order.
        submit = DEMO_START + timedelta(minutes=rng.randrange(0, 24 * 60, 5))
        slack = rng.choice([1.5, 2.0, 3.0, 4.0])
        deadline = submit + timedelta(hours=max(4.0, math.ceil(work_hours * slack)))
        deadline = min(deadline, DEMO_START + timedelta(hours=48))
        checkpoint_gb = round(math.exp(rng.uniform(math.log(5), math.log(200))), 1)
        migratable = rng.random() < 0.8
        models = rng.choice(["", "", "H100", "A100|H100"])
        out.append([f"job-{i:03d}", fmt(submit), gpus, models, f"{work_hours:.3f}", fmt(deadline),
                    checkpoint_gb, "true" if migratable else "false", rng.choice(sites)])
    out.sort(key=lambda r: (r[1], r[0]))
    with open("forecasts/data/sample_jobs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "submit_utc", "gpus", "gpu_models", "work_hours", "deadline_utc", "checkpoint_gb", "migratable", "home_site"])
        w.writerows(out)


if __name__ == "__main__":
    signals()
    jobs()
