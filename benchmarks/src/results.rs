//! The results folder of `bench`: JSON lines, a Markdown table and SVG plots.

use super::{Comparison, Measure, Size, Summary, json_line, size_text, summarize};
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

/// How the run was made, for the head of `results.md`.
#[derive(Debug)]
pub struct RunInfo {
    /// [`source_commit`], taken when the run started.
    pub commit: String,
    pub quick: bool,
    pub rounds: usize,
    pub only: Option<String>,
}

impl RunInfo {
    /// Commit, date, machine and options, as the lines that open `results.md`.
    fn header(&self) -> String {
        let mut options = format!("--rounds {}", self.rounds);
        if self.quick {
            options.push_str(", --quick (a smoke run: fewer samples and sizes)");
        }
        if let Some(only) = &self.only {
            let _ = write!(options, ", --only {only}");
        }
        format!(
            "- commit: {}\n- date: {}\n- machine: {}\n- run: {options}\n",
            self.commit,
            shmbroker_cli::logging::rfc3339(std::time::SystemTime::now()),
            machine()
        )
    }
}

/// The commit of the source tree this binary was built from, marked `(modified)` when that tree
/// has changes; `unknown` when it is not a git checkout (or git is missing). Taken before the run
/// writes anything, so that results written into the checkout do not mark it modified.
pub fn source_commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        None => "unknown".into(),
        Some(commit) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if !changes.is_empty() => format!("{commit} (modified)"),
            _ => commit,
        },
    }
}

/// Writes every output into `dir` (created if needed); returns the paths written.
pub fn write(
    dir: &Path,
    run: &RunInfo,
    comparisons: &[Comparison],
    notes: &[String],
) -> Result<Vec<String>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let mut save = |name: &str, contents: String| -> Result<(), String> {
        let path = dir.join(name);
        std::fs::write(&path, contents).map_err(|e| format!("writing {}: {e}", path.display()))?;
        written.push(path.display().to_string());
        Ok(())
    };
    save("results.jsonl", jsonl(comparisons))?;
    save("results.md", markdown(run, comparisons, notes))?;
    for (name, plot) in [
        ("pingpong_cdf.svg", pingpong_cdf as Plot),
        ("barrier_vs_workers.svg", barrier_vs_workers),
        ("throughput_vs_size.svg", throughput_vs_size),
        ("bulk_throughput_vs_size.svg", bulk_throughput_vs_size),
        ("all_reduce_vs_size.svg", all_reduce_vs_size),
    ] {
        let path = dir.join(name);
        if plot(&path, comparisons)? {
            written.push(path.display().to_string());
        }
    }
    Ok(written)
}

/// Draws one plot into a path; `false` when the suites it needs were not run.
type Plot = fn(&Path, &[Comparison]) -> Result<bool, String>;

fn jsonl(comparisons: &[Comparison]) -> String {
    let mut out = String::new();
    for comparison in comparisons {
        for row in comparison.rows() {
            out.push_str(&json_line(comparison, &row));
            out.push('\n');
        }
    }
    out
}

/// The machine, in one line: CPU model, cores, kernel.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|model| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    // Online CPUs, not this process's affinity (measurements pin it for a while).
    // SAFETY: sysconf only reads a system value.
    let cores = unsafe { nix::libc::sysconf(nix::libc::_SC_NPROCESSORS_ONLN) };
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|release| release.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    format!("{cpu}, {cores} cores, Linux {kernel}")
}

fn markdown(run: &RunInfo, comparisons: &[Comparison], notes: &[String]) -> String {
    let mut out = run.header();
    out.push_str(
        "\np50 and p99 pool every round; the spread is the lowest and highest p50 (or rate) of \
         a single round.\n\n",
    );
    out.push_str(
        "| bench | size | impl | p50 | p99 | per second | spread over rounds | ours/baseline |\n",
    );
    out.push_str("|---|---:|---|---:|---:|---:|---:|---|\n");
    for comparison in comparisons {
        for row in comparison.rows() {
            let spread = row.summary.spread_text(comparison.size);
            let [p50, p99, rate, ratio] = row.summary.cells(comparison.size, row.ratio);
            let name = row.name;
            let _ = writeln!(
                out,
                "| {} | {} | {name} | {p50} | {p99} | {rate} | {spread} | {ratio} |",
                comparison.bench,
                size_text(comparison.size)
            );
        }
    }
    out.push_str(
        "\nours/baseline: below 1 means ours is faster (latency); above 1 means ours moves more (throughput).\n",
    );
    for note in notes {
        let _ = writeln!(out, "\n{note}");
    }
    out
}

