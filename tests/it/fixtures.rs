//! Seeded instance builders shared by the tests.

use windfall_solver::Instance;

/// A small deterministic pseudo-random generator (SplitMix64), so fixtures need no crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

fn hour(start: &str, h: usize) -> String {
    let t =
        chrono::DateTime::parse_from_rfc3339(start).unwrap() + chrono::Duration::hours(h as i64);
    t.with_timezone(&chrono::Utc)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A seeded instance with `n_jobs` jobs over `n_sites` sites and `n_slots` hourly slots: solar-
/// shaped surplus at some sites, daily carbon cycles with per-site offsets, two GPU models.
pub fn random_instance(seed: u64, n_jobs: usize, n_sites: usize, n_slots: usize) -> Instance {
    let mut rng = Rng::new(seed);
    let start = "2023-06-01T00:00:00Z";
    let mut sites = Vec::new();
    for s in 0..n_sites {
        let phase = rng.uniform(0.0, 24.0);
        let base = rng.uniform(80.0, 500.0);
        let solar_kw = if s % 2 == 0 {
            rng.uniform(2.0, 8.0)
        } else {
            0.0
        };
        let surplus: Vec<f64> = (0..n_slots)
            .map(|t| {
                let x = ((t as f64 + phase) % 24.0 - 6.0) / 12.0 * std::f64::consts::PI;
                (solar_kw * x.sin()).max(0.0)
            })
            .collect();
        let carbon: Vec<f64> = (0..n_slots)
            .map(|t| {
                base * (1.0 + 0.3 * ((t as f64 + phase) / 24.0 * 2.0 * std::f64::consts::PI).cos())
            })
            .collect();
        let model = if s % 3 == 2 { "A100" } else { "H100" };
        sites.push(serde_json::json!({
            "id": format!("site-{s}"), "zone": format!("Z{s}"),
            "gpus": { model: 8 }, "pue": 1.2, "grid_limit_kw": 30.0, "wan_gbps": 10.0,
            "surplus_kw": surplus, "carbon_g_per_kwh": carbon
        }));
    }
    let mut jobs = Vec::new();
    for j in 0..n_jobs {
        let gpus = [1, 1, 2, 4][rng.below(4) as usize];
        let release = rng.below((n_slots / 2) as u64) as usize;
        let work = rng.uniform(0.5, 4.0);
        let span = (work.ceil() as usize * 2 + rng.below(6) as usize).max(2);
        let deadline = (release + span).min(n_slots);
        jobs.push(serde_json::json!({
            "id": format!("job-{j:02}"), "gpus": gpus, "gpu_models": [],
            "work_hours": work.min((deadline - release) as f64 * 0.9),
            "release_utc": hour(start, release), "deadline_utc": hour(start, deadline),
            "checkpoint_gb": rng.uniform(5.0, 100.0), "save_s": 30, "restore_s": 60,
            "migratable": rng.below(4) != 0,
            "home_site": format!("site-{}", rng.below(n_sites as u64))
        }));
    }
    let value = serde_json::json!({
        "start_utc": start, "slot_minutes": 60, "slots": n_slots,
        "gpu_models": {
            "H100": { "power_levels_w": [700, 550, 400], "throughput": [1.0, 0.92, 0.78], "speed": 1.0, "idle_w": 50 },
            "A100": { "power_levels_w": [400, 300], "throughput": [1.0, 0.85], "speed": 0.6, "idle_w": 40 }
        },
        "sites": sites, "jobs": jobs
    });
    Instance::from_json(&value.to_string()).expect("fixture is a valid instance")
}

/// A hand-built two-site instance for validator tests: `a` (clean, small) and `b`.
pub fn two_site_instance() -> Instance {
    let text = r#"{
      "start_utc": "2023-06-01T00:00:00Z", "slot_minutes": 60, "slots": 6,
      "gpu_models": { "H100": { "power_levels_w": [700, 400], "throughput": [1.0, 0.8], "idle_w": 0 } },
      "sites": [
        { "id": "a", "gpus": { "H100": 2 }, "pue": 1.0, "grid_limit_kw": 1.0, "wan_gbps": 1,
          "surplus_kw": [0, 0, 0, 0, 0, 0], "carbon_g_per_kwh": [100, 100, 100, 100, 100, 100] },
        { "id": "b", "gpus": { "H100": 2 }, "pue": 1.0, "wan_gbps": 1,
          "surplus_kw": [0, 0, 0, 0, 0, 0], "carbon_g_per_kwh": [300, 300, 300, 300, 300, 300] }
      ],
      "jobs": [
        { "id": "j1", "gpus": 1, "work_hours": 2, "release_utc": "2023-06-01T01:00:00Z",
          "deadline_utc": "2023-06-01T05:00:00Z", "checkpoint_gb": 100, "save_s": 0, "restore_s": 0,
          "migratable": true, "home_site": "a" },
        { "id": "fixed", "gpus": 1, "work_hours": 1, "release_utc": "2023-06-01T00:00:00Z",
          "deadline_utc": "2023-06-01T06:00:00Z", "migratable": false, "home_site": "b" }
      ],
      "params": { "alpha": 0.5, "transfer_kwh_per_gb": 0 }
    }"#;
    Instance::from_json(text).unwrap()
}
