//! PCI driver unbind/rebind through sysfs (fenced: touches the kernel). The last resort, behind
//! `--pci-rebind`, for a physical NIC that is missing from the host and from every netns we know:
//! rebinding makes its driver probe it again, which registers a fresh netdev in the host netns.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    #[error("{0:?} is not a PCI address (want dddd:bb:dd.f)")]
    BadAddress(String),
    #[error("PCI device {0} has no driver bound (nothing to rebind)")]
    NoDriver(String),
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("PCI device {0}: no network interface appeared within {1:?} of the rebind")]
    NoNetdev(String, Duration),
}

/// Checks `dddd:bb:dd.f` (lower-case hex, as sysfs names devices); nothing else reaches a path.
pub fn validate_address(addr: &str) -> Result<(), PciError> {
    let b = addr.as_bytes();
    let hex = |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(|c| c.is_ascii_hexdigit()));
    let ok = b.len() == 12
        && hex(0..4)
        && b[4] == b':'
        && hex(5..7)
        && b[7] == b':'
        && hex(8..10)
        && b[10] == b'.'
        && b[11].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(PciError::BadAddress(addr.to_owned()))
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PciError + '_ {
    move |source| PciError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Whether the PCI function `addr` is still there (`/sys/bus/pci/devices/<addr>`): a VF its PF
/// destroyed or a hot-unplugged card is not. A malformed address never is.
#[must_use]
pub fn function_exists(sysfs: &Path, addr: &str) -> bool {
    validate_address(addr).is_ok() && sysfs.join("bus/pci/devices").join(addr).exists()
}

/// The name of the driver bound to `addr`.
pub fn driver_of(sysfs: &Path, addr: &str) -> Result<String, PciError> {
    validate_address(addr)?;
    let link = sysfs.join("bus/pci/devices").join(addr).join("driver");
    let target = std::fs::read_link(&link).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            PciError::NoDriver(addr.to_owned())
        } else {
            io(&link)(e)
        }
    })?;
    target
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| PciError::NoDriver(addr.to_owned()))
}

/// Unbinds `addr` from its driver and binds it again.
pub fn rebind(sysfs: &Path, addr: &str) -> Result<(), PciError> {
    let driver = driver_of(sysfs, addr)?;
    let drv = sysfs.join("bus/pci/drivers").join(&driver);
    let unbind = drv.join("unbind");
    std::fs::write(&unbind, addr).map_err(io(&unbind))?;
    let bind = drv.join("bind");
    std::fs::write(&bind, addr).map_err(io(&bind))?;
    Ok(())
}

/// The netdev names of `addr` (`/sys/bus/pci/devices/<addr>/net/*`).
pub fn netdevs(sysfs: &Path, addr: &str) -> Result<Vec<String>, PciError> {
    validate_address(addr)?;
    let dir = sysfs.join("bus/pci/devices").join(addr).join("net");
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(&dir)(e)),
    };
    let mut out: Vec<String> = rd
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect();
    out.sort();
    Ok(out)
}

/// Rebinds and waits for the device's netdev to appear; returns its name.
pub async fn rebind_and_wait(sysfs: &Path, addr: &str, timeout: Duration) -> Result<String, PciError> {
    rebind(sysfs, addr)?;
    let start = Instant::now();
    loop {
        if let Some(n) = netdevs(sysfs, addr)?.into_iter().next() {
            return Ok(n);
        }
        if start.elapsed() > timeout {
            return Err(PciError::NoNetdev(addr.to_owned(), timeout));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(tag: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("dranet-pci-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let drv = root.join("bus/pci/drivers/mlx5_core");
        std::fs::create_dir_all(&drv).unwrap();
        std::fs::write(drv.join("bind"), b"").unwrap();
        std::fs::write(drv.join("unbind"), b"").unwrap();
        let dev = root.join("bus/pci/devices/0000:10:1b.0");
        std::fs::create_dir_all(dev.join("net/ens1f0")).unwrap();
        std::os::unix::fs::symlink("../../../bus/pci/drivers/mlx5_core", dev.join("driver")).unwrap();
        std::fs::create_dir_all(root.join("bus/pci/devices/0000:10:1c.0")).unwrap();
        root
    }

    #[test]
    fn addresses_are_validated_before_any_path_is_built() {
        validate_address("0000:10:1b.0").unwrap();
        validate_address("abcd:ef:1f.7").unwrap();
        for bad in [
            "",
            "0000:10:1b",
            "../../../etc",
            "0000:10:1b.0/../x",
            "0000-10-1b.0",
            "0000:10:1b.a",
        ] {
            assert!(
                matches!(validate_address(bad), Err(PciError::BadAddress(_))),
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn rebind_writes_unbind_then_bind_and_finds_the_netdev() {
        let root = fixture("rebind");
        assert_eq!(driver_of(&root, "0000:10:1b.0").unwrap(), "mlx5_core");
        let name = rebind_and_wait(&root, "0000:10:1b.0", Duration::from_millis(200))
            .await
            .unwrap();
        assert_eq!(name, "ens1f0");
        let drv = root.join("bus/pci/drivers/mlx5_core");
        assert_eq!(
            std::fs::read_to_string(drv.join("unbind")).unwrap(),
            "0000:10:1b.0"
        );
        assert_eq!(std::fs::read_to_string(drv.join("bind")).unwrap(), "0000:10:1b.0");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn a_device_without_driver_or_netdev_is_a_clear_error() {
        let root = fixture("nodriver");
        assert!(matches!(
            rebind(&root, "0000:10:1c.0"),
            Err(PciError::NoDriver(_))
        ));
        std::fs::remove_dir_all(root.join("bus/pci/devices/0000:10:1b.0/net/ens1f0")).unwrap();
        let e = rebind_and_wait(&root, "0000:10:1b.0", Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(matches!(e, PciError::NoNetdev(..)), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
