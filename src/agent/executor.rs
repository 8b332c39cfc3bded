//! Executors run a site's jobs: [`LocalExecutor`] as child processes (the default) and
//! [`SlurmExecutor`] through `sbatch`, `squeue`, `scontrol` and `scancel`.
//!
//! Owns starting a job with its checkpoint environment, asking it to checkpoint, and reporting
//! its state from what survives an agent restart (files in the job's folder, the Slurm queue).
//! Must not decide when a job runs or moves (the agent does) and must not delete checkpoints.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// File a job writes in `WINDFALL_CHECKPOINT_DIR` once its checkpoint is complete.
pub const CHECKPOINT_MARKER: &str = ".windfall-checkpoint-complete";

/// An executor failure, naming the job.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// A system call or file operation failed.
    #[error("job {job}: {action}: {source}")]
    Io {
        /// The job.
        job: String,
        /// What was tried.
        action: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A Slurm command failed.
    #[error("job {job}: {command} failed: {message}")]
    Slurm {
        /// The job.
        job: String,
        /// The command.
        command: String,
        /// Its standard error.
        message: String,
    },
    /// The executor does not know the job.
    #[error("job {0} is not running here")]
    Unknown(String),
}

fn io(job: &str, action: impl Into<String>) -> impl FnOnce(std::io::Error) -> ExecError {
    let job = job.to_string();
    let action = action.into();
    move |source| ExecError::Io {
        job,
        action,
        source,
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// Job id.
    pub job: String,
    /// Shell command.
    pub command: String,
    /// GPU indices for `CUDA_VISIBLE_DEVICES`.
    pub gpus: Vec<u32>,
    /// The job's folder: `checkpoint/` and `resume/` live in it.
    pub dir: PathBuf,
    /// Checkpoint to resume from, if any.
    pub resume_from: Option<PathBuf>,
}

impl JobSpec {
    /// Where the job writes its checkpoint.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.dir.join("checkpoint")
    }
}

/// A job's state as the executor sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum JobStatus {
    /// Running (or queued by the batch system).
    Running,
    /// Ended with this exit code.
    Exited(i32),
    /// Gone without a trace (killed with the machine, cancelled outside the agent).
    Lost,
}

/// Runs jobs.
pub trait Executor: Send {
    /// Name for logs.
    fn name(&self) -> &'static str;
    /// Starts `spec` (fresh, or resuming from `spec.resume_from`).
    fn start(&mut self, spec: &JobSpec) -> Result<(), ExecError>;
    /// Asks the job to write a checkpoint (the configured signal).
    fn request_checkpoint(&mut self, job: &str, dir: &Path) -> Result<(), ExecError>;
    /// The job's state.
    fn status(&mut self, job: &str, dir: &Path) -> Result<JobStatus, ExecError>;
    /// Stops the job (after its checkpoint, or when it is cancelled).
    fn stop(&mut self, job: &str, dir: &Path) -> Result<(), ExecError>;
}

/// A signal by name (`USR1`, `SIGUSR2`, `TERM`, `INT`, `HUP`).
pub fn signal_number(name: &str) -> Option<i32> {
    match name.trim_start_matches("SIG") {
        "USR1" => Some(libc::SIGUSR1),
        "USR2" => Some(libc::SIGUSR2),
        "TERM" => Some(libc::SIGTERM),
        "INT" => Some(libc::SIGINT),
        "HUP" => Some(libc::SIGHUP),
        _ => None,
    }
}

