//! The validator catches each kind of violation, and accepts and prices a valid plan exactly.

use windfall_solver::{Assignment, GpuModel, Migration, Plan, validate};

use crate::fixtures::two_site_instance;

fn at(job: &str, slot: usize, site: &str, power_w: f64) -> Assignment {
    Assignment {
        job: job.into(),
        slot,
        site: site.into(),
        power_w,
        gpu_model: None,
    }
}

fn valid_plan() -> Plan {
    Plan {
        assignments: vec![
            at("j1", 1, "a", 700.0),
            at("j1", 2, "a", 700.0),
            at("fixed", 0, "b", 700.0),
        ],
        migrations: vec![],
        unplanned: vec![],
    }
}

fn violations(plan: &Plan) -> Vec<String> {
    validate(&two_site_instance(), plan).violations
}

fn assert_violation(plan: &Plan, needle: &str) {
    let found = violations(plan);
    assert!(
        found.iter().any(|v| v.contains(needle)),
        "expected a violation containing `{needle}`, got {found:?}"
    );
}

#[test]
fn accepts_a_valid_plan_and_prices_it() {
    let result = validate(&two_site_instance(), &valid_plan());
    assert!(result.valid, "{:?}", result.violations);
    // j1: 0.7 kW x 2 h x 100 g/kWh; fixed: 0.7 kW x 1 h x 300 g/kWh.
    assert!(
        (result.emissions_g - 350.0).abs() < 1e-9,
        "{}",
        result.emissions_g
    );
    assert!((result.grid_energy_kwh - 2.1).abs() < 1e-9);
    assert_eq!(result.surplus_used_kwh, 0.0);
}

#[test]
fn catches_a_slot_before_release() {
    let mut plan = valid_plan();
    plan.assignments[0].slot = 0;
    assert_violation(&plan, "starts before its release");
}

#[test]
fn catches_a_slot_after_the_deadline() {
    let mut plan = valid_plan();
    plan.assignments[1].slot = 5;
    assert_violation(&plan, "ends after its deadline");
}

#[test]
fn catches_incomplete_work() {
    let mut plan = valid_plan();
    plan.assignments.remove(1);
    assert_violation(&plan, "work hours before its deadline");
}

#[test]
fn catches_a_capped_slot_that_leaves_work_undone() {
    let mut plan = valid_plan();
    plan.assignments[1].power_w = 400.0; // 1 + 0.8 < 2 work hours
    assert_violation(&plan, "completes 1.8000 of 2.0000");
}

#[test]
fn catches_a_power_cap_that_is_not_a_level() {
    let mut plan = valid_plan();
    plan.assignments[0].power_w = 650.0;
    assert_violation(&plan, "650 W");
}

#[test]
fn catches_an_unknown_site_and_job() {
    let mut plan = valid_plan();
    plan.assignments.push(at("j1", 3, "nowhere", 700.0));
    plan.assignments.push(at("ghost", 3, "a", 700.0));
    assert_violation(&plan, "unknown site `nowhere`");
    assert_violation(&plan, "unknown job `ghost`");
}

#[test]
fn catches_a_disallowed_gpu_model() {
    let mut instance = two_site_instance();
    instance.gpu_models.insert(
        "A100".into(),
        GpuModel {
            power_levels_w: vec![400.0],
            throughput: vec![1.0],
            speed: 0.6,
            idle_w: 0.0,
        },
    );
    instance.jobs[0].gpu_models = vec!["A100".into()];
    let found = validate(&instance, &valid_plan()).violations;
    assert!(
        found.iter().any(|v| v.contains("no allowed GPU model")),
        "{found:?}"
    );
}

#[test]
fn catches_gpu_capacity_overflow() {
    let mut instance = two_site_instance();
    instance.jobs[0].gpus = 2;
    let mut plan = valid_plan();
    plan.assignments.push(at("fixed", 1, "a", 400.0));
    plan.assignments
        .retain(|a| !(a.job == "fixed" && a.site == "b"));
    let found = validate(&instance, &plan).violations;
    assert!(
        found
            .iter()
            .any(|v| v.contains("3 H100 GPUs planned but only 2")),
        "{found:?}"
    );
}

#[test]
fn catches_a_grid_limit_breach() {
    let mut plan = valid_plan();
    plan.assignments.retain(|a| a.job != "fixed");
    plan.assignments.push(at("fixed", 1, "a", 700.0)); // 1.4 kW at a, limit 1 kW
    assert_violation(&plan, "exceeds its limit of 1 kW");
}

#[test]
fn catches_a_job_placed_twice_in_one_slot() {
    let mut plan = valid_plan();
    plan.assignments.push(at("fixed", 0, "a", 400.0));
    assert_violation(&plan, "placed twice");
}

#[test]
fn catches_a_move_of_a_non_migratable_job() {
    let mut plan = valid_plan();
    plan.assignments.push(at("fixed", 1, "a", 400.0));
    plan.migrations.push(Migration {
        job: "fixed".into(),
        from: "b".into(),
        to: "a".into(),
        slot: 1,
        transfer_s: 0.0,
        window_slots: 1,
    });
    assert_violation(&plan, "not migratable");
}

#[test]
fn catches_a_migration_outside_the_feasibility_domain() {
    let mut instance = two_site_instance();
    instance.params.alpha = 0.1; // 800 s transfer needs a window of 3 slots
    let plan = Plan {
        assignments: vec![
            at("j1", 1, "a", 700.0),
            at("j1", 2, "b", 700.0),
            at("j1", 3, "b", 700.0),
            at("fixed", 0, "b", 700.0),
        ],
        migrations: vec![Migration {
            job: "j1".into(),
            from: "a".into(),
            to: "b".into(),
            slot: 2,
            transfer_s: 800.0,
            window_slots: 2,
        }],
        unplanned: vec![],
    };
    let result = validate(&instance, &plan);
    assert!(
        result
            .violations
            .iter()
            .any(|v| v.contains("feasibility domain")),
        "{:?}",
        result.violations
    );
    // The same move with alpha 0.5 is admissible, and the lost transfer time is accounted.
    let mut relaxed = instance.clone();
    relaxed.params.alpha = 0.5;
    let result = validate(&relaxed, &plan);
    assert!(result.valid, "{:?}", result.violations);
}

#[test]
fn catches_unlisted_and_phantom_migrations() {
    let plan = Plan {
        assignments: vec![
            at("j1", 1, "a", 700.0),
            at("j1", 2, "b", 700.0),
            at("j1", 3, "b", 700.0),
            at("fixed", 0, "b", 700.0),
        ],
        migrations: vec![],
        unplanned: vec![],
    };
    assert_violation(&plan, "lists no such migration");
    let mut phantom = valid_plan();
    phantom.migrations.push(Migration {
        job: "j1".into(),
        from: "b".into(),
        to: "a".into(),
        slot: 1,
        transfer_s: 800.0,
        window_slots: 2,
    });
    assert_violation(&phantom, "do not move the job");
}

#[test]
fn counts_transfer_time_as_lost_work() {
    // With the move at slot 2, 800 s of slot 2 are lost: 1 + (1 - 800/3600) = 1.78 < 2.
    let plan = Plan {
        assignments: vec![
            at("j1", 1, "a", 700.0),
            at("j1", 2, "b", 700.0),
            at("fixed", 0, "b", 700.0),
        ],
        migrations: vec![Migration {
            job: "j1".into(),
            from: "a".into(),
            to: "b".into(),
            slot: 2,
            transfer_s: 800.0,
            window_slots: 1,
        }],
        unplanned: vec![],
    };
    assert_violation(&plan, "completes 1.7778 of 2.0000");
}
