//! A Python program in a child process, driven by JSON lines: one command per line on its
//! stdin, one answer per command on a stdout line starting with `@@ ` (other lines are its
//! libraries' logs, echoed). The NIXL peer and PyTorch's TCPStore run this way.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::{json, Value};

/// How long a command may take before the test fails.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(90);

/// A Python program in a child process.
#[derive(Debug)]
pub struct PyChild {
    tag: &'static str,
    child: Child,
    stdin: ChildStdin,
    answers: Receiver<String>,
}

impl PyChild {
    /// Starts `cmd` (stdin and stdout piped, stderr inherited); `tag` prefixes its log lines
    /// and names it in errors.
    pub fn spawn(mut cmd: Command, tag: &'static str) -> std::io::Result<Self> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(std::io::Error::other("no stdin or stdout"));
        };
        let (tx, answers) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match line.strip_prefix("@@ ") {
                    Some(a) => {
                        if tx.send(a.to_owned()).is_err() {
                            break;
                        }
                    }
                    None => eprintln!("[{tag}] {line}"),
                }
            }
        });
        Ok(PyChild {
            tag,
            child,
            stdin,
            answers,
        })
    }

    /// The next answer (the first one may come unasked, as a greeting).
    pub fn answer(&mut self) -> Result<Value, String> {
        let line = self
            .answers
            .recv_timeout(ANSWER_TIMEOUT)
            .map_err(|e| format!("no answer from the {} child: {e}", self.tag))?;
        let v: Value = serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
        if v["ok"] == json!(true) {
            Ok(v)
        } else {
            Err(format!("{}: failed: {}", self.tag, v["error"]))
        }
    }

    /// Sends a command; the answer, or the error the program reported.
    pub fn call(&mut self, cmd: Value) -> Result<Value, String> {
        writeln!(self.stdin, "{cmd}")
            .map_err(|e| format!("writing to the {} child: {e}", self.tag))?;
        self.stdin.flush().map_err(|e| e.to_string())?;
        self.answer().map_err(|e| format!("{cmd}: {e}"))
    }

    /// Sends a command that must succeed.
    #[track_caller]
    pub fn ok(&mut self, cmd: Value) -> Value {
        match self.call(cmd) {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        }
    }

    /// Kills the process now (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PyChild {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "exit"}));
        let _ = self.stdin.flush();
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }
}
