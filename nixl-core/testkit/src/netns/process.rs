//! Processes inside a host, and the control channel between them and the test: the child's
//! stdin and stdout, which never cross the network under test, so cutting a link cannot cut
//! the test's control of its processes.
//!
//! The child writes control lines (`@nixl-netns <text>`, see [`Control::send`]) to stdout; the
//! parent reads them (the prefix may follow other output on the same line) with [`HostProcess::recv`], and every other line the child prints (its
//! logs, libtest's chatter) is forwarded to the parent's stderr with the host's label. The
//! parent sends lines to the child's stdin ([`HostProcess::send`]); when the parent goes away
//! its end closes and [`Control`] exits the child: a host process never outlives its test.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What starts a control line on the child's stdout.
pub const CONTROL_PREFIX: &str = "@nixl-netns ";
/// Set in a host process's environment: the index of its host.
pub const ENV_HOST: &str = "NIXL_NETNS_HOST";
/// The exit status of a host process whose parent closed the control channel.
pub const EXIT_ORPHANED: i32 = 97;

/// A process running inside one host of a [`Net`](super::Net), killed (with everything it
/// started inside its PID namespace) on drop.
pub struct HostProcess {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

impl std::fmt::Debug for HostProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostProcess")
            .field("label", &self.label)
            .field("pid", &self.child.id())
            .finish()
    }
}

fn forward(
    label: String,
    stream: impl Read + Send + 'static,
    control: Option<mpsc::Sender<String>>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("netns-{label}"))
        .spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                // A control line may follow output that lacked its newline (libtest's
                // `test name ... ` is printed before the test runs).
                match (&control, line.find(CONTROL_PREFIX)) {
                    (Some(tx), Some(at)) => {
                        if at > 0 {
                            eprintln!("[{label}] {}", &line[..at]);
                        }
                        let msg = line[at + CONTROL_PREFIX.len()..].to_owned();
                        if tx.send(msg).is_err() {
                            break;
                        }
                    }
                    // The blank line before each control line is the sender's, not output.
                    _ if line.is_empty() => {}
                    _ => eprintln!("[{label}] {line}"),
                }
            }
        })
}

impl HostProcess {
    /// Wraps a spawned child whose stdin, stdout and stderr are pipes.
    pub(crate) fn new(label: String, mut child: Child) -> io::Result<HostProcess> {
        let (tx, rx) = mpsc::channel();
        let mut readers = Vec::new();
        let missing = || io::Error::other("host process spawned without piped stdio");
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let stderr = child.stderr.take().ok_or_else(missing)?;
        readers.push(forward(label.clone(), stdout, Some(tx))?);
        readers.push(forward(label.clone(), stderr, None)?);
        Ok(HostProcess {
            label,
            stdin: child.stdin.take(),
            child,
            lines: rx,
            readers,
            status: None,
        })
    }

