//! GPU inventory and power caps behind the [`Gpus`] trait: NVML on real hardware, a simulated
//! backend that a site's configuration must choose explicitly, and a dry-run wrapper.
//!
//! Owns clamping a planned cap to what a device accepts and reading the applied limit back. Must
//! not decide which job gets which GPU (the agent does) and must never fall back silently from
//! NVML to the simulated backend.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// A GPU backend failure, naming the device where there is one.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// NVML's library or driver is not there.
    #[error(
        "NVML is not available on this machine ({0}); install the NVIDIA driver, or choose \
         `backend = \"simulated\"` in the agent configuration for a site without GPUs"
    )]
    NvmlMissing(String),
    /// NVML answered with an error for one call.
    #[error("GPU {index}: {action} failed: {message}")]
    Device {
        /// Device index.
        index: u32,
        /// What was asked.
        action: &'static str,
        /// NVML's message.
        message: String,
    },
    /// The index names no device.
    #[error("no GPU with index {0}")]
    NoSuchGpu(u32),
}

/// One device as the backend reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuInfo {
    /// Device index (as `CUDA_VISIBLE_DEVICES` counts).
    pub index: u32,
    /// The model name the planner knows (e.g. `H100`).
    pub model: String,
    /// The device's own name (e.g. `NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Total memory, MiB.
    pub memory_total_mib: u64,
    /// Power draw now, W.
    pub power_usage_w: f64,
    /// Lowest power limit the device accepts, W.
    pub min_limit_w: u32,
    /// Highest power limit the device accepts, W.
    pub max_limit_w: u32,
    /// The power limit in force, W.
    pub limit_w: u32,
}

/// Reads GPUs and sets their power limits.
pub trait Gpus: Send {
    /// The backend's name for logs (`nvml`, `simulated`, `dry-run(...)`).
    fn name(&self) -> String;
    /// Every device with its limits.
    fn inventory(&mut self) -> Result<Vec<GpuInfo>, GpuError>;
    /// Sets device `index`'s power limit to `limit_w` (already clamped) and returns the limit
    /// read back from the device.
    fn set_power_limit(&mut self, index: u32, limit_w: u32) -> Result<u32, GpuError>;
}

/// The planner's model name for an NVML device name: a configured mapping first, else the first
/// word after an `NVIDIA ` prefix (`NVIDIA H100 80GB HBM3` -> `H100`).
pub fn model_of(name: &str, names: &BTreeMap<String, String>) -> String {
    if let Some(model) = names.get(name) {
        return model.clone();
    }
    let rest = name.strip_prefix("NVIDIA ").unwrap_or(name);
    rest.split_whitespace().next().unwrap_or(rest).to_string()
}

/// NVML through nvml-wrapper; the library is loaded at run time.
pub struct NvmlGpus {
    nvml: nvml_wrapper::Nvml,
    names: BTreeMap<String, String>,
}

impl NvmlGpus {
    /// Loads NVML (from `lib_path` when given). Fails plainly when NVML is not installed.
    pub fn open(
        lib_path: Option<&str>,
        names: BTreeMap<String, String>,
    ) -> Result<NvmlGpus, GpuError> {
        let nvml = match lib_path {
            Some(path) => nvml_wrapper::Nvml::builder()
                .lib_path(std::ffi::OsStr::new(path))
                .init(),
            None => nvml_wrapper::Nvml::init(),
        }
        .map_err(|e| GpuError::NvmlMissing(e.to_string()))?;
        Ok(NvmlGpus { nvml, names })
    }
}

fn device_error(
    index: u32,
    action: &'static str,
) -> impl Fn(nvml_wrapper::error::NvmlError) -> GpuError {
    move |e| GpuError::Device {
        index,
        action,
        message: e.to_string(),
    }
}

impl Gpus for NvmlGpus {
    fn name(&self) -> String {
        "nvml".into()
    }

    fn inventory(&mut self) -> Result<Vec<GpuInfo>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(device_error(0, "counting devices"))?;
        let mut out = Vec::new();
        for index in 0..count {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(device_error(index, "opening the device"))?;
            let name = device
                .name()
                .map_err(device_error(index, "reading its name"))?;
            let memory = device
                .memory_info()
                .map_err(device_error(index, "reading memory"))?;
            let usage_mw = device
                .power_usage()
                .map_err(device_error(index, "reading power usage"))?;
            let limits = device
                .power_management_limit_constraints()
                .map_err(device_error(index, "reading power-limit constraints"))?;
            let limit_mw = device
                .power_management_limit()
                .map_err(device_error(index, "reading the power limit"))?;
            out.push(GpuInfo {
                index,
                model: model_of(&name, &self.names),
                name,
                memory_total_mib: memory.total / (1024 * 1024),
                power_usage_w: f64::from(usage_mw) / 1000.0,
                min_limit_w: limits.min_limit / 1000,
                max_limit_w: limits.max_limit / 1000,
                limit_w: limit_mw / 1000,
            });
        }
        Ok(out)
    }

    fn set_power_limit(&mut self, index: u32, limit_w: u32) -> Result<u32, GpuError> {
        let mut device = self
            .nvml
            .device_by_index(index)
            .map_err(device_error(index, "opening the device"))?;
        device
            .set_power_management_limit(limit_w.saturating_mul(1000))
            .map_err(device_error(index, "setting the power limit"))?;
        let read = device
            .power_management_limit()
            .map_err(device_error(index, "reading the power limit back"))?;
        Ok(read / 1000)
    }
}

