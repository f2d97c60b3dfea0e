//! Checks of a peer's endpoint names before `fi_av_insert`, which reads an address of the
//! provider's own length and format with no length from the caller: a short name makes the
//! provider read past it, a name that is not a C string makes the shm provider do so.
//!
//! - Socket-address providers (tcp, sockets, verbs, efa): a peer's name must have exactly the
//!   length of this agent's own name on the same rail (same provider, same format), and where
//!   it is a `sockaddr`, the same address family.
//! - shm: names are C strings, `fi_shm://<pid>:<uid>:<endpoint index>` (libfabric's own format,
//!   so their length varies with the numbers): a peer's name must be one string, its only NUL
//!   last, at most `SMR_NAME_MAX` (256) bytes, and of the same shape as this agent's own (the
//!   same text with other numbers). Its region, `/dev/shm/<name after "://">`, must also exist
//!   and open for reading and writing ([`check_shm_region`]): libfabric 1.17's shm provider
//!   keeps a map slot for a name it cannot open and hands it out again half-initialised, and
//!   the next send through it dereferences no region (a crash found by the
//!   `unpack_address` fuzz target). A region that goes away between this check and the insert
//!   (its owner exiting in that moment) still reaches that leak; the window is one call long.
//!
//! Values inside (an IP address, a port, a pid) are not judged: keep unknown peers out with
//! authentication (`docs/security.md`).
// Public for the `fuzzing` feature's re-exports; crate-private without it.
#![cfg_attr(not(feature = "fuzzing"), allow(unreachable_pub))]

use std::path::PathBuf;

/// `sockaddr` families a provider's names may start with.
const FAMILIES: [u16; 3] = [
    2,  /* AF_INET */
    10, /* AF_INET6 */
    27, /* AF_IB */
];

/// The shm provider's longest name, its NUL included (`SMR_NAME_MAX`).
const SHM_NAME_MAX: usize = 256;
/// Where the shm provider's regions live (`SMR_DIR`).
const SHM_DIR: &str = "/dev/shm";
/// Longest run of digits in an shm name (a 64-bit number).
const MAX_DIGITS: usize = 20;

/// Whether `provider` (`"shm"`, `"tcp;ofi_rxm"`, ...) is the shm provider.
pub(crate) fn is_shm(provider: &str) -> bool {
    provider.split(';').next() == Some("shm")
}

/// Checks `name` (a peer's endpoint name) against `own` (this agent's name on the same rail).
pub fn check_name(provider: &str, name: &[u8], own: &[u8]) -> Result<(), String> {
    if is_shm(provider) {
        return check_shm_name(name, own);
    }
    if name.len() != own.len() {
        return Err(format!(
            "endpoint name of {} bytes (provider {provider} uses {})",
            name.len(),
            own.len()
        ));
    }
    let family = |b: &[u8]| b.get(..2).map(|f| u16::from_ne_bytes([f[0], f[1]]));
    if let Some(f) = family(own).filter(|f| FAMILIES.contains(f)) {
        if family(name) != Some(f) {
            return Err(format!(
                "endpoint name of address family {:?} (provider {provider} uses {f})",
                family(name)
            ));
        }
    }
    Ok(())
}

/// One piece of an shm name's shape: a run of digits, or any other byte.
#[derive(Debug, PartialEq, Eq)]
enum Piece {
    Digits,
    Byte(u8),
}

/// The shape of a name: its bytes, with every run of digits one [`Piece::Digits`]; `None`
/// when a run is longer than a 64-bit number.
fn shape(name: &[u8]) -> Option<Vec<Piece>> {
    let mut out = Vec::with_capacity(name.len());
    let mut run = 0;
    for &b in name {
        if b.is_ascii_digit() {
            run += 1;
            if run > MAX_DIGITS {
                return None;
            }
            if run == 1 {
                out.push(Piece::Digits);
            }
        } else {
            run = 0;
            out.push(Piece::Byte(b));
        }
    }
    Some(out)
}

/// An shm name: one C string of the shape of `own` (see the module docs).
fn check_shm_name(name: &[u8], own: &[u8]) -> Result<(), String> {
    if name.len() > SHM_NAME_MAX {
        return Err(format!(
            "shm endpoint name of {} bytes (at most {SHM_NAME_MAX})",
            name.len()
        ));
    }
    let Some((0, text)) = name.split_last() else {
        return Err("shm endpoint name is not NUL-terminated".into());
    };
    if text.contains(&0) {
        return Err("shm endpoint name has a NUL inside".into());
    }
    let own_text = own.strip_suffix(&[0]).unwrap_or(own);
    match (shape(text), shape(own_text)) {
        (Some(a), Some(b)) if a == b => Ok(()),
        _ => Err(format!(
            "shm endpoint name {:?} is not of the shape of this agent's own ({:?})",
            text.escape_ascii().to_string(),
            own_text.escape_ascii().to_string()
        )),
    }
}

/// The file of the region an shm name (checked by [`check_name`]) names: what the shm provider
/// opens (`shm_open` of the part after `"://"`).
pub(crate) fn shm_region_path(name: &[u8]) -> Result<PathBuf, String> {
    let text = name.strip_suffix(&[0]).unwrap_or(name);
    let text =
        std::str::from_utf8(text).map_err(|_| "shm endpoint name is not UTF-8".to_owned())?;
    let object = text.split_once("://").map_or(text, |(_, o)| o);
    if object.is_empty() || object.contains('/') || object == "." || object == ".." {
        return Err(format!(
            "shm endpoint name {text:?} names no shared-memory object"
        ));
    }
    Ok(PathBuf::from(SHM_DIR).join(object))
}

