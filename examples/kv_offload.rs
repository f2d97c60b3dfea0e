//! KV-cache offload through the storage tiers: KV blocks go DRAM (or, with `--device cuda`,
//! GPU memory) -> file -> S3 and back (S3 -> file -> DRAM or GPU memory), each hop verified
//! and timed.
//!
//! ```text
//! cargo run --release --example kv_offload --features s3            # starts a local moto S3
//! cargo run --release --example kv_offload --features s3 -- \
//!     --endpoint http://127.0.0.1:9000 --bucket kv --access-key K --secret-key S
//! ```
//! Options: `--blocks N` (default 64), `--block-kib K` (default 256), `--dir PATH` (where the
//! file tier lives; default the temp dir), `--buffered` (page cache instead of O_DIRECT),
//! `--blocks-per-object N` (default 16), `--device cpu|cuda` (default cpu: where the KV blocks
//! start and end; cuda puts them in GPU 0's memory, moved to and from the file by the POSIX
//! backend's pinned bounce buffers, or GDS where created), `--no-s3` (only the file tier:
//! for machines without an S3 server, e.g. the GPU machine). Without `--endpoint`, the `AWS_ENDPOINT_URL`
//! variable is used, else moto is started from `scripts/s3/moto_server.py` (installed by
//! `scripts/deps/gds.sh`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    offload::run()
}

