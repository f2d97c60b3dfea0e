//! Structural checks of a peer's endpoint names before `fi_av_insert`, which reads an address
//! of the provider's own length and format with no length from the caller: a short name makes
//! the provider read past it, a name that is not a C string makes the shm provider do so. A
//! peer's name must have exactly the length of this agent's own name on the same rail (same
//! provider, same format), and for socket-address formats the same address family; for shm a
//! NUL inside. Values inside (an IP address, a port, a peer id) are not judged: keep
//! unknown peers out with authentication (`docs/security.md`).

/// `sockaddr` families a provider's names may start with.
const FAMILIES: [u16; 3] = [
    2,  /* AF_INET */
    10, /* AF_INET6 */
    27, /* AF_IB */
];

/// Checks `name` (a peer's endpoint name) against `own` (this agent's name on the same rail).
pub fn check_name(provider: &str, name: &[u8], own: &[u8]) -> Result<(), String> {
    if name.len() != own.len() {
        return Err(format!(
            "endpoint name of {} bytes (provider {provider} uses {})",
            name.len(),
            own.len()
        ));
    }
    let family = |b: &[u8]| b.get(..2).map(|f| u16::from_ne_bytes([f[0], f[1]]));
    let core = provider.split(';').next().unwrap_or(provider);
    if core == "shm" {
        if !name.contains(&0) {
            return Err("shm endpoint name is not NUL-terminated".into());
        }
    } else if let Some(f) = family(own).filter(|f| FAMILIES.contains(f)) {
        if family(name) != Some(f) {
            return Err(format!(
                "endpoint name of address family {:?} (provider {provider} uses {f})",
                family(name)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_match_the_providers_shape() {
        let mut own = vec![0u8; 16];
        own[..2].copy_from_slice(&2u16.to_ne_bytes());
        assert!(check_name("tcp;ofi_rxm", &own, &own).is_ok());
        assert!(check_name("tcp;ofi_rxm", &own[..8], &own).is_err());
        let mut v6 = own.clone();
        v6[..2].copy_from_slice(&10u16.to_ne_bytes());
        assert!(check_name("tcp;ofi_rxm", &v6, &own).is_err());
        let shm = b"fi_shm://1234\0\0\0";
        assert!(check_name("shm", shm, shm).is_ok());
        assert!(check_name("shm", &[b'a'; 16], shm).is_err());
        assert!(check_name("efa", &[7; 32], &[0; 32]).is_ok());
    }
}