const COLORS: [RGBColor; 6] = [
    RGBColor(200, 30, 30),
    RGBColor(30, 90, 200),
    RGBColor(30, 150, 60),
    RGBColor(150, 60, 170),
    RGBColor(220, 130, 0),
    RGBColor(90, 90, 90),
];

fn plot_error(error: impl std::fmt::Display) -> String {
    format!("plotting: {error}")
}

/// Draws each named series as a line (with a marker at every point when `markers`), in its own
/// color, and the legend.
fn draw_series<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    series: Vec<(String, Vec<(f64, f64)>)>,
    markers: bool,
    legend_at: SeriesLabelPosition,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (index, (name, points)) in series.into_iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        if markers {
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(plot_error)?;
        }
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(plot_error)?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(legend_at)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

/// Latency CDF of the hot ping-pong: ours against every baseline.
fn pingpong_cdf(path: &Path, comparisons: &[Comparison]) -> Result<bool, String> {
    let Some(comparison) = comparisons.iter().find(|c| c.bench == "pingpong_hot") else {
        return Ok(false);
    };
    let mut curves = Vec::new();
    let mut x_max = 1.0f64;
    for (name, measure) in &comparison.contenders {
        if let Measure::Latency(rounds) = measure {
            let mut sorted = rounds.concat();
            sorted.sort_unstable();
            if sorted.is_empty() {
                continue;
            }
            let n = sorted.len();
            let step = (n / 400).max(1);
            let points: Vec<(f64, f64)> = (0..n)
                .step_by(step)
                .map(|i| (sorted[i] as f64, (i + 1) as f64 / n as f64))
                .take_while(|&(x, _)| x <= sorted[(n * 99 / 100).min(n - 1)] as f64 * 1.25)
                .collect();
            // Up to the largest p99: a single outlier's tail would squash every curve.
            x_max = x_max.max(sorted[(n * 99 / 100).min(n - 1)] as f64 * 1.25);
            curves.push((name.to_string(), points));
        }
    }
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Hot ping-pong round trip, cumulative distribution",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max * 1.05, 0f64..1f64)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("round trip (ns)")
        .y_desc("fraction of round trips")
        .draw()
        .map_err(plot_error)?;
    draw_series(&mut chart, curves, false, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(plot_error)?;
    Ok(true)
}

/// Barrier p50 against the number of workers, ours against Open MPI (the `barrier` bench), or
/// parked against each baseline when that bench did not run.
fn barrier_vs_workers(path: &Path, comparisons: &[Comparison]) -> Result<bool, String> {
    let bench = if comparisons.iter().any(|c| c.bench == "barrier") {
        "barrier"
    } else {
        "barrier_parked"
    };
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut most_workers = 8u32;
    for comparison in comparisons.iter().filter(|c| c.bench == bench) {
        let Size::Workers(workers) = comparison.size else {
            continue;
        };
        most_workers = most_workers.max(workers);
        for (name, measure) in &comparison.contenders {
            if let Summary::Latency { p50, .. } = summarize(measure) {
                let point = (f64::from(workers), p50 as f64 / 1e3);
                match series.iter_mut().find(|(n, _)| n == name) {
                    Some((_, points)) => points.push(point),
                    None => series.push((name.to_string(), vec![point])),
                }
            }
        }
    }
    if series.is_empty() {
        return Ok(false);
    }
    let y_max = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.1))
        .fold(1.0f64, f64::max);
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            if bench == "barrier" {
                "Barrier latency (p50) against world size, oversubscribed past the CPUs"
            } else {
                "Barrier latency (p50, parked) against world size"
            },
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..f64::from(most_workers + 1), 0f64..y_max * 1.1)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("workers (processes)")
        .y_desc("barrier p50 (µs)")
        .draw()
        .map_err(plot_error)?;
    draw_series(&mut chart, series, true, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(plot_error)?;
    Ok(true)
}

