//! PyTorch's own c10d TCPStore (`nixl-core/testkit/py/torch_store.py` in a child process):
//! hosted by torch, or a torch client of another store. Skips with [`Dep::Torch`] where
//! torch does not import (the CI machine; the GPU machines have it).

use std::net::SocketAddr;
use std::process::Command;

use serde_json::{json, Value};

use crate::py_child::PyChild;
use crate::Dep;
use crate::{hex, unhex};

/// A torch TCPStore (its master, or a client) in a child process.
#[derive(Debug)]
pub struct TorchStore {
    /// The store's port.
    pub port: u16,
    /// torch's version.
    pub torch: String,
    py: PyChild,
}

fn start(test: &str, args: &[String]) -> Option<TorchStore> {
    let probe = Command::new("python3")
        .args(["-c", "import torch.distributed"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr);
            let last = why.lines().last().unwrap_or("").to_owned();
            crate::skip(
                test,
                Dep::Torch,
                format!("torch.distributed does not import: {last}"),
            );
            return None;
        }
        Err(e) => {
            crate::skip(test, Dep::Torch, format!("python3: {e}"));
            return None;
        }
    }
    // TORCH_STORE_SCRIPT: where the script is when the binary runs on another machine.
    let script = std::env::var("TORCH_STORE_SCRIPT")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/py/torch_store.py").to_owned());
    let mut cmd = Command::new("python3");
    cmd.arg(script).args(args);
    let mut py = PyChild::spawn(cmd, "torch").expect("python3 starts");
    let hello = py.answer().expect("torch's store starts");
    let port = hello["port"].as_u64().expect("port") as u16;
    let torch = hello["torch"].as_str().unwrap_or_default().to_owned();
    println!("{test}: against PyTorch {torch}'s TCPStore");
    Some(TorchStore { port, torch, py })
}

impl TorchStore {
    /// torch hosts a store on 127.0.0.1 (`is_master=True`).
    pub fn serve(test: &str) -> Option<Self> {
        start(test, &["serve".to_owned()])
    }

    /// A torch client of the store at `addr` (`is_master=False`; its constructor validates,
    /// pings and counts itself in, as a worker of a job does).
    pub fn join(test: &str, addr: SocketAddr) -> Option<Self> {
        start(
            test,
            &[
                "join".to_owned(),
                addr.ip().to_string(),
                addr.port().to_string(),
            ],
        )
    }

    /// The store's `host:port`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn ok(&mut self, cmd: Value) -> Value {
        self.py.ok(cmd)
    }

    /// torch's `set`.
    pub fn set(&mut self, key: &str, value: &[u8]) {
        self.ok(json!({"op": "set", "key": key, "hex": hex(value)}));
    }

    /// torch's `get` of a key it checked first; `None` when not set.
    pub fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.ok(json!({"op": "get", "key": key}))["hex"]
            .as_str()
            .map(unhex)
    }

    /// torch's `check`.
    pub fn check(&mut self, keys: &[&str]) -> bool {
        self.ok(json!({"op": "check", "keys": keys}))["ready"] == json!(true)
    }

    /// torch's `delete_key`.
    pub fn delete(&mut self, key: &str) -> bool {
        self.ok(json!({"op": "delete", "key": key}))["deleted"] == json!(true)
    }

    /// torch's `add`.
    pub fn add(&mut self, key: &str, n: i64) -> i64 {
        self.ok(json!({"op": "add", "key": key, "n": n}))["value"]
            .as_i64()
            .expect("value")
    }

    /// torch's `num_keys`.
    pub fn num_keys(&mut self) -> i64 {
        self.ok(json!({"op": "num_keys"}))["n"].as_i64().expect("n")
    }
}
