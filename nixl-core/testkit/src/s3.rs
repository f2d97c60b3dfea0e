//! A real S3 server for the tests: moto on 127.0.0.1 with SigV4 authentication enforced,
//! started once per test binary by `scripts/s3/moto_server.py` (installed by
//! `scripts/deps/gds.sh`). It exits when the test process does (its stdin closes).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::OnceLock;

use parking_lot::Mutex;
use std::time::Duration;

/// Where the server listens and the only credentials it accepts.
#[derive(Debug, Clone)]
pub struct S3Server {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The access key id it accepts.
    pub access_key: String,
    /// The secret key it checks signatures with.
    pub secret_key: String,
    /// The region to sign for.
    pub region: String,
    /// A bucket that exists.
    pub bucket: String,
}

static SERVER: OnceLock<Result<S3Server, String>> = OnceLock::new();
static CHILD: Mutex<Option<Child>> = Mutex::new(None);
/// The server's stdout after its ready line: where it answers commands.
static ANSWERS: Mutex<Option<std::sync::mpsc::Receiver<String>>> = Mutex::new(None);

fn field(json: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\": \"");
    let start = json.find(&pat)? + pat.len();
    let end = json[start..].find('"')? + start;
    Some(json[start..end].to_owned())
}

fn start() -> Result<S3Server, String> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/s3/moto_server.py"
    );
    let mut pythonpath = std::env::var("NIXL_S3_MOTO_PYTHONPATH")
        .unwrap_or_else(|_| "/opt/nixl-deps/gds/moto".to_owned());
    if let Ok(p) = std::env::var("PYTHONPATH") {
        pythonpath = format!("{pythonpath}:{p}");
    }
    let probe = Command::new("python3")
        .env("PYTHONPATH", &pythonpath)
        .args(["-c", "import moto.server"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        _ => return Err("moto's S3 server is not installed (run scripts/deps/gds.sh)".to_owned()),
    }
    let bucket = "nixl-test".to_owned();
    let mut child = Command::new("python3")
        .env("PYTHONPATH", &pythonpath)
        .args([
            script,
            "--auth",
            "--until-stdin-closes",
            "--bucket",
            &bucket,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting moto: {e}"))?;
    let stdout: ChildStdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .map_err(|_| "moto did not start within 60 s".to_owned())?;
    *CHILD.lock() = Some(child);
    *ANSWERS.lock() = Some(rx);
    let get = |k: &str| field(&line, k).ok_or_else(|| format!("moto printed {line:?}"));
    Ok(S3Server {
        endpoint: get("endpoint")?,
        access_key: get("access_key")?,
        secret_key: get("secret_key")?,
        region: get("region")?,
        bucket,
    })
}

/// The shared server, or why there is none (the caller prints it and skips).
pub fn server() -> Result<S3Server, String> {
    SERVER.get_or_init(start).clone()
}

/// A unique object key.
pub fn key(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "t/{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// Multipart uploads the server holds in `bucket` that were neither completed nor aborted
/// (orphaned parts are billed by a real S3).
pub fn multipart_uploads(bucket: &str) -> usize {
    let mut child = CHILD.lock();
    let stdin = child
        .as_mut()
        .and_then(|c| c.stdin.as_mut())
        .expect("the S3 server is running");
    writeln!(stdin, "uploads {bucket}").expect("ask the S3 server");
    stdin.flush().expect("ask the S3 server");
    let answers = ANSWERS.lock();
    let line = answers
        .as_ref()
        .expect("the S3 server is running")
        .recv_timeout(Duration::from_secs(30))
        .expect("the S3 server answers");
    let n = line
        .split("\"uploads\": ")
        .nth(1)
        .and_then(|r| r.trim_end_matches('}').trim().parse::<i64>().ok())
        .unwrap_or_else(|| panic!("the S3 server answered {line:?}"));
    usize::try_from(n).unwrap_or_else(|_| panic!("no bucket {bucket}"))
}
