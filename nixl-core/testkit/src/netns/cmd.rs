//! The tools the harness drives (`ip`, `tc`, `unshare`, `timeout`, `sh`), how their failures
//! are reported, and the sweeper that removes what dead test processes left behind.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The prefix of every namespace the harness creates: `nixl-<pid>-<seq>-<role>`.
pub(crate) const PREFIX: &str = "nixl-";

/// Finds a tool on `PATH`, then in the sbin directories a non-login `PATH` may lack.
pub(crate) fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
                .iter()
                .map(PathBuf::from),
        )
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The error of a tool that is missing or cannot do what the harness needs on this machine.
pub(crate) fn unsupported(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, what.into())
}

/// Runs a tool to completion; a non-zero exit becomes an error carrying its stderr.
pub(crate) fn run(tool: &Path, args: &[&str]) -> io::Result<Output> {
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", tool.display())))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "`{} {}` exited with {}: {}",
            tool.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out)
}

/// The effective user id of this process (from `/proc/self/status`).
pub(crate) fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The tools, found once per harness.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    pub ip: PathBuf,
    pub tc: Option<PathBuf>,
    pub unshare: PathBuf,
    pub timeout: PathBuf,
    pub sh: PathBuf,
}

impl Tools {
    /// Finds every tool; `Unsupported` naming what is missing (the caller skips).
    pub(super) fn find() -> io::Result<Tools> {
        let need = |n: &str, pkg: &str| {
            find_tool(n).ok_or_else(|| {
                unsupported(format!(
                    "`{n}` not found (install {pkg}: scripts/deps/netns.sh)"
                ))
            })
        };
        Ok(Tools {
            ip: need("ip", "iproute2")?,
            tc: find_tool("tc"),
            unshare: need("unshare", "util-linux")?,
            timeout: need("timeout", "coreutils")?,
            sh: need("sh", "dash")?,
        })
    }

    /// `ip` with arguments.
    pub(super) fn ip(&self, args: &[&str]) -> io::Result<Output> {
        run(&self.ip, args)
    }

    /// The pids of every process inside network namespace `ns`.
    pub(super) fn pids(&self, ns: &str) -> Vec<u32> {
        match self.ip(&["netns", "pids", ns]) {
            Ok(out) => String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// SIGKILLs the given pids.
    pub(super) fn kill(&self, pids: &[u32]) {
        for &pid in pids {
            // A process that exited meanwhile is fine.
            if let Err(e) = crate::signal::send(pid, crate::signal::Sig::Kill) {
                tracing::debug!(pid, error = %e, "killing a process of a namespace failed");
            }
        }
    }

    /// Kills every process inside `ns`, then deletes it. Errors are logged: this runs from
    /// `Drop` and the sweeper.
    pub(super) fn remove_ns(&self, ns: &str) {
        // Processes forked while we kill (a dying server's children) are caught by a second pass.
        for _ in 0..3 {
            let pids = self.pids(ns);
            if pids.is_empty() {
                break;
            }
            self.kill(&pids);
        }
        if let Err(e) = self.ip(&["netns", "del", ns]) {
            tracing::debug!(ns, error = %e, "deleting a network namespace failed");
        }
    }

    /// Names of every network namespace `ip netns list` shows.
    pub(super) fn list_ns(&self) -> Vec<String> {
        match self.ip(&["netns", "list"]) {
            Ok(out) => String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_owned)
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// The pid in a harness namespace name (`nixl-<pid>-...`), if it is one.
pub(crate) fn owner_pid(ns: &str) -> Option<u32> {
    ns.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Whether a process with this pid exists.
pub(crate) fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes the namespaces (and kills the processes inside them) that harnesses of processes
/// no longer alive left behind: a test binary killed with SIGKILL cannot run its `Drop`.
/// Returns how many namespaces were removed. Namespaces of live processes are left alone.
pub fn sweep() -> usize {
    let Ok(tools) = Tools::find() else {
        return 0;
    };
    let mut removed = 0;
    for ns in tools.list_ns() {
        if let Some(pid) = owner_pid(&ns) {
            if !alive(pid) {
                tracing::info!(
                    ns,
                    pid,
                    "removing a leftover network namespace of a dead process"
                );
                tools.remove_ns(&ns);
                removed += 1;
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pids_are_parsed_from_names() {
        assert_eq!(owner_pid("nixl-1234-0-h1"), Some(1234));
        assert_eq!(owner_pid("nixl-x-0-h1"), None);
        assert_eq!(owner_pid("other-1234-0"), None);
        assert_eq!(owner_pid("nixl-"), None);
    }

    #[test]
    fn this_process_is_alive() {
        assert!(alive(std::process::id()));
        // Above the kernel's pid_max limit (4194304): never a live process.
        assert!(!alive(4_194_305));
    }
}