/// Checks that the region an shm name (checked by [`check_name`]) names exists, is a regular
/// file (not a link) and opens for reading and writing, as the shm provider will open it.
pub(crate) fn check_shm_region(name: &[u8]) -> Result<(), String> {
    let path = shm_region_path(name)?;
    let what = |e: std::io::Error| format!("shm region {} of the peer: {e}", path.display());
    let meta = std::fs::symlink_metadata(&path).map_err(what)?;
    if !meta.file_type().is_file() {
        return Err(format!(
            "shm region {} of the peer is not a regular file",
            path.display()
        ));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(what)?;
    Ok(())
}

/// The process an shm name (checked by [`check_name`]) says its endpoint belongs to: the
/// `<pid>` of `fi_shm://<pid>:...`.
pub(crate) fn shm_name_pid(name: &[u8]) -> Option<u32> {
    let path = shm_region_path(name).ok()?;
    let object = path.file_name()?.to_str()?;
    let pid: String = object.chars().take_while(char::is_ascii_digit).collect();
    pid.parse().ok()
}

/// Whether the peer an shm name (checked by [`check_name`]) names has closed its endpoint: its
/// region is gone (an endpoint unlinks it on close). `false` for a name of this process
/// (`fi_shm://<this pid>:...`), whose region the provider shares with the endpoint itself,
/// and whenever that cannot be told.
pub(crate) fn shm_peer_gone(name: &[u8]) -> bool {
    let Ok(path) = shm_region_path(name) else {
        return false;
    };
    if shm_name_pid(name) == Some(std::process::id()) {
        return false;
    }
    matches!(std::fs::symlink_metadata(&path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_must_match_the_providers_shape() {
        let mut own = vec![0u8; 16];
        own[..2].copy_from_slice(&2u16.to_ne_bytes());
        assert!(check_name("tcp;ofi_rxm", &own, &own).is_ok());
        assert!(check_name("tcp;ofi_rxm", &own[..8], &own).is_err());
        let mut v6 = own.clone();
        v6[..2].copy_from_slice(&10u16.to_ne_bytes());
        assert!(check_name("tcp;ofi_rxm", &v6, &own).is_err());
        assert!(check_name("efa", &[7; 32], &[0; 32]).is_ok());
    }

    #[test]
    fn shm_names_are_c_strings_of_libfabrics_shape() {
        let own = b"fi_shm://23330:0:1\0";
        for ok in [
            &own[..],
            b"fi_shm://7:0:1\0",
            // Other pids, uids and endpoint indexes: other lengths.
            b"fi_shm://4194303:1000:12\0",
        ] {
            assert!(check_name("shm", ok, own).is_ok(), "{ok:?} refused");
        }
        for bad in [
            &b"fi_shm://23330:0:1"[..],              // no NUL
            b"fi_shm://23330:0:1\0\0",               // two
            b"fi_shm://2\x003330:0:1\0",             // a NUL inside
            b"fi_shm://23330:0:;\0",                 // another shape
            b"fi_shm://2/330:0:1\0",                 // a path
            b"fi_shm://23330:0\0",                   // a field short
            b"fi_ns://23330:0:1\0",                  // another prefix
            b"fi_shm://123456789012345678901:0:1\0", // a number past 64 bits
            b"\0",
            b"",
        ] {
            assert!(check_name("shm", bad, own).is_err(), "{bad:?} accepted");
        }
        let long = [b"fi_shm://".as_slice(), &[b'1'; 300], b"\0"].concat();
        assert!(check_name("shm", &long, own).is_err());
    }

    #[test]
    fn shm_regions_must_exist_as_regular_files() {
        assert!(shm_region_path(b"fi_shm://1:0:1\0")
            .is_ok_and(|p| p == std::path::Path::new("/dev/shm/1:0:1")));
        for bad in [
            &b"fi_shm://\0"[..],
            b"fi_shm://a/b\0",
            b"fi_shm://..\0",
            b"fi_shm://\xff\0",
        ] {
            assert!(shm_region_path(bad).is_err(), "{bad:?}");
            assert!(check_shm_region(bad).is_err(), "{bad:?}");
        }
        // No pid is 0: no region of that name exists.
        assert!(check_shm_region(b"fi_shm://0:0:0\0").is_err());
        assert!(shm_peer_gone(b"fi_shm://0:0:0\0"));
        let own = format!("fi_shm://{}:0:999\0", std::process::id());
        assert!(!shm_peer_gone(own.as_bytes()), "a name of this process");
        assert!(!shm_peer_gone(b"fi_shm://a/b\0"), "not a region name");
        assert_eq!(shm_name_pid(b"fi_shm://4194303:1000:12\0"), Some(4194303));
        assert_eq!(shm_name_pid(b"fi_shm://a:1000:12\0"), None);
        if std::path::Path::new(SHM_DIR).is_dir() {
            let name = format!("nixl-validate-test-{}", std::process::id());
            let path = PathBuf::from(SHM_DIR).join(&name);
            std::fs::write(&path, b"x").expect("writing a file under /dev/shm");
            let r = check_shm_region(format!("fi_shm://{name}\0").as_bytes());
            let gone = shm_peer_gone(format!("fi_shm://{name}\0").as_bytes());
            let link = PathBuf::from(SHM_DIR).join(format!("{name}-link"));
            let linked = std::os::unix::fs::symlink(&path, &link).is_ok();
            let rl = check_shm_region(format!("fi_shm://{name}-link\0").as_bytes());
            let _ = std::fs::remove_file(&link);
            let _ = std::fs::remove_file(&path);
            assert!(r.is_ok(), "{r:?}");
            assert!(!gone, "a region that exists");
            assert!(!linked || rl.is_err(), "a link was accepted");
        }
    }
}
