//! Generates `blocks.rs`: one function per ` ```rust ` block of the README and the guide (see
//! `src/lib.rs` for the conventions).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).join("../..");
    let guide = root.join("docs/guide/src");
    println!("cargo::rerun-if-changed={}", guide.display());
    let mut files = vec![root.join("README.md")];
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(&guide)
        .expect("the guide's sources")
        .map(|entry| entry.expect("a guide entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    chapters.sort();
    files.extend(chapters);

    let mut out = String::new();
    let mut count = 0;
    for file in &files {
        println!("cargo::rerun-if-changed={}", file.display());
        let text = std::fs::read_to_string(file).expect("a markdown file");
        let name = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for block in rust_blocks(&text) {
            count += 1;
            emit(&mut out, count, &name, &block);
        }
    }
    assert!(
        count > 0,
        "no ```rust block found: is the README where it was?"
    );
    let dest = Path::new(&std::env::var("OUT_DIR").expect("cargo sets it")).join("blocks.rs");
    std::fs::write(dest, out).expect("writing blocks.rs");
}

/// A ` ```rust ` block: where it starts, its setup comment and its lines.
struct Block {
    line: usize,
    setup: Vec<String>,
    code: Vec<String>,
}

fn rust_blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let fence_at = i;
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].trim_start().starts_with("```"))
            .unwrap_or_else(|| panic!("a code block at line {} never closes", i + 1));
        i = end + 1;
        if info.split(',').next().map(str::trim) != Some("rust") {
            continue;
        }
        let code = lines[fence_at + 1..end]
            .iter()
            .map(|line| hidden_shown(line).to_string())
            .collect();
        blocks.push(Block {
            line: fence_at + 1,
            setup: setup_above(&lines, fence_at),
            code,
        });
    }
    blocks
}

/// An mdBook hidden line (`# code`) as code.
fn hidden_shown(line: &str) -> &str {
    let trimmed = line.trim_start();
    if trimmed == "#" {
        ""
    } else if let Some(rest) = trimmed.strip_prefix("# ") {
        rest
    } else {
        line
    }
}

/// The lines of a `<!-- rust setup: ... -->` comment ending right above line `fence`.
fn setup_above(lines: &[&str], fence: usize) -> Vec<String> {
    if fence == 0 || lines[fence - 1].trim() != "-->" {
        return Vec::new();
    }
    let Some(start) = (0..fence - 1)
        .rev()
        .find(|&j| lines[j].trim_start().starts_with("<!--"))
    else {
        return Vec::new();
    };
    if lines[start].trim() != "<!-- rust setup:" {
        return Vec::new();
    }
    lines[start + 1..fence - 1]
        .iter()
        .map(|line| (*line).to_string())
        .collect()
}

fn emit(out: &mut String, n: usize, file: &str, block: &Block) {
    let at = format!("{file}, line {}", block.line);
    let has_main = block.code.iter().any(|line| line.contains("fn main("));
    if has_main {
        let _ = writeln!(out, "/// {at}.\nmod block_{n} {{");
        for line in block.setup.iter().chain(&block.code) {
            let _ = writeln!(out, "    {line}");
        }
        let _ = writeln!(out, "}}\n");
        return;
    }
    let _ = writeln!(
        out,
        "/// {at}.\nfn block_{n}() -> Result<(), Box<dyn std::error::Error>> {{"
    );
    for line in block.setup.iter().chain(&block.code) {
        let _ = writeln!(out, "    {line}");
    }
    let _ = writeln!(out, "    Ok(())\n}}\n");
}
