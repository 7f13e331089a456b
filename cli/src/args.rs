//! A minimal command-line parser: `--flag` and `--name value` options after a subcommand.

use std::str::FromStr;

/// Arguments left to parse; [`Self::finish`] rejects anything nobody asked for.
pub struct Args {
    rest: Vec<String>,
}

impl Args {
    pub fn new(rest: &[String]) -> Self {
        Self {
            rest: rest.to_vec(),
        }
    }

    /// Removes `name` if present; whether it was.
    pub fn flag(&mut self, name: &str) -> bool {
        let before = self.rest.len();
        self.rest.retain(|arg| arg != name);
        self.rest.len() != before
    }

    /// Removes `name VALUE` if present and parses VALUE.
    pub fn value<T: FromStr>(&mut self, name: &str) -> Result<Option<T>, String> {
        let Some(at) = self.rest.iter().position(|arg| arg == name) else {
            return Ok(None);
        };
        if at + 1 >= self.rest.len() {
            return Err(format!("{name} needs a value"));
        }
        let value = self.rest.remove(at + 1);
        self.rest.remove(at);
        value
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}: cannot parse {value:?}"))
    }

    /// Removes and returns the first positional argument, if any. Call it after consuming every
    /// `--name value` option, or it may take an option's value.
    pub fn positional(&mut self) -> Option<String> {
        let at = self.rest.iter().position(|arg| !arg.starts_with("--"))?;
        Some(self.rest.remove(at))
    }

    /// Fails if any argument was not consumed.
    pub fn finish(self) -> Result<(), String> {
        match self.rest.first() {
            None => Ok(()),
            Some(arg) => Err(format!("unexpected argument {arg:?}")),
        }
    }
}
