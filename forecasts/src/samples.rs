//! The sample fleet compiled into the binary: four sites in four grid zones, 14 days of hourly
//! signals (2023-05-20 to 2023-06-03 UTC) and 120 jobs.
//!
//! Built by `forecasts/scripts/build_samples.py` from the public traces; sources, licences and
//! the surplus rule are in `forecasts/README.md`. Owns the data only, no parsing.

/// Sites and GPU models (TOML).
pub const SITES_TOML: &str = include_str!("../data/sample_sites.toml");
/// Hourly signals in the canonical forecast CSV.
pub const SIGNALS_CSV: &str = include_str!("../data/sample_signals.csv");
/// Jobs in the scenario jobs.csv format.
pub const JOBS_CSV: &str = include_str!("../data/sample_jobs.csv");
/// First and last hour (exclusive) the sample signals cover.
pub const SIGNALS_RANGE_UTC: (&str, &str) = ("2023-05-20T00:00:00Z", "2023-06-03T00:00:00Z");
/// Planning start the demo uses: all sample jobs arrive within 24 hours of it.
pub const DEMO_START_UTC: &str = "2023-05-27T00:00:00Z";
