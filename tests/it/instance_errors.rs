//! Malformed instances give errors that name the field and the problem.

use windfall_solver::Instance;

fn base() -> serde_json::Value {
    serde_json::json!({
        "start_utc": "2023-06-01T00:00:00Z", "slot_minutes": 60, "slots": 2,
        "gpu_models": { "H100": { "power_levels_w": [700], "throughput": [1.0] } },
        "sites": [ { "id": "a", "gpus": { "H100": 1 }, "surplus_kw": [0, 0], "carbon_g_per_kwh": [1, 2] } ],
        "jobs": [ { "id": "j", "gpus": 1, "work_hours": 1, "release_utc": "2023-06-01T00:00:00Z",
                    "deadline_utc": "2023-06-01T02:00:00Z", "home_site": "a" } ]
    })
}

fn error_of(value: &serde_json::Value) -> String {
    Instance::from_json(&value.to_string())
        .unwrap_err()
        .to_string()
}

#[test]
fn the_base_fixture_parses() {
    Instance::from_json(&base().to_string()).unwrap();
}

#[test]
fn bad_json_names_line_and_column() {
    let e = Instance::from_json("{\n  \"start_utc\": \"2023-06-01T00:00:00Z\",\n  oops\n}")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 3"), "{e}");
}

#[test]
fn unknown_field_is_named() {
    let mut v = base();
    v["jobs"][0]["gpu"] = serde_json::json!(2);
    let e = error_of(&v);
    assert!(
        e.contains("jobs[0]") && e.contains("unknown field `gpu`"),
        "{e}"
    );
}

#[test]
fn negative_gpus_are_refused() {
    let mut v = base();
    v["jobs"][0]["gpus"] = serde_json::json!(-1);
    let e = error_of(&v);
    assert!(e.contains("jobs[0].gpus") && e.contains("-1"), "{e}");
}

#[test]
fn deadline_before_release_is_refused() {
    let mut v = base();
    v["jobs"][0]["deadline_utc"] = serde_json::json!("2023-05-31T00:00:00Z");
    let e = error_of(&v);
    assert!(
        e.contains("deadline_utc") && e.contains("not after release"),
        "{e}"
    );
}

#[test]
fn wrong_series_length_is_refused() {
    let mut v = base();
    v["sites"][0]["carbon_g_per_kwh"] = serde_json::json!([1, 2, 3]);
    let e = error_of(&v);
    assert!(
        e.contains("sites[0].carbon_g_per_kwh") && e.contains("3 values") && e.contains("2 slots"),
        "{e}"
    );
}

#[test]
fn time_without_offset_is_refused() {
    let mut v = base();
    v["jobs"][0]["release_utc"] = serde_json::json!("2023-06-01T00:00:00");
    let e = error_of(&v);
    assert!(
        e.contains("jobs[0].release_utc") && e.contains("offset"),
        "{e}"
    );
}

#[test]
fn offsets_are_converted_to_utc() {
    let mut v = base();
    v["jobs"][0]["release_utc"] = serde_json::json!("2023-06-01T02:00:00+02:00");
    let instance = Instance::from_json(&v.to_string()).unwrap();
    assert_eq!(
        instance.jobs[0].release_utc.to_string(),
        "2023-06-01T00:00:00Z"
    );
}

#[test]
fn unknown_references_are_named() {
    let mut v = base();
    v["jobs"][0]["home_site"] = serde_json::json!("zz");
    assert!(error_of(&v).contains("unknown site `zz`"));
    let mut v = base();
    v["sites"][0]["gpus"] = serde_json::json!({ "B200": 1 });
    assert!(error_of(&v).contains("unknown GPU model `B200`"));
}
