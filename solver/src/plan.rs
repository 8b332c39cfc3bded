//! The plan format (formats.md "Plan") and the metrics the solver reports with it.
//!
//! Owns the serialised shape of a plan and of solve metrics. It holds no logic beyond
//! (de)serialisation: the solver builds plans, the validator judges them.

use serde::{Deserialize, Serialize};

/// A placement decision for every planned job and slot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// One entry per job and slot it runs in.
    pub assignments: Vec<Assignment>,
    /// Every site change of a job, with its transfer time and window.
    #[serde(default)]
    pub migrations: Vec<Migration>,
    /// Jobs deliberately left out of the plan, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unplanned: Vec<Infeasible>,
}

/// Job `job` runs at `site` in `slot` with all its GPUs capped at `power_w`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    /// Job id.
    pub job: String,
    /// Slot index from the instance's start.
    pub slot: usize,
    /// Site id.
    pub site: String,
    /// Power cap per GPU, one of the model's levels.
    pub power_w: f64,
    /// GPU model used when the site has several that the job allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
}

/// A checkpoint move from one site to another.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Migration {
    /// Job id.
    pub job: String,
    /// Site the checkpoint leaves.
    pub from: String,
    /// Site the job resumes at.
    pub to: String,
    /// First slot at the destination.
    pub slot: usize,
    /// save + transfer + restore, seconds.
    pub transfer_s: f64,
    /// Slots from `slot` to the last slot at the destination, inclusive.
    pub window_slots: usize,
}

/// A job the plan cannot serve, named with the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Infeasible {
    /// Job id.
    pub job: String,
    /// Human explanation.
    pub reason: String,
}

/// How good a plan is and how it was found (formats.md "Metrics").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// "optimal", "feasible", or "partial" when some jobs are infeasible.
    pub status: String,
    /// Grid emissions of the plan, g CO2e.
    pub emissions_g: f64,
    /// Certified lower bound on the objective over plans serving the same jobs, g CO2e.
    pub lower_bound_g: f64,
    /// (objective - lower bound) / objective; 0 when both are 0.
    pub gap: f64,
    /// Objective value: emissions plus the configured cost and migration terms, g CO2e.
    pub objective_g: f64,
    /// Emissions of the run-now baseline over the same jobs, g CO2e.
    pub baseline_emissions_g: f64,
    /// Grid energy of the plan, kWh.
    pub grid_energy_kwh: f64,
    /// Surplus energy the plan absorbs, kWh.
    pub surplus_used_kwh: f64,
    /// Surplus energy available over the horizon, kWh.
    pub surplus_available_kwh: f64,
    /// Number of migrations.
    pub migrations: usize,
    /// Jobs that cannot be served, with reasons.
    pub infeasible_jobs: Vec<Infeasible>,
    /// How many jobs every plan leaves out, at least: those that cannot run alone, and those
    /// that the GPU-slots of their windows cannot hold even at their least needs (0 when the
    /// plan serves every job).
    #[serde(default)]
    pub left_out_at_least: usize,
    /// Wall time spent solving, seconds.
    pub solve_seconds: f64,
    /// Which algorithm produced the plan.
    pub method: String,
}

impl Plan {
    /// Parses a plan from JSON text.
    pub fn from_json(text: &str) -> Result<Plan, crate::InstanceError> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
            let path = err.path().to_string();
            let inner = err.into_inner();
            crate::InstanceError::Syntax {
                path,
                message: crate::instance::strip_position(&inner.to_string()),
                line: inner.line(),
                column: inner.column(),
            }
        })
    }

    /// Serialises the plan as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plan serialises")
    }
}
