//! Where a worker stands when a launcher started it: local rank, local world size, and a socket
//! path no other job on the node shares.
//!
//! | launcher | local rank | local world size | job id |
//! |---|---|---|---|
//! | Open MPI | `OMPI_COMM_WORLD_LOCAL_RANK` | `OMPI_COMM_WORLD_LOCAL_SIZE` | `PMIX_NAMESPACE`, `OMPI_MCA_orte_ess_jobid`, else the parent pid |
//! | MPICH / Hydra | `MPI_LOCALRANKID` | `MPI_LOCALNRANKS` | `PMI_KVS_NAME`, `PMIX_NAMESPACE`, else the parent pid |
//! | torchrun | `LOCAL_RANK` | `LOCAL_WORLD_SIZE` | `TORCHELASTIC_RUN_ID` and `TORCHELASTIC_RESTART_COUNT` |
//! | Slurm (`srun`) | `SLURM_LOCALID` | this node's entry of `SLURM_TASKS_PER_NODE` (at `SLURM_NODEID`) | `SLURM_JOB_ID` and `SLURM_STEP_ID` |
//!
//! `SHMBROKER_BROKER=external` says a broker already listens on the socket (`shmbroker run`
//! starts one), so local rank 0 does not host one; `embedded`, or no value, says it does.
//!
//! `SHMBROKER_RANK`, `SHMBROKER_WORLD_SIZE` and `SHMBROKER_SOCKET` override all of them. Under
//! MPI launchers every local rank is a child of the same local launcher process, so the parent
//! pid is a job id that two jobs on one node never share. torchrun's default run id, `none`,
//! names no job, so the port of the job's store (`MASTER_PORT`), or else the parent pid
//! (torchrun's agent), is added to it.
//!
//! A launcher's socket lies in a directory private to this user, `shmbroker-<uid>` under
//! `$XDG_RUNTIME_DIR` (or the temp dir), made with mode 0700 and checked before use
//! ([`Launch::private_dir`]): another user can neither take the path first nor put a file
//! there, and jobs of two users with the same job id never meet.

use std::path::PathBuf;

/// What the environment says about this worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank among the workers on this node.
    pub rank: u32,
    /// How many workers run on this node.
    pub world_size: u32,
    /// The broker socket for this job on this node.
    pub socket: PathBuf,
    /// Which variables said so, for messages.
    pub source: String,
    /// Whether a broker already listens on [`Self::socket`] (`SHMBROKER_BROKER=external`), so
    /// that rank 0 must not start one.
    pub external_broker: bool,
    /// The directory [`Self::socket`] lies in when the launcher's job id named it: it must be
    /// private to this user, and is made so if missing
    /// ([`private_dir`](shmbroker_handshake::private_dir)). `None` for a path given by
    /// `SHMBROKER_SOCKET`.
    pub private_dir: Option<PathBuf>,
}

/// The variable that says whether local rank 0 hosts the broker (`embedded`, the default) or one
/// already listens on the socket (`external`).
pub const BROKER_VAR: &str = "SHMBROKER_BROKER";

struct Launcher {
    name: &'static str,
    rank: &'static str,
    size: &'static str,
    job_ids: &'static [&'static str],
}

const LAUNCHERS: [Launcher; 3] = [
    Launcher {
        name: "openmpi",
        rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        size: "OMPI_COMM_WORLD_LOCAL_SIZE",
        job_ids: &[
            "PMIX_NAMESPACE",
            "OMPI_MCA_orte_ess_jobid",
            "OMPI_MCA_ess_base_jobid",
        ],
    },
    Launcher {
        name: "mpich",
        rank: "MPI_LOCALRANKID",
        size: "MPI_LOCALNRANKS",
        job_ids: &["PMI_KVS_NAME", "PMIX_NAMESPACE"],
    },
    Launcher {
        name: "torchrun",
        rank: "LOCAL_RANK",
        size: "LOCAL_WORLD_SIZE",
        job_ids: &["TORCHELASTIC_RUN_ID"],
    },
];

/// Parses a count from variable `name`.
fn number(name: &str, value: &str) -> Result<u32, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("{name}={value:?} is not a number"))
}

