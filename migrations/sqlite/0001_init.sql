-- windfall schema, SQLite flavour. Keep in step with migrations/postgres/0001_init.sql.
-- Column types are limited to INTEGER, BIGINT, REAL and TEXT: sqlx's Any driver cannot decode
-- SQLite BOOLEAN or DATETIME columns. Times are RFC 3339 UTC text; JSON is text.

-- GPU models: power levels and throughput curve.
CREATE TABLE gpu_models (
    name TEXT PRIMARY KEY,
    spec_json TEXT NOT NULL
);

-- Sites: inventory and limits (the per-slot signals live in forecasts).
CREATE TABLE sites (
    id TEXT PRIMARY KEY,
    zone TEXT,
    gpus_json TEXT NOT NULL,
    pue REAL NOT NULL,
    grid_limit_kw REAL,
    wan_gbps REAL NOT NULL,
    updated_utc TEXT NOT NULL
);

-- Site-to-site bandwidth overrides.
CREATE TABLE links (
    from_site TEXT NOT NULL REFERENCES sites(id),
    to_site TEXT NOT NULL REFERENCES sites(id),
    gbps REAL NOT NULL,
    PRIMARY KEY (from_site, to_site)
);

-- Forecast values, kept per issue time and source so a plan can be audited against what was known.
CREATE TABLE forecasts (
    site_id TEXT NOT NULL REFERENCES sites(id),
    time_utc TEXT NOT NULL,
    issued_utc TEXT NOT NULL,
    source TEXT NOT NULL,
    surplus_kw REAL,
    carbon_g_per_kwh REAL,
    carbon_signal TEXT NOT NULL,
    price_usd_per_mwh REAL,
    PRIMARY KEY (site_id, time_utc, issued_utc, source)
);

-- Jobs and their lifecycle state.
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    gpus BIGINT NOT NULL,
    gpu_models TEXT NOT NULL,
    work_hours REAL NOT NULL,
    release_utc TEXT NOT NULL,
    deadline_utc TEXT NOT NULL,
    checkpoint_gb REAL NOT NULL,
    save_s REAL NOT NULL,
    restore_s REAL NOT NULL,
    migratable INTEGER NOT NULL,
    home_site TEXT NOT NULL REFERENCES sites(id),
    current_site TEXT REFERENCES sites(id),
    state_reason TEXT,
    submitted_utc TEXT NOT NULL
);
CREATE INDEX jobs_state ON jobs(state);

-- Plans: versioned by id, with metrics and the inputs' provenance.
CREATE TABLE plans (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_utc TEXT NOT NULL,
    horizon_start_utc TEXT NOT NULL,
    slot_minutes BIGINT NOT NULL,
    slots BIGINT NOT NULL,
    status TEXT NOT NULL,
    method TEXT NOT NULL,
    emissions_g REAL NOT NULL,
    lower_bound_g REAL NOT NULL,
    baseline_emissions_g REAL NOT NULL,
    grid_energy_kwh REAL NOT NULL,
    surplus_used_kwh REAL NOT NULL,
    metrics_json TEXT NOT NULL,
    provenance_json TEXT NOT NULL,
    instance_json TEXT NOT NULL
);

-- One row per job and slot of a plan.
CREATE TABLE assignments (
    plan_id BIGINT NOT NULL REFERENCES plans(id),
    job_id TEXT NOT NULL,
    slot BIGINT NOT NULL,
    site_id TEXT NOT NULL,
    power_w REAL NOT NULL,
    gpu_model TEXT,
    PRIMARY KEY (plan_id, job_id, slot)
);

-- Planned migrations.
CREATE TABLE migrations (
    plan_id BIGINT NOT NULL REFERENCES plans(id),
    job_id TEXT NOT NULL,
    from_site TEXT NOT NULL,
    to_site TEXT NOT NULL,
    slot BIGINT NOT NULL,
    transfer_s REAL NOT NULL,
    window_slots BIGINT NOT NULL,
    PRIMARY KEY (plan_id, job_id, slot)
);
