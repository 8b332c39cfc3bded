-- Checkpoint transfers between site agents: one short-lived token per migration.
-- Keep in step with migrations/postgres/0003_transfers.sql.

-- Only a SHA-256 hash of each transfer token is stored.
CREATE TABLE transfer_tokens (
    hash TEXT PRIMARY KEY,
    job_id TEXT NOT NULL REFERENCES jobs(id),
    from_site TEXT NOT NULL REFERENCES sites(id),
    to_site TEXT NOT NULL REFERENCES sites(id),
    plan_id BIGINT NOT NULL,
    created_utc TEXT NOT NULL,
    expires_utc TEXT NOT NULL
);
