//! `windfall-workload`: a small checkpointing job for tests and demos.
//!
//! It does deterministic work in steps (a SHA-256 chain folded into a state buffer), and on the
//! checkpoint signal (SIGUSR1, or SIGTERM) finishes its current step, writes its state to
//! `$WINDFALL_CHECKPOINT_DIR`, marks the checkpoint complete and exits 0. Started with
//! `$WINDFALL_RESUME_FROM` it continues from that state, so a run that was checkpointed and
//! resumed any number of times, anywhere, ends with the same result as an uninterrupted one.
//!
//! ```text
//! windfall-workload --steps 200 --step-ms 50 --state-kib 512 --out result.txt [--log runs.log]
//! ```
//! The result file holds the final digest; the log gets one line per run: `from TO reason`.
//! Every 10 steps it writes `step/steps` to `$WINDFALL_JOB_DIR/progress` when that is set.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// Written last into the checkpoint folder: the agent's sign that the checkpoint is complete.
const MARKER: &str = ".windfall-checkpoint-complete";

static CHECKPOINT_ASKED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    CHECKPOINT_ASKED.store(true, Ordering::SeqCst);
}

struct Args {
    steps: u64,
    step_ms: u64,
    state_kib: usize,
    out: PathBuf,
    log: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut steps = None;
    let mut step_ms = 100;
    let mut state_kib = 256;
    let mut out = None;
    let mut log = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: `{v}` is not a whole number"))
        };
        match flag.as_str() {
            "--steps" => steps = Some(number(&value)?),
            "--step-ms" => step_ms = number(&value)?,
            "--state-kib" => state_kib = number(&value)? as usize,
            "--out" => out = Some(PathBuf::from(value)),
            "--log" => log = Some(PathBuf::from(value)),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Args {
        steps: steps.ok_or("--steps is required")?,
        step_ms,
        state_kib: state_kib.max(1),
        out: out.ok_or("--out is required")?,
        log,
    })
}

/// Step counter, chain digest and state buffer.
struct State {
    step: u64,
    digest: [u8; 32],
    buffer: Vec<u8>,
}

impl State {
    fn new(kib: usize) -> State {
        let buffer = (0..kib * 1024).map(|i| (i % 251) as u8).collect();
        State {
            step: 0,
            digest: [0; 32],
            buffer,
        }
    }

    fn advance(&mut self) {
        let mut h = Sha256::new();
        h.update(self.digest);
        h.update(self.step.to_le_bytes());
        self.digest = h.finalize().into();
        let blocks = self.buffer.len() / 32;
        let at = (self.step as usize % blocks) * 32;
        for (b, d) in self.buffer[at..at + 32].iter_mut().zip(self.digest) {
            *b ^= d;
        }
        self.step += 1;
    }

    fn result(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.digest);
        h.update(&self.buffer);
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    fn save(&self, dir: &Path) -> std::io::Result<()> {
        fs::create_dir_all(dir)?;
        let _ = fs::remove_file(dir.join(MARKER));
        let mut bytes = Vec::with_capacity(40 + self.buffer.len());
        bytes.extend(self.step.to_le_bytes());
        bytes.extend(self.digest);
        bytes.extend(&self.buffer);
        let tmp = dir.join("state.bin.tmp");
        let mut file = fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, dir.join("state.bin"))?;
        fs::write(dir.join(MARKER), self.step.to_string())
    }

    fn load(dir: &Path, kib: usize) -> Result<State, String> {
        let path = dir.join("state.bin");
        let bytes = fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        if bytes.len() != 40 + kib * 1024 {
            return Err(format!(
                "{} has {} bytes, expected {} for --state-kib {kib}",
                path.display(),
                bytes.len(),
                40 + kib * 1024
            ));
        }
        Ok(State {
            step: u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
            digest: bytes[8..40].try_into().expect("32 bytes"),
            buffer: bytes[40..].to_vec(),
        })
    }
}

fn log_run(log: &Option<PathBuf>, from: u64, to: u64, reason: &str) {
    if let Some(path) = log
        && let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path)
    {
        let _ = writeln!(f, "{from} {to} {reason}");
    }
}

/// Writes `step/steps` to `$WINDFALL_JOB_DIR/progress`, which the agent reports.
fn report_progress(step: u64, steps: u64) {
    if let Some(dir) = std::env::var_os("WINDFALL_JOB_DIR") {
        let dir = Path::new(&dir);
        let tmp = dir.join("progress.tmp");
        if fs::write(&tmp, format!("{step}/{steps}")).is_ok() {
            let _ = fs::rename(tmp, dir.join("progress"));
        }
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("windfall-workload: {e}");
            }
            eprintln!(
                "usage: windfall-workload --steps N [--step-ms MS] [--state-kib KIB] --out FILE [--log FILE]"
            );
            return ExitCode::from(2);
        }
    };
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGUSR1, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let mut state = match std::env::var_os("WINDFALL_RESUME_FROM") {
        Some(dir) => match State::load(Path::new(&dir), args.state_kib) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("windfall-workload: cannot resume: {e}");
                return ExitCode::from(1);
            }
        },
        None => State::new(args.state_kib),
    };
    let started_at = state.step;
    println!("windfall-workload: step {started_at} of {}", args.steps);
    while state.step < args.steps {
        if CHECKPOINT_ASKED.load(Ordering::SeqCst) {
            let Some(dir) = std::env::var_os("WINDFALL_CHECKPOINT_DIR") else {
                eprintln!(
                    "windfall-workload: asked to checkpoint but WINDFALL_CHECKPOINT_DIR is not set"
                );
                return ExitCode::from(1);
            };
            if let Err(e) = state.save(Path::new(&dir)) {
                eprintln!("windfall-workload: writing the checkpoint: {e}");
                return ExitCode::from(1);
            }
            log_run(&args.log, started_at, state.step, "checkpoint");
            println!("windfall-workload: checkpoint at step {}", state.step);
            return ExitCode::SUCCESS;
        }
        state.advance();
        if state.step % 10 == 0 {
            report_progress(state.step, args.steps);
        }
        std::thread::sleep(Duration::from_millis(args.step_ms));
    }
    if let Err(e) = fs::write(&args.out, state.result()) {
        eprintln!("windfall-workload: writing {}: {e}", args.out.display());
        return ExitCode::from(1);
    }
    log_run(&args.log, started_at, state.step, "done");
    println!("windfall-workload: done after step {}", state.step);
    ExitCode::SUCCESS
}
