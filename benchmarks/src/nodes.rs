//! `torch_nodes_*` (in `bench collectives`): torch.distributed on a world spanning nodes, 2
//! nodes of 2 ranks on this machine (`SHMBROKER_NODE` per rank, loopback TCP between them), run
//! by `python/bench/torch_nodes.py`.
//!
//! | bench | ours | baselines |
//! |---|---|---|
//! | `torch_nodes_barrier`, `torch_nodes_all_reduce_{8,65536,1048576,16777216}` (f32 sum), `torch_nodes_all_gather_1024` | the shmbroker backend: shared memory in each node, gloo between | a flat gloo group of the same ranks; gloo's leader step alone (the first rank of each node, on what the call sends between nodes) |
//!
//! The script alternates the backends by round in the same processes, each call after a barrier
//! on its own backend. It runs under `SHMBROKER_BENCH_PYTHON` (default `python3`) and is left out,
//! saying so, when that Python cannot import torch and shmbroker.

use super::{Comparison, Measure, Plan, Report, Size};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The rows, by the script's key, in its order.
const ROWS: [&str; 6] = [
    "barrier",
    "all_reduce_8",
    "all_reduce_65536",
    "all_reduce_1048576",
    "all_reduce_16777216",
    "all_gather_1024",
];

/// The contenders, by the script's name for each, ours first.
const CONTENDERS: [(&str, &str); 3] = [
    (
        "shmbroker",
        "shmbroker backend: shared memory in a node, gloo between",
    ),
    ("gloo", "flat gloo group"),
    ("leaders", "gloo's leader step alone"),
];

/// Nodes and ranks per node.
const NODES: u32 = 2;
const PER_NODE: u32 = 2;

/// How long the script may run before it is killed.
const DEADLINE: Duration = Duration::from_secs(900);

/// Runs the `torch_nodes_*` rows.
///
/// # Errors
///
/// The script failing (its stderr says why) or printing no samples for a row.
pub fn run(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    if !ROWS
        .iter()
        .any(|row| plan.wants(&format!("torch_nodes_{row}")))
    {
        return Ok(());
    }
    let python = std::env::var_os("SHMBROKER_BENCH_PYTHON").unwrap_or_else(|| "python3".into());
    let importable = Command::new(&python)
        .args(["-c", "import torch, shmbroker.torch"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !importable {
        eprintln!(
            "bench: no torch_nodes rows ({} cannot import torch and shmbroker.torch; set \
             SHMBROKER_BENCH_PYTHON to a Python that can)",
            python.to_string_lossy()
        );
        return Ok(());
    }
    report.progress("torch_nodes");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/bench/torch_nodes.py");
    let budget = if plan.quick { "0.05" } else { "0.3" };
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .args([
            "--nodes",
            &NODES.to_string(),
            "--per-node",
            &PER_NODE.to_string(),
        ])
        .args([
            "--rounds",
            &plan.rounds.to_string(),
            "--budget",
            budget,
            "--samples",
            "1",
        ]);
    let stdout = super::mpi::output_within(&mut command, "torch_nodes.py", DEADLINE)?;
    // (row, contender) -> samples per round.
    let mut found: BTreeMap<(String, String), Vec<Vec<u64>>> = BTreeMap::new();
    for line in stdout.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let ["torch_nodes_sample", row, who, round, ns] = fields[..] {
            let (Ok(round), Ok(ns)) = (round.parse::<usize>(), ns.parse::<u64>()) else {
                continue;
            };
            let rounds = found.entry((row.to_owned(), who.to_owned())).or_default();
            if rounds.len() <= round {
                rounds.resize(round + 1, Vec::new());
            }
            rounds[round].push(ns);
        }
    }
    for row in ROWS {
        let bench = format!("torch_nodes_{row}");
        if !plan.wants(&bench) {
            continue;
        }
        let mut contenders = Vec::new();
        for (key, name) in CONTENDERS {
            let rounds = found
                .remove(&(row.to_owned(), key.to_owned()))
                .filter(|rounds| rounds.iter().any(|r| !r.is_empty()))
                .ok_or_else(|| format!("torch_nodes.py printed no samples of {key} for {row}"))?;
            contenders.push((name, Measure::Latency(rounds)));
        }
        report.add(Comparison {
            bench,
            size: Size::Workers(NODES * PER_NODE),
            contenders,
        });
    }
    report.note(
        "torch_nodes_barrier",
        "torch.distributed on 2 nodes of 2 ranks made on this machine with SHMBROKER_NODE, \
         loopback TCP between them: the shmbroker backend (shared memory in each node, gloo \
         between) against a flat gloo group of the same ranks, alternated by round in the same \
         processes, and gloo's leader step alone (what a node-aware call runs between nodes); \
         all_reduce rows are f32 sums of that many bytes, all_gather 1 KiB per rank",
    );
    Ok(())
}
