//! The one parser of backend parameter maps: the string form in which backends are created
//! by name ([`crate::backend::BackendPlugin::parse_params`], NIXL's `nixl_b_params_t`).
//!
//! Every plugin parses its map once into its typed params struct through a [`ParamMap`]: one
//! spelling of booleans (`true/false`, `1/0`, `yes/no`, `on/off`, any case), numbers and
//! durations; an empty value means "the default"; a key the plugin never asked for is refused
//! by [`ParamMap::finish`], so a typo is an error instead of a silently ignored setting.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::time::Duration;
//! use nixl_core::backend::ParamMap;
//!
//! # fn main() -> nixl_core::Result<()> {
//! let map = BTreeMap::from([
//!     ("threads".to_owned(), "4".to_owned()),
//!     ("direct".to_owned(), "yes".to_owned()),
//!     ("timeout_ms".to_owned(), "250".to_owned()),
//! ]);
//! let mut p = ParamMap::new("POSIX", &map);
//! assert_eq!(p.usize("threads")?, Some(4));
//! assert_eq!(p.bool("direct")?, Some(true));
//! assert_eq!(p.millis("timeout_ms")?, Some(Duration::from_millis(250)));
//! assert_eq!(p.string("path"), None);
//! p.finish()?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Op, Result};

/// Parses one boolean spelling: `true/false`, `1/0`, `yes/no`, `on/off` (any case).
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// A backend's parameter map being parsed; see the module docs.
#[derive(Debug)]
pub struct ParamMap<'a> {
    backend: &'a str,
    map: &'a BTreeMap<String, String>,
    used: BTreeSet<&'a str>,
}

impl<'a> ParamMap<'a> {
    /// Starts parsing `map` for `backend` (named in errors).
    pub fn new(backend: &'a str, map: &'a BTreeMap<String, String>) -> Self {
        ParamMap {
            backend,
            map,
            used: BTreeSet::new(),
        }
    }

    fn error(&self, key: &str, value: &str, what: &str) -> Error {
        Error::invalid(
            self.backend,
            Op::CreateBackend,
            format!("{} parameter {key}: {value:?} is not {what}", self.backend),
        )
    }

    /// The raw value of `key` (marked as known), `None` when absent or empty.
    pub fn str(&mut self, key: &'a str) -> Option<&'a str> {
        self.used.insert(key);
        self.map
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// The value of `key` as a string.
    pub fn string(&mut self, key: &'a str) -> Option<String> {
        self.str(key).map(str::to_owned)
    }

    /// The value of `key` parsed with `FromStr`; `what` names the expected form in errors.
    pub fn parse<T: FromStr>(&mut self, key: &'a str, what: &str) -> Result<Option<T>> {
        match self.str(key) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| self.error(key, v, what)),
        }
    }

    /// `auto` (as `Some(None)`) or a value parsed with `FromStr` (as `Some(Some(v))`).
    pub fn auto<T: FromStr>(&mut self, key: &'a str, what: &str) -> Result<Option<Option<T>>> {
        match self.str(key) {
            None => Ok(None),
            Some(v) if v.trim().eq_ignore_ascii_case("auto") => Ok(Some(None)),
            Some(_) => Ok(Some(self.parse(key, what)?)),
        }
    }

    /// One of `choices` (`(spelling, value)`, compared ignoring case).
    pub fn choice<T: Copy>(&mut self, key: &'a str, choices: &[(&str, T)]) -> Result<Option<T>> {
        match self.str(key) {
            None => Ok(None),
            Some(v) => choices
                .iter()
                .find(|(s, _)| s.eq_ignore_ascii_case(v.trim()))
                .map(|(_, t)| Some(*t))
                .ok_or_else(|| {
                    let names: Vec<&str> = choices.iter().map(|(s, _)| *s).collect();
                    self.error(key, v, &format!("one of {}", names.join(", ")))
                }),
        }
    }

    /// A boolean (see [`parse_bool`]).
    pub fn bool(&mut self, key: &'a str) -> Result<Option<bool>> {
        match self.str(key) {
            None => Ok(None),
            Some(v) => parse_bool(v)
                .map(Some)
                .ok_or_else(|| self.error(key, v, "a boolean (true/false, 1/0, yes/no, on/off)")),
        }
    }