/// This node's task count from a Slurm task list such as `4(x2),3` (node 0 and 1 run 4, node 2
/// runs 3).
fn slurm_tasks_on_node(list: &str, node: usize) -> Option<u32> {
    let mut counts = Vec::new();
    for part in list.split(',') {
        let (count, repeat) = match part.split_once("(x") {
            Some((count, repeat)) => (count, repeat.trim_end_matches(')').parse::<usize>().ok()?),
            None => (part, 1),
        };
        let count: u32 = count.trim().parse().ok()?;
        counts.extend(std::iter::repeat_n(count, repeat));
    }
    counts.get(node).copied()
}

/// Keeps a job id to characters that are safe in a file name.
fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// Reads the launch environment through `var` for a process whose parent is `parent_pid` and
/// whose effective uid is `uid` (for tests; [`from_env`] uses the real ones).
///
/// # Errors
///
/// A message naming the variables when none says where this worker stands, when one of a pair
/// is missing or not a number, when a rank is not below its world size, or when two launchers
/// disagree.
pub fn detect(
    var: &dyn Fn(&str) -> Option<String>,
    parent_pid: u32,
    uid: u32,
) -> Result<Launch, String> {
    // (rank, size, job, source) from every launcher whose variables are present.
    let mut found: Vec<(u32, u32, String, String)> = Vec::new();
    for launcher in &LAUNCHERS {
        match (var(launcher.rank), var(launcher.size)) {
            (None, None) => {}
            (Some(_), None) => {
                return Err(format!(
                    "{} is set but {} is not",
                    launcher.rank, launcher.size
                ));
            }
            (None, Some(_)) => {
                return Err(format!(
                    "{} is set but {} is not",
                    launcher.size, launcher.rank
                ));
            }
            (Some(rank), Some(size)) => {
                let job = launcher
                    .job_ids
                    .iter()
                    .find_map(|name| var(name))
                    .unwrap_or_else(|| format!("ppid{parent_pid}"));
                let job = match (launcher.name, var("MASTER_PORT")) {
                    // torchrun's default `--rdzv-id`: every job has it. The port of the job's
                    // store tells two jobs on one node apart (both cannot listen on it), and
                    // every worker of a job has it, however it was started; else the agent's
                    // pid, the workers' parent.
                    ("torchrun", Some(port)) if job == "none" => format!("none-port{port}"),
                    ("torchrun", None) if job == "none" => format!("none-ppid{parent_pid}"),
                    _ => job,
                };
                let job = match (launcher.name, var("TORCHELASTIC_RESTART_COUNT")) {
                    ("torchrun", Some(restart)) => format!("{job}-r{restart}"),
                    _ => job,
                };
                found.push((
                    number(launcher.rank, &rank)?,
                    number(launcher.size, &size)?,
                    format!("{}-{}", launcher.name, sanitize(&job)),
                    format!("{}/{}", launcher.rank, launcher.size),
                ));
            }
        }
    }
    if let Some(rank) = var("SLURM_LOCALID") {
        let list = var("SLURM_STEP_TASKS_PER_NODE")
            .or_else(|| var("SLURM_TASKS_PER_NODE"))
            .ok_or("SLURM_LOCALID is set but SLURM_TASKS_PER_NODE is not")?;
        let node = var("SLURM_NODEID").map_or(Ok(0), |n| number("SLURM_NODEID", &n))? as usize;
        let size = slurm_tasks_on_node(&list, node).ok_or_else(|| {
            format!("SLURM_TASKS_PER_NODE={list:?} has no entry for SLURM_NODEID {node}")
        })?;
        let job = var("SLURM_JOB_ID").ok_or("SLURM_LOCALID is set but SLURM_JOB_ID is not")?;
        let step = var("SLURM_STEP_ID").unwrap_or_else(|| "0".into());
        found.push((
            number("SLURM_LOCALID", &rank)?,
            size,
            format!("slurm-{}.{}", sanitize(&job), sanitize(&step)),
            "SLURM_LOCALID/SLURM_TASKS_PER_NODE".into(),
        ));
    }
    let rank_override = var("SHMBROKER_RANK")
        .map(|v| number("SHMBROKER_RANK", &v))
        .transpose()?;
    let size_override = var("SHMBROKER_WORLD_SIZE")
        .map(|v| number("SHMBROKER_WORLD_SIZE", &v))
        .transpose()?;
    if found.len() > 1 && (rank_override.is_none() || size_override.is_none()) {
        let first = &found[0];
        if let Some(other) = found.iter().find(|f| (f.0, f.1) != (first.0, first.1)) {
            return Err(format!(
                "launchers disagree: {} says rank {} of {}, {} says rank {} of {}; set \
                 SHMBROKER_RANK and SHMBROKER_WORLD_SIZE to choose",
                first.3, first.0, first.1, other.3, other.0, other.1
            ));
        }
    }
    let launcher = found.first();
    let rank = rank_override.or(launcher.map(|f| f.0)).ok_or(
        "no launcher says where this worker stands: set SHMBROKER_RANK and SHMBROKER_WORLD_SIZE, \
         or start it under mpirun, torchrun or srun",
    )?;
    let world_size = size_override
        .or(launcher.map(|f| f.1))
        .ok_or("SHMBROKER_RANK is set but SHMBROKER_WORLD_SIZE is not")?;
    if rank >= world_size {
        return Err(format!(
            "rank {rank} is not below the local world size {world_size}"
        ));
    }
    let (socket, private_dir) = match var("SHMBROKER_SOCKET") {
        Some(socket) => (PathBuf::from(socket), None),
        None => {
            let job = launcher.map(|f| f.2.clone()).ok_or(
                "SHMBROKER_RANK and SHMBROKER_WORLD_SIZE need SHMBROKER_SOCKET when no launcher \
                 names the job",
            )?;
            // A value that is not an absolute path (empty, say) names no directory.
            let base = var("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .filter(|dir| dir.is_absolute())
                .unwrap_or_else(std::env::temp_dir);
            let dir = base.join(format!("shmbroker-{uid}"));
            (dir.join(format!("{job}.sock")), Some(dir))
        }
    };
    let source = match (rank_override, launcher) {
        (Some(_), _) | (None, None) => "SHMBROKER_RANK/SHMBROKER_WORLD_SIZE".into(),
        (None, Some(f)) => f.3.clone(),
    };
    let external_broker = match var(BROKER_VAR).as_deref().map(str::trim) {
        None | Some("" | "embedded") => false,
        Some("external") => true,
        Some(other) => {
            return Err(format!(
                "{BROKER_VAR}={other:?} is neither \"embedded\" nor \"external\""
            ));
        }
    };
    Ok(Launch {
        rank,
        world_size,
        socket,
        source,
        external_broker,
        private_dir,
    })
}

/// [`detect`] on this process's environment.
///
/// # Errors
///
/// As for [`detect`].
pub fn from_env() -> Result<Launch, String> {
    detect(
        &|name| std::env::var(name).ok(),
        std::os::unix::process::parent_id(),
        nix::unistd::geteuid().as_raw(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<Launch, String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        detect(&|name| map.get(name).cloned(), 4242, 1000)
    }

    #[test]
    fn each_launcher_is_understood() {
        let launch = with(&[
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("XDG_RUNTIME_DIR", "/run/user/7"),
        ])
        .unwrap();
        assert_eq!((launch.rank, launch.world_size), (2, 4));
        assert_eq!(
            launch.socket,
            PathBuf::from("/run/user/7/shmbroker-1000/openmpi-ppid4242.sock")
        );
        assert_eq!(
            launch.private_dir,
            Some(PathBuf::from("/run/user/7/shmbroker-1000"))
        );

        let launch = with(&[
            ("MPI_LOCALRANKID", "0"),
            ("MPI_LOCALNRANKS", "2"),
            ("PMI_KVS_NAME", "kvs_9"),
        ])
        .unwrap();
        assert!(
            launch.socket.ends_with("shmbroker-1000/mpich-kvs_9.sock"),
            "{launch:?}"
        );

        let launch = with(&[
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("TORCHELASTIC_RUN_ID", "job/7"),
            ("TORCHELASTIC_RESTART_COUNT", "1"),
        ])
        .unwrap();
        assert_eq!((launch.rank, launch.world_size), (1, 8));
        assert!(
            launch
                .socket
                .ends_with("shmbroker-1000/torchrun-job_7-r1.sock"),
            "{launch:?}"
        );

        let launch = with(&[
            ("SLURM_LOCALID", "2"),
            ("SLURM_TASKS_PER_NODE", "4(x2),3"),
            ("SLURM_NODEID", "2"),
            ("SLURM_JOB_ID", "123"),
            ("SLURM_STEP_ID", "4"),
        ])
        .unwrap();
        assert_eq!((launch.rank, launch.world_size), (2, 3));
        assert!(
            launch.socket.ends_with("shmbroker-1000/slurm-123.4.sock"),
            "{launch:?}"
        );
    }

    #[test]
    fn overrides_win_and_choose_between_launchers() {
        let launch = with(&[
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_TASKS_PER_NODE", "1"),
            ("SLURM_JOB_ID", "5"),
            ("SHMBROKER_RANK", "1"),
            ("SHMBROKER_WORLD_SIZE", "2"),
            ("SHMBROKER_SOCKET", "/tmp/mine.sock"),
        ])
        .unwrap();
        assert_eq!((launch.rank, launch.world_size), (1, 2));
        assert_eq!(launch.socket, PathBuf::from("/tmp/mine.sock"));
        assert_eq!(launch.private_dir, None);
    }

    #[test]
    fn missing_or_contradicting_variables_are_named() {
        let error = with(&[]).unwrap_err();
        assert!(
            error.contains("SHMBROKER_RANK") && error.contains("mpirun"),
            "{error}"
        );
        let error = with(&[("LOCAL_RANK", "0")]).unwrap_err();
        assert!(
            error.contains("LOCAL_RANK is set but LOCAL_WORLD_SIZE is not"),
            "{error}"
        );
        let error = with(&[
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_TASKS_PER_NODE", "1"),
            ("SLURM_JOB_ID", "5"),
        ])
        .unwrap_err();
        assert!(
            error.contains("LOCAL_RANK/LOCAL_WORLD_SIZE says rank 1 of 2"),
            "{error}"
        );
        assert!(
            error.contains("SLURM_LOCALID/SLURM_TASKS_PER_NODE says rank 0 of 1"),
            "{error}"
        );
        let error = with(&[("LOCAL_RANK", "3"), ("LOCAL_WORLD_SIZE", "2")]).unwrap_err();
        assert!(
            error.contains("rank 3 is not below the local world size 2"),
            "{error}"
        );
        let error = with(&[("LOCAL_RANK", "x"), ("LOCAL_WORLD_SIZE", "2")]).unwrap_err();
        assert!(
            error.contains("LOCAL_RANK=\"x\" is not a number"),
            "{error}"
        );
        let error = with(&[("SHMBROKER_RANK", "0"), ("SHMBROKER_WORLD_SIZE", "1")]).unwrap_err();
        assert!(error.contains("need SHMBROKER_SOCKET"), "{error}");
    }

    #[test]
    fn torchruns_default_run_id_is_told_apart_by_the_agent() {
        let launch = with(&[
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("TORCHELASTIC_RUN_ID", "none"),
            ("TORCHELASTIC_RESTART_COUNT", "0"),
        ])
        .unwrap();
        assert!(
            launch
                .socket
                .ends_with("shmbroker-1000/torchrun-none-ppid4242-r0.sock"),
            "{launch:?}"
        );
        let launch = with(&[
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("TORCHELASTIC_RUN_ID", "none"),
            ("MASTER_PORT", "29500"),
            ("XDG_RUNTIME_DIR", ""),
        ])
        .unwrap();
        assert!(
            launch
                .socket
                .ends_with("shmbroker-1000/torchrun-none-port29500.sock"),
            "{launch:?}"
        );
        assert!(launch.socket.is_absolute(), "{launch:?}");
    }

    #[test]
    fn slurm_task_lists_expand() {
        assert_eq!(slurm_tasks_on_node("4(x2),3", 0), Some(4));
        assert_eq!(slurm_tasks_on_node("4(x2),3", 1), Some(4));
        assert_eq!(slurm_tasks_on_node("4(x2),3", 2), Some(3));
        assert_eq!(slurm_tasks_on_node("4(x2),3", 3), None);
        assert_eq!(slurm_tasks_on_node("bad", 0), None);
    }

    #[test]
    fn a_broker_already_running_is_said_by_shmbroker_broker() {
        let base = [
            ("SHMBROKER_RANK", "0"),
            ("SHMBROKER_WORLD_SIZE", "2"),
            ("SHMBROKER_SOCKET", "/tmp/x.sock"),
        ];
        assert!(!with(&base).unwrap().external_broker);
        for (value, external) in [("embedded", false), ("external", true)] {
            let mut vars = base.to_vec();
            vars.push(("SHMBROKER_BROKER", value));
            assert_eq!(with(&vars).unwrap().external_broker, external);
        }
        let mut vars = base.to_vec();
        vars.push(("SHMBROKER_BROKER", "elsewhere"));
        let error = with(&vars).unwrap_err();
        assert!(
            error.contains("SHMBROKER_BROKER") && error.contains("elsewhere"),
            "{error}"
        );
    }
}
