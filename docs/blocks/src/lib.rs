//! Every ` ```rust ` block of `README.md` and of the guide (`docs/guide/src`), compiled: the
//! build script turns each into a function (or, when it has its own `fn main`, a module) of this
//! crate, so `cargo test --workspace` fails as soon as a block no longer compiles against the
//! library. Nothing here runs: the blocks need a broker and peers; the examples (`examples/`)
//! are the programs that run.
//!
//! A block that uses names it does not define gets them from an HTML comment right above its
//! fence, which neither GitHub nor mdBook shows:
//!
//! ````text
//! <!-- rust setup:
//! let mut gradients = vec![0f32; 4];
//! -->
//! ```rust
//! session.all_reduce(&mut gradients, ReduceOp::Sum)?;
//! ```
//! ````
//!
//! Lines that start with `# ` are mdBook's hidden lines: compiled, not shown. A block that must
//! not be compiled is not Rust to this crate: fence it as ` ```text `.

#![allow(unused, dead_code, unreachable_code, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/blocks.rs"));