/// Sends `signal` to process group `pgid`.
fn kill_group(pgid: i32, signal: i32) -> std::io::Result<()> {
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is shared.
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Child processes in their own process groups. Each job runs under `sh`, which writes the
/// command's exit code to `<dir>/exit_code`, so an agent restarted while jobs run can still
/// learn how they ended; the process group id is kept in `<dir>/pid`.
pub struct LocalExecutor {
    signal: i32,
    children: BTreeMap<String, Child>,
}

impl LocalExecutor {
    /// Checkpoint requests send `signal`.
    pub fn new(signal: i32) -> LocalExecutor {
        LocalExecutor {
            signal,
            children: BTreeMap::new(),
        }
    }

    fn pgid(job: &str, dir: &Path) -> Result<i32, ExecError> {
        let text = fs::read_to_string(dir.join("pid")).map_err(io(job, "reading its pid file"))?;
        text.trim()
            .parse()
            .map_err(|_| ExecError::Unknown(job.to_string()))
    }
}

impl Executor for LocalExecutor {
    fn name(&self) -> &'static str {
        "local"
    }

    fn start(&mut self, spec: &JobSpec) -> Result<(), ExecError> {
        let job = &spec.job;
        let checkpoint = spec.checkpoint_dir();
        fs::create_dir_all(&checkpoint).map_err(io(job, "creating its checkpoint folder"))?;
        let _ = fs::remove_file(spec.dir.join("exit_code"));
        // `trap : ...` gives the shell a handler, not an ignore, so the command itself still
        // sees the signals with their default action.
        let script = format!(
            "trap : USR1 USR2 HUP\n{}\necho $? > \"$WINDFALL_JOB_DIR/exit_code.tmp\" && mv \"$WINDFALL_JOB_DIR/exit_code.tmp\" \"$WINDFALL_JOB_DIR/exit_code\"\n",
            spec.command
        );
        let log = fs::File::create(spec.dir.join("output.log"))
            .map_err(io(job, "creating its output log"))?;
        let err_log = log.try_clone().map_err(io(job, "opening its output log"))?;
        let visible: Vec<String> = spec.gpus.iter().map(u32::to_string).collect();
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(script)
            .current_dir(&spec.dir)
            .env("WINDFALL_JOB_ID", job)
            .env("WINDFALL_JOB_DIR", &spec.dir)
            .env("WINDFALL_CHECKPOINT_DIR", &checkpoint)
            .env("CUDA_VISIBLE_DEVICES", visible.join(","))
            .env_remove("WINDFALL_RESUME_FROM")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log);
        if let Some(resume) = &spec.resume_from {
            command.env("WINDFALL_RESUME_FROM", resume);
        }
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().map_err(io(job, "starting `sh`"))?;
        fs::write(spec.dir.join("pid"), child.id().to_string())
            .map_err(io(job, "writing its pid file"))?;
        self.children.insert(job.clone(), child);
        Ok(())
    }

    fn request_checkpoint(&mut self, job: &str, dir: &Path) -> Result<(), ExecError> {
        let pgid = Self::pgid(job, dir)?;
        kill_group(pgid, self.signal).map_err(io(job, "sending the checkpoint signal"))
    }

    fn status(&mut self, job: &str, dir: &Path) -> Result<JobStatus, ExecError> {
        if let Some(child) = self.children.get_mut(job) {
            match child.try_wait().map_err(io(job, "checking the process"))? {
                None => return Ok(JobStatus::Running),
                Some(_) => {
                    self.children.remove(job);
                }
            }
        }
        if let Ok(text) = fs::read_to_string(dir.join("exit_code")) {
            return Ok(JobStatus::Exited(text.trim().parse().unwrap_or(-1)));
        }
        match Self::pgid(job, dir) {
            Ok(pid) if process_alive(pid) => Ok(JobStatus::Running),
            _ => Ok(JobStatus::Lost),
        }
    }

    fn stop(&mut self, job: &str, dir: &Path) -> Result<(), ExecError> {
        let pgid = Self::pgid(job, dir)?;
        if process_alive(pgid) {
            let _ = kill_group(pgid, libc::SIGTERM);
        }
        if let Some(mut child) = self.children.remove(job) {
            let _ = child.wait();
        }
        Ok(())
    }
}

/// Longest wait for a requeued job to be released from the start time Slurm gives it.
const REQUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);
/// How long a requeued job stays pending before its start time is moved to now. Slurm revokes
/// the credential of the run that ended, to the second; a rerun started within the same second
/// is killed as "non-startable" (Job credential revoked), which is why Slurm itself waits
/// about two minutes. (A start time moved 2 s into the future instead waited for the backfill
/// scheduler: the one-node test cluster started the job 16-23 s after the requeue; moving it
/// to now schedules the job at once.)
const REQUEUE_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);
/// A requeued job's start time further out than this is Slurm's, not the one it was given.
const REQUEUE_FAR_S: i64 = 10;