    /// A non-negative integer.
    pub fn u64(&mut self, key: &'a str) -> Result<Option<u64>> {
        self.parse(key, "a non-negative integer")
    }

    /// A non-negative integer that fits `usize`.
    pub fn usize(&mut self, key: &'a str) -> Result<Option<usize>> {
        self.parse(key, "a non-negative integer")
    }

    /// A duration in milliseconds.
    pub fn millis(&mut self, key: &'a str) -> Result<Option<Duration>> {
        Ok(self.u64(key)?.map(Duration::from_millis))
    }

    /// Every `prefix<NAME> = value` entry, as `(NAME, value)`, marked as known (for pass-through
    /// options such as UCX's `ucx.<OPTION>`). An empty `NAME` is refused.
    pub fn prefixed(&mut self, prefix: &str) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for (k, v) in self.map {
            if let Some(name) = k.strip_prefix(prefix) {
                if name.is_empty() {
                    return Err(self.error(k, v, "a named option"));
                }
                self.used.insert(k.as_str());
                out.push((name.to_owned(), v.clone()));
            }
        }
        Ok(out)
    }

    /// Marks `key` as known without reading it (an accepted alias handled elsewhere).
    pub fn accept(&mut self, key: &'a str) {
        self.used.insert(key);
    }

    /// Ends parsing: refuses keys the plugin never asked for.
    pub fn finish(self) -> Result<()> {
        let unknown: Vec<&str> = self
            .map
            .keys()
            .map(String::as_str)
            .filter(|k| !self.used.contains(k))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid(
                self.backend,
                Op::CreateBackend,
                format!(
                    "unknown {} parameter(s): {}",
                    self.backend,
                    unknown.join(", ")
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn one_spelling_of_booleans() {
        for (v, b) in [("TRUE", true), ("1", true), ("yes", true), ("On", true)] {
            assert_eq!(parse_bool(v), Some(b));
        }
        for v in ["false", "0", "NO", "off"] {
            assert_eq!(parse_bool(v), Some(false));
        }
        assert_eq!(parse_bool("maybe"), None);
        let m = map(&[("a", "auto"), ("b", "3"), ("c", "Threadpool"), ("d", "x")]);
        let mut p = ParamMap::new("T", &m);
        assert_eq!(p.auto::<u32>("a", "n").unwrap(), Some(None));
        assert_eq!(p.auto::<u32>("b", "n").unwrap(), Some(Some(3)));
        assert_eq!(
            p.choice("c", &[("threadpool", 1), ("auto", 0)]).unwrap(),
            Some(1)
        );
        assert!(p.choice("d", &[("threadpool", 1)]).is_err());
        let m = map(&[("x", "maybe")]);
        assert!(matches!(
            ParamMap::new("T", &m).bool("x"),
            Err(Error::InvalidParam { .. })
        ));
    }

    #[test]
    fn unknown_and_bad_values_are_refused() {
        let m = map(&[("n", "-1"), ("typo", "1")]);
        let mut p = ParamMap::new("T", &m);
        assert!(p.u64("n").is_err());
        assert!(
            matches!(p.finish(), Err(Error::InvalidParam { reason, .. }) if reason.contains("typo"))
        );
        let m = map(&[("ucx.", "1")]);
        assert!(ParamMap::new("T", &m).prefixed("ucx.").is_err());
    }

    #[test]
    fn empty_means_default_and_prefixes_pass_through() {
        let m = map(&[("n", ""), ("ucx.TLS", "tcp"), ("ucx.RNDV", "8k")]);
        let mut p = ParamMap::new("T", &m);
        assert_eq!(p.u64("n").unwrap(), None);
        assert_eq!(
            p.prefixed("ucx.").unwrap(),
            vec![
                ("RNDV".to_owned(), "8k".to_owned()),
                ("TLS".to_owned(), "tcp".to_owned())
            ]
        );
        p.finish().unwrap();
    }
}
