-- Planner service: job owners and commands, API tokens, agent heartbeats and events.
-- Keep in step with migrations/sqlite/0002_service.sql.

ALTER TABLE jobs ADD COLUMN owner TEXT;
ALTER TABLE jobs ADD COLUMN command TEXT;

-- Bearer tokens: only a SHA-256 hash of each token is stored; `id` is its public prefix.
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    site_id TEXT REFERENCES sites(id),
    created_utc TEXT NOT NULL
);

-- The newest heartbeat and inventory per site agent.
CREATE TABLE heartbeats (
    site_id TEXT PRIMARY KEY REFERENCES sites(id),
    time_utc TEXT NOT NULL,
    inventory_json TEXT NOT NULL
);

-- Agent events: job started, progress, checkpoint written, migration sent/received, finished, failed.
CREATE TABLE events (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    site_id TEXT NOT NULL REFERENCES sites(id),
    job_id TEXT,
    kind TEXT NOT NULL,
    detail_json TEXT NOT NULL,
    time_utc TEXT NOT NULL
);
CREATE INDEX events_job ON events(job_id);
