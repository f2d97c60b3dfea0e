//! Where the exchange keeps metadata: endpoints, namespace, lease and retry settings, and the
//! key layout `{namespace}/{agent}/{label}`.

use std::time::Duration;

use crate::error::{Error, Op, Result};

/// The environment variable naming etcd endpoints (comma separated), read when
/// [`EtcdConfig::endpoints`] is empty.
pub const ENV_ENDPOINTS: &str = "NIXL_ETCD_ENDPOINTS";
/// The environment variable naming the key namespace, read when [`EtcdConfig::namespace`] is
/// `None`.
pub const ENV_NAMESPACE: &str = "NIXL_ETCD_NAMESPACE";
/// The namespace used when neither the config nor the environment names one.
pub const DEFAULT_NAMESPACE: &str = "/nixl/agents";
/// NIXL's default namespace prefix. NIXL writes keys as `prefix + "/" + agent + "/" +
/// label`, so its default keys have a double slash: `/nixl/agents//{agent}/metadata`.
pub const NIXL_NAMESPACE: &str = "/nixl/agents/";
pub use crate::exchange::published::{DEFAULT_LABEL, MAX_LABEL};

/// How an [`EtcdExchange`](super::EtcdExchange) reaches etcd.
///
/// ```
/// use std::time::Duration;
/// use nixl_core::etcd::EtcdConfig;
///
/// let cfg = EtcdConfig::default()
///     .endpoints(vec!["http://127.0.0.1:2379".into()])
///     .lease_ttl(Duration::from_secs(5));
/// assert_eq!(cfg.retries, 2);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// etcd client URLs (`http://host:port` or `host:port`); empty: read
    /// [`ENV_ENDPOINTS`].
    pub endpoints: Vec<String>,
    /// Key namespace; `None`: read [`ENV_NAMESPACE`], else [`DEFAULT_NAMESPACE`].
    pub namespace: Option<String>,
    /// Time-to-live of the lease every published key is attached to: an agent that stops
    /// keeping it alive (it crashed) disappears this long after its last keep-alive. Rounded
    /// up to whole seconds; etcd may raise very small values to its minimum.
    pub lease_ttl: Duration,
    /// Deadline of one etcd request attempt.
    pub request_timeout: Duration,
    /// How many times a request that failed transiently (connection refused, deadline,
    /// leader change) is retried before its error is returned.
    pub retries: u32,
    /// Use NIXL's keys and blobs, to meet stock NIXL agents in etcd
    /// ([`crate::nixl_wire`]): the namespace is taken verbatim (default [`NIXL_NAMESPACE`],
    /// so keys are `/nixl/agents//{agent}/{label}`), agent names are not escaped, `publish`
    /// writes NIXL's blob and NIXL's empty announcement key `{namespace}/{agent}/`. Deleting
    /// the agent's prefix (lease expiry, `invalidate_local`) invalidates it on NIXL peers
    /// too.
    pub nixl_keys: bool,
}

crate::__setters!(EtcdConfig {
    endpoints: Vec<String>,
    lease_ttl: Duration,
    request_timeout: Duration,
    retries: u32,
    nixl_keys: bool,
} some {
    namespace: String,
});

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: Vec::new(),
            namespace: None,
            lease_ttl: Duration::from_secs(10),
            request_timeout: Duration::from_secs(2),
            retries: 2,
            nixl_keys: false,
        }
    }
}

/// A checked configuration with the environment applied.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub endpoints: Vec<String>,
    pub layout: KeyLayout,
    pub ttl_secs: i64,
    pub request_timeout: Duration,
    pub retries: u32,
    pub nixl: bool,
}