/// Slurm through its command-line tools. The batch script is the job's command; checkpoints are
/// asked for with `scancel --batch --signal` (a plain `--signal` reaches only job steps); a job
/// started again after a checkpoint is requeued (`scontrol requeue`) while Slurm still knows it,
/// and its script resumes from the job's `resume/` folder when that holds a checkpoint.
pub struct SlurmExecutor {
    signal: String,
    partition: Option<String>,
}

impl SlurmExecutor {
    /// Checkpoint requests send `signal` (a name such as `USR1`).
    pub fn new(signal: &str, partition: Option<String>) -> SlurmExecutor {
        SlurmExecutor {
            signal: signal.trim_start_matches("SIG").to_string(),
            partition,
        }
    }

    fn run(job: &str, program: &str, args: &[String]) -> Result<String, ExecError> {
        let out = Command::new(program)
            .args(args)
            .output()
            .map_err(io(job, format!("running `{program}`")))?;
        if !out.status.success() {
            return Err(ExecError::Slurm {
                job: job.to_string(),
                command: format!("{program} {}", args.join(" ")),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Releases a requeued job from the start time Slurm gives it (about two minutes out):
    /// waits, at most [`REQUEUE_WAIT`], until Slurm has listed the job as pending for
    /// [`REQUEUE_SETTLE`], moves its start time to now, and moves it again whenever Slurm sets a
    /// later one (a job that was still ending when it was requeued gets a new start time once
    /// it has ended), until the job runs, waits for something other than its start time, or
    /// the wait is over.
    fn release_requeued(job: &str, id: &str) -> Result<(), ExecError> {
        let started = std::time::Instant::now();
        let (mut pending_since, mut moved, mut last_error) = (None, false, None);
        while started.elapsed() < REQUEUE_WAIT {
            let listed = Self::run(
                job,
                "squeue",
                &[
                    "-h".into(),
                    "-j".into(),
                    id.into(),
                    "-o".into(),
                    "%T|%r|%S".into(),
                ],
            )
            .unwrap_or_default();
            let mut fields = listed.split('|');
            let (state, reason, start) = (
                fields.next().unwrap_or(""),
                fields.next().unwrap_or(""),
                fields.next().unwrap_or(""),
            );
            if state == "PENDING" {
                let since = *pending_since.get_or_insert_with(std::time::Instant::now);
                // squeue prints times in the caller's local time.
                let held_for_start =
                    chrono::NaiveDateTime::parse_from_str(start, "%Y-%m-%dT%H:%M:%S").is_ok_and(
                        |at| {
                            at > chrono::Local::now().naive_local()
                                + chrono::Duration::seconds(REQUEUE_FAR_S)
                        },
                    );
                if held_for_start && moved {
                    // Slurm set a new start time: the run may only just have ended.
                    pending_since = Some(std::time::Instant::now());
                    moved = false;
                } else if held_for_start && since.elapsed() >= REQUEUE_SETTLE {
                    match Self::run(
                        job,
                        "scontrol",
                        &[
                            "update".into(),
                            format!("JobId={id}"),
                            "StartTime=now".into(),
                        ],
                    ) {
                        Ok(_) => (moved, last_error) = (true, None),
                        Err(e) => last_error = Some(e),
                    }
                } else if !held_for_start && reason != "None" && reason != "BeginTime" {
                    // Waiting for resources or priority, like any other job.
                    return Ok(());
                }
            } else if pending_since.is_some() {
                // Running, ending or gone after it was pending: released.
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        match last_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn slurm_id(job: &str, dir: &Path) -> Result<String, ExecError> {
        fs::read_to_string(dir.join("slurm_job_id"))
            .map(|t| t.trim().to_string())
            .map_err(io(job, "reading its Slurm job id"))
    }
}

impl Executor for SlurmExecutor {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn start(&mut self, spec: &JobSpec) -> Result<(), ExecError> {
        let job = &spec.job;
        let checkpoint = spec.checkpoint_dir();
        fs::create_dir_all(&checkpoint).map_err(io(job, "creating its checkpoint folder"))?;
        let _ = fs::remove_file(spec.dir.join("exit_code"));
        // A job Slurm still knows is requeued (its stored script finds the checkpoint itself);
        // otherwise it is submitted afresh.
        if let Ok(id) = Self::slurm_id(job, &spec.dir)
            && Self::run(job, "scontrol", &["requeue".into(), id.clone()]).is_ok()
        {
            // A requeued job otherwise waits about two minutes (BeginTime).
            Self::release_requeued(job, &id)?;
            return Ok(());
        }
        let script_path = spec.dir.join("job.sh");
        let resume_dir = spec
            .resume_from
            .clone()
            .unwrap_or_else(|| spec.dir.join("resume"));
        let resume = format!(
            "unset WINDFALL_RESUME_FROM\nif [ -f '{r}/{CHECKPOINT_MARKER}' ] || [ -f '{r}/.windfall-received' ]; then export WINDFALL_RESUME_FROM='{r}'; fi\n",
            r = resume_dir.display()
        );
        let visible: Vec<String> = spec.gpus.iter().map(u32::to_string).collect();
        let script = format!(
            "#!/bin/sh\nexport WINDFALL_JOB_ID='{job}' WINDFALL_JOB_DIR='{dir}' WINDFALL_CHECKPOINT_DIR='{ckpt}' CUDA_VISIBLE_DEVICES='{gpus}'\n{resume}{command} &\nchild=$!\ntrap 'kill -{sig} $child 2>/dev/null' {sig}\nwhile :; do wait $child; code=$?; kill -0 $child 2>/dev/null || break; done\necho $code > \"$WINDFALL_JOB_DIR/exit_code.tmp\" && mv \"$WINDFALL_JOB_DIR/exit_code.tmp\" \"$WINDFALL_JOB_DIR/exit_code\"\n",
            dir = spec.dir.display(),
            ckpt = checkpoint.display(),
            gpus = visible.join(","),
            command = spec.command,
            sig = self.signal,
        );
        fs::write(&script_path, script).map_err(io(job, "writing its batch script"))?;
        let mut args = vec![
            "--parsable".to_string(),
            "--requeue".to_string(),
            format!("--job-name=windfall-{job}"),
            format!("--chdir={}", spec.dir.display()),
            format!("--output={}", spec.dir.join("output.log").display()),
            format!("--signal=B:{}@60", self.signal),
        ];
        if let Some(p) = &self.partition {
            args.push(format!("--partition={p}"));
        }
        args.push(script_path.display().to_string());
        let id = Self::run(job, "sbatch", &args)?;
        let id = id.split(';').next().unwrap_or(&id).to_string();
        fs::write(spec.dir.join("slurm_job_id"), &id).map_err(io(job, "writing its Slurm id"))?;
        Ok(())
    }

    fn request_checkpoint(&mut self, job: &str, dir: &Path) -> Result<(), ExecError> {
        let id = Self::slurm_id(job, dir)?;
        Self::run(
            job,
            "scancel",
            &["--batch".into(), format!("--signal={}", self.signal), id],
        )
        .map(|_| ())
    }

    fn status(&mut self, job: &str, dir: &Path) -> Result<JobStatus, ExecError> {
        if let Ok(text) = fs::read_to_string(dir.join("exit_code")) {
            return Ok(JobStatus::Exited(text.trim().parse().unwrap_or(-1)));
        }
        let id = Self::slurm_id(job, dir)?;
        let state = Self::run(
            job,
            "squeue",
            &["-h".into(), "-j".into(), id, "-o".into(), "%T".into()],
        )
        .unwrap_or_default();
        Ok(match state.as_str() {
            "PENDING" | "CONFIGURING" | "RUNNING" | "SUSPENDED" | "COMPLETING" | "REQUEUED"
            | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESIZING" | "SIGNALING" | "STAGE_OUT" => {
                JobStatus::Running
            }
            // Gone, cancelled, failed or killed without the script's exit code.
            _ => match fs::read_to_string(dir.join("exit_code")) {
                Ok(text) => JobStatus::Exited(text.trim().parse().unwrap_or(-1)),
                Err(_) => JobStatus::Lost,
            },
        })
    }

    fn stop(&mut self, job: &str, dir: &Path) -> Result<(), ExecError> {
        let id = Self::slurm_id(job, dir)?;
        Self::run(job, "scancel", &[id]).map(|_| ())
    }
}