    /// The label its output is forwarded with (`h<host>:<name>`).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The pid of the process that holds the host's PID namespace (killing it kills them all).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends one line to the child's [`Control`].
    pub fn send(&mut self, line: &str) -> io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "control channel closed"))?;
        writeln!(stdin, "{line}")?;
        stdin.flush()
    }

    /// The next control line from the child within `timeout`: `TimedOut`, or
    /// `UnexpectedEof` once the child closed its stdout (it exited).
    pub fn recv(&mut self, timeout: Duration) -> io::Result<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Ok(l),
            Err(RecvTimeoutError::Timeout) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{}: no control line within {timeout:?}", self.label),
            )),
            Err(RecvTimeoutError::Disconnected) => {
                let st = self.wait(Duration::from_secs(5)).ok();
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "{}: exited ({st:?}) before sending a control line",
                        self.label
                    ),
                ))
            }
        }
    }

    /// The next control line that starts with `prefix` (others are logged and skipped), with
    /// the prefix removed.
    pub fn expect(&mut self, prefix: &str, timeout: Duration) -> io::Result<String> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let line = self.recv(left)?;
            match line.strip_prefix(prefix) {
                Some(rest) => return Ok(rest.to_owned()),
                None => eprintln!(
                    "[{}] (skipped while waiting for {prefix:?}) {line}",
                    self.label
                ),
            }
        }
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<ExitStatus> {
        if let Some(st) = self.status {
            return Ok(st);
        }
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                self.status = Some(st);
                return Ok(st);
            }
            if Instant::now() >= end {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{}: still running after {timeout:?}", self.label),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Closes the child's control channel (its [`Control`] then exits it) without waiting.
    pub fn close(&mut self) {
        self.stdin = None;
    }

    /// Kills the process and everything it started in its host's PID namespace, and reaps it.
    pub fn kill(&mut self) {
        self.stdin = None;
        if self.status.is_none() {
            let _ = self.child.kill();
            match self.child.wait() {
                Ok(st) => self.status = Some(st),
                Err(e) => {
                    tracing::debug!(label = %self.label, error = %e, "reaping a host process failed")
                }
            }
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

impl super::Net {
    /// Starts `cmd` (program, arguments, environment and directory are taken from it) inside
    /// `host` with piped stdio; see [`HostProcess`] and [`Control`].
    pub fn spawn(&self, host: usize, label: &str, cmd: &Command) -> io::Result<HostProcess> {
        let ns = self.live_host(host)?;
        // Inside the new namespaces: a private /dev/shm, the host's name, then the program
        // under `timeout` (it is PID 1 there, so when it ends every process of the host ends).
        let script = "mount -t tmpfs -o mode=1777,size=256m nixl-shm /dev/shm \
                      && echo \"nixl-h$NIXL_NETNS_HOST\" > /proc/sys/kernel/hostname \
                      && exec \"$@\"";
        let mut c = Command::new(&self.tools.ip);
        c.args(["netns", "exec", ns])
            .arg(&self.tools.unshare)
            .args([
                "--pid",
                "--mount",
                "--uts",
                "--ipc",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--",
            ])
            .arg(&self.tools.sh)
            .args(["-c", script, "nixl-host"])
            .arg(&self.tools.timeout)
            .args([
                "-s",
                "KILL",
                &format!("{}s", self.spec.lifetime.as_secs().max(1)),
            ])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(d) = cmd.get_current_dir() {
            c.current_dir(d);
        }
        c.env(ENV_HOST, host.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = c.spawn()?;
        HostProcess::new(format!("h{host}:{label}"), child)
    }

    /// Starts this test binary again inside `host`, running only the (ignored) test `test`
    /// with `--nocapture`, with extra environment `env`: the usual child-process entry point
    /// of a test file.
    pub fn spawn_test(
        &self,
        host: usize,
        test: &str,
        env: &[(&str, String)],
    ) -> io::Result<HostProcess> {
        let exe = std::env::current_exe()?;
        let mut c = Command::new(exe);
        c.args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        for (k, v) in env {
            c.env(k, v);
        }
        self.spawn(host, test, &c)
    }
}

/// The child's side of the control channel: present in a process the harness started.
#[derive(Debug)]
pub struct Control {
    host: usize,
    lines: Receiver<String>,
}

impl Control {
    /// The control channel of this process, when the harness started it (else `None`).
    /// Starts a thread reading stdin; when the parent closes it (the test ended, failed or
    /// was killed) the process exits with [`EXIT_ORPHANED`].
    pub fn connect() -> Option<Control> {
        let host = std::env::var(ENV_HOST).ok()?.parse().ok()?;
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("netns-control".into())
            .spawn(move || {
                for line in io::stdin().lock().lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        return;
                    }
                }
                eprintln!("netns: the parent closed the control channel; exiting");
                std::process::exit(EXIT_ORPHANED);
            });
        if let Err(e) = spawned {
            eprintln!("netns: cannot start the control reader: {e}");
            return None;
        }
        Some(Control { host, lines: rx })
    }

    /// The index of the host this process runs in.
    pub fn host(&self) -> usize {
        self.host
    }

    /// Sends a control line to the parent.
    pub fn send(&self, line: &str) {
        let mut out = io::stdout().lock();
        // A parent that is gone cannot read it; the stdin reader ends the process then.
        let _ = writeln!(out, "\n{CONTROL_PREFIX}{line}");
        let _ = out.flush();
    }

    /// The next line from the parent within `timeout` (`None`: none came).
    pub fn recv(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }
}
