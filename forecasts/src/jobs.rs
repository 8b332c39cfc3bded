//! The scenario `jobs.csv` of formats.md section 2:
//! `id,submit_utc,gpus,gpu_models,work_hours,deadline_utc,checkpoint_gb,migratable,home_site`.
//!
//! Owns parsing and row-level checks; `gpu_models` is `|`-separated, empty = any. Optional
//! columns `save_s` and `restore_s` give checkpoint write and restore times.

use chrono::{DateTime, Utc};

use crate::{ParseError, Table, parse_utc};

/// One job as submitted.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRow {
    /// Job id.
    pub id: String,
    /// Submission (release) time.
    pub submit_utc: DateTime<Utc>,
    /// Gang size.
    pub gpus: u32,
    /// Allowed GPU models; empty = any.
    pub gpu_models: Vec<String>,
    /// Work in hours at full power on a speed-1.0 GPU.
    pub work_hours: f64,
    /// Hard deadline.
    pub deadline_utc: DateTime<Utc>,
    /// Checkpoint size, GB.
    pub checkpoint_gb: f64,
    /// Whether the job may move between sites.
    pub migratable: bool,
    /// Site the job was submitted to.
    pub home_site: String,
    /// Seconds to write a checkpoint (optional column `save_s`).
    pub save_s: Option<f64>,
    /// Seconds to restore from a checkpoint (optional column `restore_s`).
    pub restore_s: Option<f64>,
}

const COLUMNS: [&str; 9] = [
    "id",
    "submit_utc",
    "gpus",
    "gpu_models",
    "work_hours",
    "deadline_utc",
    "checkpoint_gb",
    "migratable",
    "home_site",
];

/// Parses jobs CSV text; `source_name` labels errors.
pub fn parse_jobs_csv(text: &str, source_name: &str) -> Result<Vec<JobRow>, ParseError> {
    let table = Table::read(text, source_name, &COLUMNS)?;
    let mut jobs = Vec::with_capacity(table.rows.len());
    for (line, record) in &table.rows {
        let line = *line;
        let cell = |column: &str| table.get(record, column);
        let err = |column: &str, message: String| table.field_error(line, column, message);
        let id = cell("id");
        if id.is_empty() {
            return Err(err("id", "empty job id".into()));
        }
        let gpus: u32 = cell("gpus")
            .parse()
            .ok()
            .filter(|&g| g >= 1)
            .ok_or_else(|| {
                err(
                    "gpus",
                    format!("`{}` is not a whole number >= 1", cell("gpus")),
                )
            })?;
        let positive = |column: &str, allow_zero: bool| -> Result<f64, ParseError> {
            let text = cell(column);
            let value: f64 = text
                .parse()
                .map_err(|_| err(column, format!("`{text}` is not a number")))?;
            if !value.is_finite() || value < 0.0 || (!allow_zero && value == 0.0) {
                return Err(err(
                    column,
                    format!(
                        "{value} must be {}",
                        if allow_zero { ">= 0" } else { "> 0" }
                    ),
                ));
            }
            Ok(value)
        };
        let optional = |column: &str| -> Result<Option<f64>, ParseError> {
            if cell(column).is_empty() {
                Ok(None)
            } else {
                positive(column, true).map(Some)
            }
        };
        let submit_utc = parse_utc(cell("submit_utc")).map_err(|m| err("submit_utc", m))?;
        let deadline_utc = parse_utc(cell("deadline_utc")).map_err(|m| err("deadline_utc", m))?;
        if deadline_utc <= submit_utc {
            return Err(err(
                "deadline_utc",
                "deadline is not after submission".into(),
            ));
        }
        let migratable = match cell("migratable") {
            "true" | "1" | "yes" => true,
            "false" | "0" | "no" | "" => false,
            other => return Err(err("migratable", format!("`{other}` is not true or false"))),
        };
        let home_site = cell("home_site");
        if home_site.is_empty() {
            return Err(err("home_site", "empty site id".into()));
        }
        jobs.push(JobRow {
            id: id.to_string(),
            submit_utc,
            gpus,
            gpu_models: cell("gpu_models")
                .split('|')
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .collect(),
            work_hours: positive("work_hours", false)?,
            deadline_utc,
            checkpoint_gb: positive("checkpoint_gb", true)?,
            migratable,
            home_site: home_site.to_string(),
            save_s: optional("save_s")?,
            restore_s: optional("restore_s")?,
        });
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_jobs_parse() {
        let jobs = parse_jobs_csv(crate::samples::JOBS_CSV, "sample").unwrap();
        assert!(jobs.len() >= 100);
        assert!(jobs.iter().any(|j| j.gpus > 1));
    }

    #[test]
    fn rejects_zero_gpus_with_line() {
        let text = "id,submit_utc,gpus,gpu_models,work_hours,deadline_utc,checkpoint_gb,migratable,home_site\n\
                    a,2023-01-01T00:00:00Z,0,,1,2023-01-02T00:00:00Z,1,true,s\n";
        let e = parse_jobs_csv(text, "jobs.csv").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("gpus"), "{e}");
    }
}