/// Simulated devices of one model, as a site's configuration lists them.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SimulatedModel {
    /// The planner's model name.
    pub model: String,
    /// How many.
    pub count: u32,
    /// Lowest accepted power limit, W.
    pub min_limit_w: u32,
    /// Highest accepted power limit (and the default), W.
    pub max_limit_w: u32,
    /// Memory per device, MiB.
    #[serde(default = "default_memory_mib")]
    pub memory_mib: u64,
    /// Devices that refuse power-limit changes, as some do without root.
    #[serde(default)]
    pub reject_limits: bool,
}

fn default_memory_mib() -> u64 {
    81_920
}

/// Devices that exist only in the configuration; their limits live in memory and can be read by
/// whoever holds a clone (tests, the agent's status).
#[derive(Clone, Debug)]
pub struct SimulatedGpus {
    devices: Arc<Mutex<Vec<(GpuInfo, bool)>>>,
}

impl SimulatedGpus {
    /// Devices numbered in the order the models are listed.
    pub fn new(models: &[SimulatedModel]) -> SimulatedGpus {
        let mut devices = Vec::new();
        for m in models {
            for _ in 0..m.count {
                let index = devices.len() as u32;
                devices.push((
                    GpuInfo {
                        index,
                        model: m.model.clone(),
                        name: format!("simulated {}", m.model),
                        memory_total_mib: m.memory_mib,
                        power_usage_w: 0.0,
                        min_limit_w: m.min_limit_w,
                        max_limit_w: m.max_limit_w,
                        limit_w: m.max_limit_w,
                    },
                    m.reject_limits,
                ));
            }
        }
        SimulatedGpus {
            devices: Arc::new(Mutex::new(devices)),
        }
    }
}

impl Gpus for SimulatedGpus {
    fn name(&self) -> String {
        "simulated".into()
    }

    fn inventory(&mut self) -> Result<Vec<GpuInfo>, GpuError> {
        let devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        Ok(devices.iter().map(|(d, _)| d.clone()).collect())
    }

    fn set_power_limit(&mut self, index: u32, limit_w: u32) -> Result<u32, GpuError> {
        let mut devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        let (device, rejects) = devices
            .get_mut(index as usize)
            .ok_or(GpuError::NoSuchGpu(index))?;
        if *rejects {
            return Err(GpuError::Device {
                index,
                action: "setting the power limit",
                message: "Insufficient Permissions (simulated)".into(),
            });
        }
        if limit_w < device.min_limit_w || limit_w > device.max_limit_w {
            return Err(GpuError::Device {
                index,
                action: "setting the power limit",
                message: format!(
                    "{limit_w} W is outside [{}, {}] W",
                    device.min_limit_w, device.max_limit_w
                ),
            });
        }
        device.limit_w = limit_w;
        Ok(device.limit_w)
    }
}

/// Reads through to the real backend and logs the limits it would set, changing nothing.
pub struct DryRun(pub Box<dyn Gpus>);

impl Gpus for DryRun {
    fn name(&self) -> String {
        format!("dry-run({})", self.0.name())
    }

    fn inventory(&mut self) -> Result<Vec<GpuInfo>, GpuError> {
        self.0.inventory()
    }

    fn set_power_limit(&mut self, index: u32, limit_w: u32) -> Result<u32, GpuError> {
        tracing::info!(gpu = index, limit_w, "dry run: would set the power limit");
        let current = self
            .0
            .inventory()?
            .into_iter()
            .find(|d| d.index == index)
            .ok_or(GpuError::NoSuchGpu(index))?;
        Ok(current.limit_w)
    }
}

/// What happened to one device's cap.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CapOutcome {
    /// Device index.
    pub gpu: u32,
    /// The plan's cap, W.
    pub requested_w: u32,
    /// The cap after clamping to the device and the site budget, W.
    pub clamped_w: u32,
    /// The limit read back from the device, W (the setting in force if the change failed).
    pub applied_w: u32,
    /// Why the change failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `requested_w` clamped to the device's accepted range and to `budget_w`.