mod offload {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Command, Stdio};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use nixl::mem::DeviceBuffer;
    use nixl::storage::{FileRegion, ObjectRegion, OpenFlags, PosixParams, S3Params};
    use nixl::{Agent, AgentConfig, HostBuffer, MemKind, XferDescList, XferOp, XferOptions};

    type Res<T> = Result<T, Box<dyn std::error::Error>>;

    const TIMEOUT: Duration = Duration::from_secs(120);

    /// KV-cache offload through the storage tiers: DRAM or GPU memory -> file -> S3 and back,
    /// each hop verified and timed.
    #[derive(clap::Parser, Debug)]
    #[command(name = "kv_offload")]
    struct Cli {
        /// S3 endpoint (default: `AWS_ENDPOINT_URL`, else a local moto server is started).
        #[arg(long, env = "AWS_ENDPOINT_URL")]
        endpoint: Option<String>,
        /// Bucket.
        #[arg(long, default_value = "nixl-kv")]
        bucket: String,
        /// Region.
        #[arg(long, default_value = "us-east-1")]
        region: String,
        /// Access key.
        #[arg(long)]
        access_key: Option<String>,
        /// Secret key.
        #[arg(long)]
        secret_key: Option<String>,
        /// KV blocks.
        #[arg(long, default_value_t = 64)]
        blocks: usize,
        /// Block size in KiB (a multiple of 4).
        #[arg(long, default_value_t = 256)]
        block_kib: u64,
        /// Blocks per object in S3.
        #[arg(long, default_value_t = 16)]
        blocks_per_object: usize,
        /// Where the file tier lives.
        #[arg(long, default_value_os_t = std::env::temp_dir())]
        dir: std::path::PathBuf,
        /// The page cache instead of O_DIRECT.
        #[arg(long)]
        buffered: bool,
        /// Only the file tier (no S3 server needed).
        #[arg(long)]
        no_s3: bool,
        /// Where the KV blocks start and end: `cpu` (DRAM) or `cuda` (GPU 0's memory).
        #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
        device: String,
    }

    struct Args {
        endpoint: Option<String>,
        bucket: String,
        region: String,
        access_key: Option<String>,
        secret_key: Option<String>,
        blocks: usize,
        block: u64,
        per_object: usize,
        dir: std::path::PathBuf,
        direct: bool,
        cuda: bool,
        no_s3: bool,
    }

    fn parse() -> Res<Args> {
        let c = <Cli as clap::Parser>::parse();
        let a = Args {
            endpoint: c.endpoint,
            bucket: c.bucket,
            region: c.region,
            access_key: c.access_key,
            secret_key: c.secret_key,
            blocks: c.blocks,
            block: c.block_kib << 10,
            per_object: c.blocks_per_object,
            dir: c.dir,
            direct: !c.buffered,
            cuda: c.device == "cuda",
            no_s3: c.no_s3,
        };
        if a.blocks == 0
            || a.per_object == 0
            || !a.blocks.is_multiple_of(a.per_object)
            || a.block == 0
            || !a.block.is_multiple_of(4096)
        {
            return Err("--blocks must be a non-zero multiple of --blocks-per-object, --block-kib a multiple of 4".into());
        }
        Ok(a)
    }

    /// A moto server started for this run; it exits when its stdin closes (when we drop it).
    struct Moto(Child);

    impl Drop for Moto {
        fn drop(&mut self) {
            drop(self.0.stdin.take());
            let _ = self.0.wait();
        }
    }

    fn start_moto(bucket: &str) -> Res<(Moto, String)> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/s3/moto_server.py");
        let pythonpath = std::env::var("NIXL_S3_MOTO_PYTHONPATH")
            .unwrap_or_else(|_| "/opt/nixl-deps/gds/moto".to_owned());
        let mut child = Command::new("python3")
            .env("PYTHONPATH", pythonpath)
            .args([script, "--until-stdin-closes", "--bucket", bucket])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("starting moto ({script}): {e}; run scripts/deps/gds.sh or pass --endpoint")
            })?;
        let out = child.stdout.take().ok_or("moto has no stdout")?;
        let moto = Moto(child);
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        let start = line
            .find("http://")
            .ok_or_else(|| format!("moto did not start: {line:?}"))?;
        let end = line[start..].find('"').ok_or("bad moto output")? + start;
        Ok((moto, line[start..end].to_owned()))
    }

    fn gbps(bytes: u64, t: Duration) -> f64 {
        bytes as f64 / t.as_secs_f64() / 1e9
    }

    /// Posts one request and waits, returning its duration.
    fn hop(
        agent: &Agent,
        op: XferOp,
        local: &XferDescList,
        remote: &XferDescList,
    ) -> Res<Duration> {
        let req = agent.create_xfer_req(op, local, remote, agent.name(), XferOptions::default())?;
        let t = Instant::now();
        agent.post_xfer_req(&req)?;
        req.wait(TIMEOUT)?;
        Ok(t.elapsed())
    }

    fn check(what: &str, a: &HostBuffer, b: &HostBuffer) -> Res<()> {
        if a.to_vec() != b.to_vec() {
            return Err(format!("{what}: data differs").into());
        }
        println!("  verified: {what}");
        Ok(())
    }

    pub(crate) fn run() -> Res<()> {
        let args = parse()?;
        let total = args.block * args.blocks as u64;
        let agent = Agent::new("kv-offload", AgentConfig::default())?;
        agent.create_backend(PosixParams::default())?;
        let mut _moto = None;
        if !args.no_s3 {
            let (endpoint, access, secret) = match &args.endpoint {
                Some(e) => (e.clone(), args.access_key.clone(), args.secret_key.clone()),
                None => {
                    let (m, e) = start_moto(&args.bucket)?;
                    println!("started moto S3 at {e}");
                    _moto = Some(m);
                    (e, Some("testing".to_owned()), Some("testing".to_owned()))
                }
            };
            agent.create_backend(
                S3Params::default()
                    .endpoint(endpoint)
                    .bucket(args.bucket.clone())
                    .region(args.region.clone())
                    .access_key_id(access)
                    .secret_access_key(secret),
            )?;
        }

        // The DRAM tier: the KV blocks, a staging buffer between file and S3, and the restore target.
        let kv = Arc::new(HostBuffer::new(total as usize).ok_or("alloc")?);
        let staging = Arc::new(HostBuffer::new(total as usize).ok_or("alloc")?);
        let restored = Arc::new(HostBuffer::new(total as usize).ok_or("alloc")?);
        kv.fill_pattern(2024);
        let path = args
            .dir
            .join(format!("nixl-kv-offload-{}.bin", std::process::id()));
        let flags = if args.direct {
            OpenFlags::direct()
        } else {
            OpenFlags::buffered()
        };
        let file = Arc::new(FileRegion::open(
            &path,
            total,
            OpenFlags {
                truncate: true,
                ..flags
            },
        )?);
        let run_id = std::process::id();
        let groups = if args.no_s3 {
            0
        } else {
            args.blocks / args.per_object
        };
        let objects: Vec<Arc<ObjectRegion>> = (0..groups)
            .map(|g| {
                Arc::new(ObjectRegion::new(
                    format!("kv/{run_id}/group-{g}"),
                    args.block * args.per_object as u64,
                ))
            })
            .collect();
        // A backend registers a list only if it supports every kind in it: the DRAM buffers go
        // to both backends, the file to POSIX, the objects to OBJ.
        let _dram = agent.register_mem(vec![kv.clone(), staging.clone(), restored.clone()], &[])?;
        let _file = agent.register_mem(vec![file.clone()], &[])?;
        // The GPU tier (--device cuda): the KV blocks start in and are restored to GPU 0.
        let gpu = if args.cuda {
            let src = Arc::new(DeviceBuffer::new(0, total as usize)?);
            let dst = Arc::new(DeviceBuffer::new(0, total as usize)?);
            src.copy_from_host(0, &kv.to_vec())?;
            dst.fill(0)?;
            Some((src, dst))
        } else {
            None
        };
        let _vram = gpu
            .as_ref()
            .map(|(s, d)| agent.register_mem(vec![s.clone(), d.clone()], &[]))
            .transpose()?;
        let _objects = (!objects.is_empty())
            .then(|| {
                agent.register_mem(
                    objects
                        .iter()
                        .map(|o| o.clone() as Arc<dyn nixl::core::MemoryRegion>)
                        .collect(),
                    &[],
                )
            })
            .transpose()?;
        println!(
            "{} KV blocks of {} KiB ({:.1} MiB) in {} -> {} ({}){}",
            args.blocks,
            args.block >> 10,
            total as f64 / (1 << 20) as f64,
            if gpu.is_some() { "GPU 0" } else { "DRAM" },
            path.display(),
            if args.direct {
                "O_DIRECT"
            } else {
                "page cache"
            },
            if args.no_s3 {
                String::new()
            } else {
                format!(
                    " -> s3://{}/kv/{run_id}/ ({} objects)",
                    args.bucket,
                    objects.len()
                )
            }
        );

        let dram =
            |b: &HostBuffer| XferDescList::blocks(MemKind::Dram, b.addr(), args.block, args.blocks);
        let vram = |b: &DeviceBuffer| {
            XferDescList::blocks(MemKind::Vram, b.addr(), args.block, args.blocks)
        };
        let file_blocks = file.blocks(0, args.block, args.blocks);
        let obj_blocks = || {
            let mut l = XferDescList::new(MemKind::Object);
            for o in &objects {
                for d in o.blocks(0, args.block, args.per_object).descs() {
                    l.push(*d);
                }
            }
            l
        };
        let report = |name: &str, t: Duration| {
            println!(
                "{name:<28} {:>8.2} ms {:>7.2} GB/s",
                t.as_secs_f64() * 1e3,
                gbps(total, t)
            )
        };

        // Down: DRAM (or VRAM) -> file, verified by reading the file back.
        match &gpu {
            Some((src, _)) => report(
                "VRAM -> file (WRITE)",
                hop(&agent, XferOp::Write, &vram(src), &file_blocks)?,
            ),
            None => report(
                "DRAM -> file (WRITE)",
                hop(&agent, XferOp::Write, &dram(&kv), &file_blocks)?,
            ),
        }
        report(
            "file -> DRAM (READ)",
            hop(&agent, XferOp::Read, &dram(&staging), &file_blocks)?,
        );
        check("file holds the KV blocks", &kv, &staging)?;
        if !args.no_s3 {
            // file -> S3: the staged copy goes up, one object per group of blocks.
            report(
                "DRAM -> S3 (WRITE)",
                hop(&agent, XferOp::Write, &dram(&staging), &obj_blocks())?,
            );
            let sizes = agent.query_mem(
                &objects.iter().map(|o| o.query_desc()).collect::<Vec<_>>(),
                &[],
            )?;
            if sizes
                .iter()
                .any(|q| q.map(|q| q.size) != Some(Some(args.block * args.per_object as u64)))
            {
                return Err(format!("objects missing or of the wrong size: {sizes:?}").into());
            }
            println!(
                "  verified: {} objects exist with the right size",
                objects.len()
            );

            // Back up: S3 -> DRAM -> file -> DRAM.
            staging.fill(0);
            report(
                "S3 -> DRAM (READ)",
                hop(&agent, XferOp::Read, &dram(&staging), &obj_blocks())?,
            );
            check("S3 holds the KV blocks", &kv, &staging)?;
        }
        report(
            "DRAM -> file (WRITE)",
            hop(&agent, XferOp::Write, &dram(&staging), &file_blocks)?,
        );
        match &gpu {
            Some((_, dst)) => {
                report(
                    "file -> VRAM (READ)",
                    hop(&agent, XferOp::Read, &vram(dst), &file_blocks)?,
                );
                if dst.to_vec()? != kv.to_vec() {
                    return Err("restored KV blocks in GPU memory differ from the originals".into());
                }
                println!("  verified: restored KV blocks in GPU memory equal the originals");
            }
            None => {
                report(
                    "file -> DRAM (READ)",
                    hop(&agent, XferOp::Read, &dram(&restored), &file_blocks)?,
                );
                check("restored KV blocks equal the originals", &kv, &restored)?;
            }
        }
        if let Some(p) = agent
            .path_report(agent.name())
            .into_iter()
            .map(|(b, p)| format!("{b}: {p}"))
            .reduce(|a, b| format!("{a}; {b}"))
        {
            println!("paths: {p}");
        }
        drop((_dram, _file, _objects, _vram));
        std::fs::remove_file(&path)?;
        println!("ok");
        Ok(())
    }
}