impl EtcdConfig {
    /// Applies the environment (through `env`, so tests need not touch the process's) and
    /// checks every field.
    pub(crate) fn resolve(
        &self,
        agent: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Resolved> {
        let bad = |reason: String| Error::invalid(agent, Op::Exchange, reason);
        let endpoints: Vec<String> = if self.endpoints.is_empty() {
            env(ENV_ENDPOINTS)
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        } else {
            self.endpoints.clone()
        };
        if endpoints.is_empty() {
            return Err(bad(format!(
                "no etcd endpoints: set EtcdConfig::endpoints or {ENV_ENDPOINTS}"
            )));
        }
        if let Some(e) = endpoints
            .iter()
            .find(|e| e.trim().is_empty() || e.starts_with("https://"))
        {
            return Err(bad(format!(
                "etcd endpoint {e:?} is empty or needs TLS, which this build does not support"
            )));
        }
        let namespace = match &self.namespace {
            Some(ns) => ns.clone(),
            None => env(ENV_NAMESPACE)
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| {
                    if self.nixl_keys {
                        NIXL_NAMESPACE
                    } else {
                        DEFAULT_NAMESPACE
                    }
                    .to_owned()
                }),
        };
        if namespace.is_empty() {
            return Err(bad(
                "empty etcd namespace (use \"/\" for the root)".to_owned()
            ));
        }
        if self.lease_ttl.is_zero() {
            return Err(bad("lease_ttl must be at least one second".to_owned()));
        }
        let secs = self.lease_ttl.as_secs() + u64::from(self.lease_ttl.subsec_nanos() > 0);
        let ttl_secs =
            i64::try_from(secs).map_err(|_| bad(format!("lease_ttl of {secs} s is too large")))?;
        if self.request_timeout.is_zero() {
            return Err(bad("request_timeout must not be zero".to_owned()));
        }
        Ok(Resolved {
            endpoints,
            layout: if self.nixl_keys {
                KeyLayout::verbatim(&namespace)
            } else {
                KeyLayout::new(&namespace)
            },
            ttl_secs,
            request_timeout: self.request_timeout,
            retries: self.retries,
            nixl: self.nixl_keys,
        })
    }
}

/// Builds and parses keys. Agent names and labels are escaped (`%` → `%25`, `/` → `%2F`) so
/// one agent's prefix never covers another's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyLayout {
    /// The namespace without a trailing `/` (or verbatim, for NIXL's keys).
    ns: String,
    /// Whether names are escaped (not in NIXL's layout).
    escaped: bool,
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3)?;
        out.push(match code {
            "25" => '%',
            "2F" => '/',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

impl KeyLayout {
    pub(crate) fn new(namespace: &str) -> Self {
        KeyLayout {
            ns: namespace.trim_end_matches('/').to_owned(),
            escaped: true,
        }
    }

    /// NIXL's layout: the namespace verbatim and names unescaped.
    pub(crate) fn verbatim(namespace: &str) -> Self {
        KeyLayout {
            ns: namespace.to_owned(),
            escaped: false,
        }
    }

    fn esc(&self, s: &str) -> String {
        if self.escaped {
            escape(s)
        } else {
            s.to_owned()
        }
    }

    /// The namespace as configured, without a trailing `/`.
    pub(crate) fn namespace(&self) -> &str {
        &self.ns
    }

    /// `{namespace}/`: every agent's keys.
    pub(crate) fn all_prefix(&self) -> String {
        format!("{}/", self.ns)
    }

    /// `{namespace}/{agent}/`: one agent's keys.
    pub(crate) fn agent_prefix(&self, agent: &str) -> String {
        format!("{}/{}/", self.ns, self.esc(agent))
    }

    /// `{namespace}/{agent}/{label}`.
    pub(crate) fn key(&self, agent: &str, label: &str) -> String {
        format!("{}/{}/{}", self.ns, self.esc(agent), self.esc(label))
    }

    /// The agent and label of a key under this namespace, `None` for any other key.
    pub(crate) fn parse(&self, key: &[u8]) -> Option<(String, String)> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&self.ns)?.strip_prefix('/')?;
        let (agent, label) = rest.split_once('/')?;
        if agent.is_empty() || label.is_empty() || label.contains('/') {
            return None;
        }
        if !self.escaped {
            return Some((agent.to_owned(), label.to_owned()));
        }
        Some((unescape(agent)?, unescape(label)?))
    }
}