/// Streaming throughput (MB/s) against message size, single and batched, ours and shaq.
fn throughput_vs_size(path: &Path, comparisons: &[Comparison]) -> Result<bool, String> {
    throughput_plot(
        path,
        comparisons,
        &["stream_single", "stream_batched"],
        "Streaming throughput against message size",
        4.0..8192.0,
    )
}

fn bulk_throughput_vs_size(path: &Path, comparisons: &[Comparison]) -> Result<bool, String> {
    throughput_plot(
        path,
        comparisons,
        &["bulk_throughput"],
        "Large-message throughput against size, one way between two processes",
        2048.0..(128u64 << 20) as f64,
    )
}

/// Throughput (MB/s, median over rounds) against message size for the benches named, one line
/// per contender (and bench, when there are several).
fn throughput_plot(
    path: &Path,
    comparisons: &[Comparison],
    benches: &[&str],
    title: &str,
    sizes: std::ops::Range<f64>,
) -> Result<bool, String> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for comparison in comparisons
        .iter()
        .filter(|c| benches.contains(&c.bench.as_str()))
    {
        let Size::Bytes(bytes) = comparison.size else {
            continue;
        };
        for (name, measure) in &comparison.contenders {
            if let Summary::Throughput { median, .. } = summarize(measure) {
                let label = if benches.len() > 1 {
                    let kind = comparison.bench.rsplit('_').next().unwrap_or_default();
                    format!("{name}, {kind}")
                } else {
                    (*name).to_owned()
                };
                let point = (bytes as f64, median * bytes as f64 / 1e6);
                match series.iter_mut().find(|(n, _)| *n == label) {
                    Some((_, points)) => points.push(point),
                    None => series.push((label, vec![point])),
                }
            }
        }
    }
    if series.is_empty() {
        return Ok(false);
    }
    let y_max = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.1))
        .fold(10.0f64, f64::max);
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(sizes.log_scale(), (1f64..y_max * 2.0).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("MB/s (median over rounds)")
        .draw()
        .map_err(plot_error)?;
    draw_series(&mut chart, series, true, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(plot_error)?;
    Ok(true)
}

/// All-reduce latency (p50, µs) against size, log-log: one line per contender and world size.
fn all_reduce_vs_size(path: &Path, comparisons: &[Comparison]) -> Result<bool, String> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for comparison in comparisons.iter().filter(|c| c.bench == "all_reduce") {
        let Size::Tasks { workers, bytes } = comparison.size else {
            continue;
        };
        for (name, measure) in &comparison.contenders {
            if let Summary::Latency { p50, .. } = summarize(measure) {
                let label = format!("{name}, {workers} ranks");
                let point = (bytes as f64, (p50 as f64 / 1e3).max(0.01));
                match series.iter_mut().find(|(n, _)| *n == label) {
                    Some((_, points)) => points.push(point),
                    None => series.push((label, vec![point])),
                }
            }
        }
    }
    if series.is_empty() {
        return Ok(false);
    }
    let fold = |pick: fn(&(f64, f64)) -> f64, start: f64, f: fn(f64, f64) -> f64| {
        series
            .iter()
            .flat_map(|(_, points)| points.iter().map(pick))
            .fold(start, f)
    };
    let (x_max, y_min, y_max) = (
        fold(|p| p.0, 8.0, f64::max),
        fold(|p| p.1, 1.0, f64::min),
        fold(|p| p.1, 1.0, f64::max),
    );
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "All-reduce of f32 (sum): latency against size",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (4f64..x_max * 2.0).log_scale(),
            (y_min / 2.0..y_max * 2.0).log_scale(),
        )
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("bytes per rank")
        .y_desc("p50 (µs)")
        .draw()
        .map_err(plot_error)?;
    draw_series(&mut chart, series, true, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(plot_error)?;
    Ok(true)
}