pub fn clamp_cap(requested_w: u32, device: &GpuInfo, budget_w: u32) -> u32 {
    requested_w.min(budget_w).clamp(
        device.min_limit_w,
        device.max_limit_w.max(device.min_limit_w),
    )
}

/// Sets each of `gpus` to `requested_w` clamped to its range and to `budget_per_gpu_w`, reads the
/// limits back and reports every device, failures included (the job then runs at the setting in
/// force, the nearest the device allows).
pub fn apply_caps(
    backend: &mut dyn Gpus,
    gpus: &[u32],
    requested_w: u32,
    budget_per_gpu_w: u32,
) -> Result<Vec<CapOutcome>, GpuError> {
    let inventory = backend.inventory()?;
    let mut out = Vec::new();
    for &index in gpus {
        let device = inventory
            .iter()
            .find(|d| d.index == index)
            .ok_or(GpuError::NoSuchGpu(index))?;
        let clamped = clamp_cap(requested_w, device, budget_per_gpu_w);
        let outcome = match backend.set_power_limit(index, clamped) {
            Ok(applied) => CapOutcome {
                gpu: index,
                requested_w,
                clamped_w: clamped,
                applied_w: applied,
                error: None,
            },
            Err(e) => CapOutcome {
                gpu: index,
                requested_w,
                clamped_w: clamped,
                applied_w: device.limit_w,
                error: Some(e.to_string()),
            },
        };
        out.push(outcome);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100(count: u32, reject: bool) -> SimulatedGpus {
        SimulatedGpus::new(&[SimulatedModel {
            model: "H100".into(),
            count,
            min_limit_w: 200,
            max_limit_w: 700,
            memory_mib: 81_920,
            reject_limits: reject,
        }])
    }

    #[test]
    fn caps_are_clamped_to_the_device_and_the_budget_and_read_back() {
        let mut gpus = h100(2, false);
        let out = apply_caps(&mut gpus, &[0, 1], 900, 10_000).unwrap();
        assert!(out.iter().all(|o| o.applied_w == 700 && o.error.is_none()));
        let out = apply_caps(&mut gpus, &[1], 100, 10_000).unwrap();
        assert_eq!(out[0].applied_w, 200);
        let out = apply_caps(&mut gpus, &[0], 600, 350).unwrap();
        assert_eq!(out[0].applied_w, 350);
        let inv = gpus.inventory().unwrap();
        assert_eq!((inv[0].limit_w, inv[1].limit_w), (350, 200));
    }

    #[test]
    fn a_device_that_rejects_limits_is_reported_and_keeps_its_setting() {
        let mut gpus = h100(1, true);
        let out = apply_caps(&mut gpus, &[0], 400, 10_000).unwrap();
        assert_eq!(out[0].applied_w, 700);
        assert!(
            out[0].error.as_deref().unwrap().contains("GPU 0"),
            "{out:?}"
        );
    }

    #[test]
    fn dry_run_changes_nothing() {
        let sim = h100(1, false);
        let mut dry = DryRun(Box::new(sim.clone()));
        let out = apply_caps(&mut dry, &[0], 300, 10_000).unwrap();
        assert_eq!(out[0].applied_w, 700);
        assert_eq!(sim.clone().inventory().unwrap()[0].limit_w, 700);
    }

    #[test]
    fn missing_nvml_says_so() {
        let err = NvmlGpus::open(Some("/nonexistent/libnvidia-ml.so.1"), BTreeMap::new())
            .err()
            .expect("no NVML here");
        let text = err.to_string();
        assert!(text.contains("NVML is not available"), "{text}");
    }

    /// Reads (never sets) the real GPUs where NVML is installed; elsewhere checks the plain error.
    #[test]
    fn nvml_inventory_is_read_when_a_gpu_is_present() {
        match NvmlGpus::open(None, BTreeMap::new()) {
            Ok(mut gpus) => {
                let inventory = gpus.inventory().expect("NVML lists its devices");
                assert!(!inventory.is_empty());
                for d in &inventory {
                    assert!(d.min_limit_w <= d.max_limit_w, "{d:?}");
                    assert!(d.memory_total_mib > 0, "{d:?}");
                    eprintln!(
                        "GPU {}: {} ({}), limit {} W in [{}, {}] W",
                        d.index, d.name, d.model, d.limit_w, d.min_limit_w, d.max_limit_w
                    );
                }
            }
            Err(e) => assert!(e.to_string().contains("NVML is not available"), "{e}"),
        }
    }

    #[test]
    fn model_names() {
        let names = BTreeMap::from([("Tesla T4".to_string(), "T4".to_string())]);
        assert_eq!(model_of("NVIDIA H100 80GB HBM3", &names), "H100");
        assert_eq!(model_of("Tesla T4", &names), "T4");
    }
}