/// Checks a label: 1..=[`MAX_LABEL`] bytes.
#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn config_wins_over_environment() {
        let cfg = EtcdConfig {
            endpoints: vec!["127.0.0.1:1".into()],
            namespace: Some("/ns/".into()),
            ..EtcdConfig::default()
        };
        let r = cfg
            .resolve(
                "a",
                env_of(&[(ENV_ENDPOINTS, "x:2"), (ENV_NAMESPACE, "/other")]),
            )
            .unwrap();
        assert_eq!(r.endpoints, vec!["127.0.0.1:1".to_owned()]);
        assert_eq!(r.layout.key("a", "l"), "/ns/a/l");
    }

    #[test]
    fn environment_fills_gaps_and_defaults_apply() {
        let r = EtcdConfig::default()
            .resolve("a", env_of(&[(ENV_ENDPOINTS, " h1:1, ,h2:2 ")]))
            .unwrap();
        assert_eq!(r.endpoints, vec!["h1:1".to_owned(), "h2:2".to_owned()]);
        assert_eq!(r.layout.namespace(), DEFAULT_NAMESPACE);
        let r = EtcdConfig::default()
            .resolve(
                "a",
                env_of(&[(ENV_ENDPOINTS, "h:1"), (ENV_NAMESPACE, "/custom")]),
            )
            .unwrap();
        assert_eq!(r.layout.agent_prefix("x"), "/custom/x/");
    }

    #[test]
    fn bad_configs_are_typed_errors() {
        let none = env_of(&[]);
        assert!(matches!(
            EtcdConfig::default().resolve("a", &none),
            Err(Error::InvalidParam { .. })
        ));
        let with = |f: fn(&mut EtcdConfig)| {
            let mut c = EtcdConfig {
                endpoints: vec!["h:1".into()],
                ..EtcdConfig::default()
            };
            f(&mut c);
            c.resolve("a", env_of(&[]))
        };
        assert!(matches!(
            with(|c| c.lease_ttl = Duration::ZERO),
            Err(Error::InvalidParam { .. })
        ));
        assert!(matches!(
            with(|c| c.request_timeout = Duration::ZERO),
            Err(Error::InvalidParam { .. })
        ));
        assert!(matches!(
            with(|c| c.namespace = Some(String::new())),
            Err(Error::InvalidParam { .. })
        ));
        assert!(matches!(
            with(|c| c.endpoints = vec!["https://h:1".into()]),
            Err(Error::InvalidParam { .. })
        ));
        assert_eq!(
            with(|c| c.lease_ttl = Duration::from_millis(1500))
                .unwrap()
                .ttl_secs,
            2
        );
    }

    #[test]
    fn prefixes_do_not_overlap_between_agents() {
        let l = KeyLayout::new("/n");
        assert_eq!(l.key("a/b", "x"), "/n/a%2Fb/x");
        assert!(!l.key("a/b", "x").starts_with(&l.agent_prefix("a")));
        assert_eq!(l.parse(b"/n/a%2Fb/x"), Some(("a/b".into(), "x".into())));
        assert_eq!(l.parse(b"/other/a/x"), None);
        assert_eq!(l.parse(b"/n/a/x/y"), None);
        assert_eq!(l.parse(b"/n/a%zz/x"), None);
        assert_eq!(KeyLayout::new("/").key("a", "b"), "/a/b");
    }

    proptest! {
        #[test]
        fn keys_roundtrip(agent in "[a-z/%]{1,12}", label in "[a-z/%.]{1,12}") {
            let l = KeyLayout::new("/nixl/agents");
            prop_assert_eq!(l.parse(l.key(&agent, &label).as_bytes()), Some((agent.clone(), label)));
            prop_assert!(l.key(&agent, "m").starts_with(&l.agent_prefix(&agent)));
        }

        #[test]
        fn arbitrary_keys_never_panic(key in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = KeyLayout::new("/n").parse(&key);
        }
    }
}
